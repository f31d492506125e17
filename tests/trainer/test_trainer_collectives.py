"""Collectives of the sharded learner: on the device their group's backend takes, once per step.

NCCL takes CUDA tensors only: a CPU tensor all-reduced on an NCCL group fails ("No backend type associated
with device type cpu"), which gloo groups (CPU tests) never show. So the device of every collective comes from
the group's backend (``collective_device``), and a step's collectives are recorded and checked against it. A
group registered for CUDA tensors only stands in for NCCL on this CPU machine (gloo underneath, so its refusal
is torch's own dispatch, the same error NCCL gives).
"""

from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch
import torch.distributed as dist

from rz_agents.model import ModelConfig, Transformer
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.sharding import ShardedRanks, accepted_devices, collective_device
from rz_agents.trajectory import Trajectory

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
)


@pytest.fixture
def recorded(monkeypatch):
    """Every torch.distributed collective called while the fixture lives: (name, device types of its
    tensors)."""
    calls: list[tuple[str, list[str]]] = []
    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is None:
            continue

        def record(*args, _fn=fn, _name=name, **kwargs):
            flat = list(args) + list(kwargs.values())
            tensors = [t for x in flat for t in (x if isinstance(x, (list, tuple)) else [x])]
            calls.append((_name, [t.device.type for t in tensors if isinstance(t, torch.Tensor)]))
            return _fn(*args, **kwargs)

        monkeypatch.setattr(dist, name, functools.wraps(fn)(record))
    return calls


@pytest.fixture
def one_rank_group(tmp_path):
    """A one-rank gloo group in this process (FSDP2 runs on it; nothing is sent)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _batch(n: int = 6) -> list[Trajectory]:
    out = []
    for i in range(n):
        tokens = [(7 * i + 3 * k) % 64 for k in range(10)]
        out.append(
            Trajectory(
                tokens, [False] * 3 + [True] * 7, [0.0] * 3 + [-2.0] * 7, [-1] * 3 + [0] * 7, i % 2, i // 3
            )
        )
    return out


def test_the_collective_device_is_one_the_groups_backend_takes():
    assert accepted_devices("nccl") == ["cuda"]
    assert collective_device("cuda", "nccl") == torch.device("cuda")
    # NCCL never gets a CPU tensor, even for a learner whose flags and figures start on the host.
    assert collective_device("cpu", "nccl") == torch.device("cuda")
    assert collective_device("cpu", "gloo") == torch.device("cpu")
    assert collective_device("cuda", "cpu:gloo,cuda:nccl") == torch.device("cuda")
    assert collective_device("cpu", "cpu:gloo,cuda:nccl") == torch.device("cpu")


def test_a_group_for_cuda_tensors_only_refuses_a_cpu_tensor_as_nccl_does(tmp_path):
    """The bug class: what the step did per micro-batch before (a CPU flag all-reduced) fails on such a group;
    the group's collective device is CUDA."""
    name = "rz_test_cuda_only"
    if name.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(
            name,
            lambda store, rank, world, timeout: dist.ProcessGroupGloo(store, rank, world, timeout),
            devices=["cuda"],
        )
    dist.init_process_group(name, init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert collective_device("cpu") == torch.device("cuda")
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_reduce(torch.tensor([1], dtype=torch.int32), op=dist.ReduceOp.MIN)
    finally:
        dist.destroy_process_group()


def test_a_sharded_step_exchanges_once_on_the_collective_device_and_pickles_nothing(one_rank_group, recorded):
    torch.manual_seed(0)
    ranks = ShardedRanks()
    model = Transformer(ModelConfig.tiny("qwen3", vocab_size=64), kernels="aligned")
    learner = Learner(model, LearnerConfig(micro_batch_tokens=20), ranks=ranks)  # 3 micro-batches
    recorded.clear()
    metrics = learner.step(_batch())
    assert metrics["step_skipped_nonfinite"] == 0 and metrics["loss"] != 0.0
    names = Counter(name for name, _ in recorded)
    assert names == Counter({"all_reduce": 1}), names  # one exchange per step, no object collectives
    assert all(d == ranks.comm_device.type for _, devices in recorded for d in devices)
