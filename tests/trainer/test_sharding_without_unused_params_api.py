"""The sharded MoE learner on a torch without ``FSDPModule.set_reduce_scatter_unused_params`` (torch < 2.13;
the H200 machine has 2.11).

Two gloo ranks train a tiny MoE model with the method deleted from ``FSDPModule``. The batch is one
micro-batch: rank 0 runs it, rank 1 runs the learner's 2-token idle pass, which reaches at most 4 of the 8
experts, so some experts have no gradient on rank 1 unless the fallback gives them zeros. Before the guard the
learner crashed in ``ShardedRanks.shard`` (AttributeError); without a fallback the ranks would reduce-scatter
different parameter sets. The updated weights must match the one-process learner's step from the same state
to the tolerance tests/trainer/test_trainer_sharding.py states (lr / 100 after one AdamW step).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trajectory import Trajectory
from tests.trainer.learner_state import restore_whole_state, whole_state

LR = 1e-3


def _model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig.tiny("qwen3_moe", vocab_size=64), kernels="aligned")


def _cfg() -> LearnerConfig:
    return LearnerConfig(optim=OptimConfig(lr=LR, max_grad_norm=1.0), micro_batch_tokens=64)


def _batch() -> list[Trajectory]:
    """One group of two sampled continuations with different rewards (a nonzero advantage), one
    micro-batch."""
    out = []
    for reward, tail in ((1.0, [9, 11, 13, 15]), (0.0, [10, 12, 14, 16])):
        prompt = [1, 5, 7, 3]
        out.append(
            Trajectory(
                prompt + tail,
                [False] * len(prompt) + [True] * len(tail),
                [0.0] * len(prompt) + [-2.0] * len(tail),
                [-1] * len(prompt) + [0] * len(tail),
                reward,
                0,
            )
        )
    return out


def _worker(rank: int, world: int, store: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from rz_agents.model.transformer import SparseMoE
    from rz_agents.trainer import sharding

    torch.set_num_threads(1)
    # torch < 2.13: the method does not exist (deleted from the class every FSDP module derives from)
    if hasattr(FSDPModule, "set_reduce_scatter_unused_params"):
        delattr(FSDPModule, "set_reduce_scatter_unused_params")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        model = _model()
        reached: set[tuple[int, int]] = set()  # (layer, expert) pairs this rank's tokens reached

        def record(module, args):
            probs = torch.softmax(module.gate(args[0]).float(), dim=-1)
            experts = torch.topk(probs, module.top_k, dim=-1).indices
            reached.update((id(module), int(e)) for e in experts.reshape(-1))

        moes = [m for m in model.modules() if isinstance(m, SparseMoE)]
        for m in moes:
            m.register_forward_pre_hook(record)
        learner = Learner(model, _cfg(), ranks=sharding.ShardedRanks())
        before = copy.deepcopy(whole_state(learner))
        metrics = learner.step(_batch())
        weights = learner.weights()
        unreached = len(moes) * moes[0].num_experts - len(reached)
        if rank == 0:
            torch.save((before, metrics, weights), os.path.join(out_dir, "rank0.pt"))
        torch.save(unreached, os.path.join(out_dir, f"unreached{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def without_api(tmp_path_factory, spawn_ranks):
    out = tmp_path_factory.mktemp("fsdp_old_torch")
    spawn_ranks(_worker, str(out / "store"), str(out))
    unreached = [torch.load(out / f"unreached{r}.pt") for r in range(2)]
    return torch.load(out / "rank0.pt", weights_only=False), unreached


def test_the_idle_rank_leaves_experts_unreached_so_the_fallback_is_exercised(without_api):
    _, unreached = without_api
    assert unreached[1] > 0


def test_sharded_moe_step_without_the_2_13_api_matches_the_one_process_step(without_api):
    (before, metrics, weights), _ = without_api
    assert metrics["step_skipped_nonfinite"] == 0
    single = Learner(_model(), _cfg())
    restore_whole_state(single, before)
    single_metrics = single.step(_batch())
    for key, value in single_metrics.items():  # every metric computed from log-probs: bitwise
        if not key.startswith(("time_", "learner_tokens_per_s", "learner_thread_cpu_s", "grad_norm")):
            assert metrics[key] == value or (value != value and metrics[key] != metrics[key]), key
    assert metrics["grad_norm"] == pytest.approx(single_metrics["grad_norm"], rel=1e-6)
    single_w = single.weights()
    assert set(weights) == set(single_w)
    for k, v in single_w.items():
        assert float((weights[k].float() - v.float()).abs().max()) <= LR / 100, k


def test_the_fallback_is_chosen_when_fsdp_lacks_the_method(monkeypatch):
    """``reduce_scatter_unused_params`` on a model whose FSDP units lack the method hooks every MoE block, and
    the hook keeps the forward's bits while giving every expert weight a gradient."""
    from torch.distributed.fsdp import FSDPModule

    from rz_agents.model.transformer import SparseMoE
    from rz_agents.trainer.sharding import reduce_scatter_unused_params

    model = _model()
    plain = copy.deepcopy(model)
    monkeypatch.delattr(FSDPModule, "set_reduce_scatter_unused_params", raising=False)
    assert reduce_scatter_unused_params(model) == "zero_grads"
    tokens = torch.tensor([1, 5, 7])
    positions = torch.arange(3)
    out = model.logits(model(tokens, positions))
    assert torch.equal(out, plain.logits(plain(tokens, positions)))
    out.sum().backward()
    for m in model.modules():
        if isinstance(m, SparseMoE):
            assert all(p.grad is not None for p in m.experts.parameters())
    plain.logits(plain(tokens, positions)).sum().backward()
    unreached = [
        p
        for m in plain.modules()
        if isinstance(m, SparseMoE)
        for p in m.experts.parameters()
        if p.grad is None
    ]
    assert unreached  # negative control: 3 tokens x top-2 cannot reach all 8 experts without the hook
