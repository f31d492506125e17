"""Learner checkpoints through torch.distributed.checkpoint: the tensors in a folder beside the checkpoint
file (each rank its own shards, nothing gathered), the rest in the file; a resume is bitwise the uninterrupted
run, on one process and on two FSDP2 gloo ranks; the folder moves between 1 and 2 ranks; files of the format
before folders still load; a crash inside the write leaves the previous checkpoint."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.trainer.checkpoint import load_checkpoint, save_checkpoint
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from tests.trainer.learner_state import whole_state
from tests.trainer.test_trainer_meta_init import NOT_BITWISE, _batch


def _model(kind: str, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    if kind == "moe":
        return Transformer(ModelConfig.tiny("qwen3_moe", vocab_size=64), kernels="aligned")
    dtype = "bfloat16" if kind == "bf16" else "float32"
    cfg = ModelConfig.tiny("qwen3", vocab_size=64, tie_word_embeddings=True, dtype=dtype)
    return Transformer(cfg, kernels="aligned")


def _cfg() -> LearnerConfig:
    optim = OptimConfig(lr=1e-2, schedule="cosine", total_steps=4, warmup_steps=1, max_grad_norm=1.0)
    return LearnerConfig(optim=optim, micro_batch_tokens=24)


def _bitwise(a, b, where: str = "") -> None:
    """Nested dicts / lists of tensors and numbers equal bit for bit (NaN equal to NaN)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            if not any(str(k).startswith(p) for p in NOT_BITWISE):
                _bitwise(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _bitwise(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b, where


@pytest.mark.parametrize("kind", ["fp32", "bf16", "moe"])
def test_a_one_process_resume_from_the_folder_is_bitwise_the_uninterrupted_run(tmp_path, kind):
    a = Learner(_model(kind), _cfg())
    a.step(_batch(1))
    path = save_checkpoint(tmp_path / "checkpoint.pt", a.save_state, {"steps_done": 1})
    after = a.step(_batch(2))
    # The layout: the file, and one folder beside it that DCP wrote.
    folders = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert len(folders) == 1 and folders[0].startswith("checkpoint.pt.learner-")
    assert (tmp_path / folders[0] / ".metadata").is_file()
    payload = load_checkpoint(path)
    assert payload["learner_folder"] == tmp_path / folders[0]
    assert not any(isinstance(v, torch.Tensor) for v in payload["learner"].values())  # no tensor in the file
    b = Learner(_model(kind, seed=7), _cfg())  # another init: everything comes from the checkpoint
    b.load_state(payload["learner"], payload["learner_folder"])
    assert b.version == 1
    _bitwise(b.step(_batch(2)), after)
    _bitwise(whole_state(b), whole_state(a))


def test_a_checkpoint_file_of_the_format_before_folders_still_loads(tmp_path):
    """Format 1: ``torch.save`` of the whole learner state inside the file (what checkpoints were before)."""
    from rz_agents.trainer.checkpoint import rng_states

    a = Learner(_model("bf16"), _cfg())
    a.step(_batch(1))
    old = tmp_path / "old.pt"
    torch.save({"format_version": 1, "learner": whole_state(a), "runtime": {}, "rng": rng_states()}, old)
    after = a.step(_batch(2))
    payload = load_checkpoint(old)
    assert payload["learner_folder"] is None
    b = Learner(_model("bf16", seed=7), _cfg())
    with pytest.warns(DeprecationWarning, match="whole tensors .the format before folders.") as caught:
        b.load_state(payload["learner"], payload["learner_folder"])
    assert len(caught) == 1 and "\n" not in str(caught[0].message)  # one line, once
    _bitwise(b.step(_batch(2)), after)
    _bitwise(whole_state(b), whole_state(a))


def test_each_save_replaces_the_previous_folder_and_a_missing_folder_is_a_clear_error(tmp_path):
    a = Learner(_model("fp32"), _cfg())
    path = tmp_path / "checkpoint.pt"
    for seed in (1, 2, 3):
        a.step(_batch(seed))
        save_checkpoint(path, a.save_state, {})
    folders = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(folders) == 1 and load_checkpoint(path)["learner_folder"] == folders[0]
    (folders[0] / ".metadata").unlink()
    with pytest.raises(FileNotFoundError, match="learner's tensors are missing"):
        load_checkpoint(path)


# Saves checkpoint 1, then is SIGKILLed inside the learner's folder write of checkpoint 2 (after the first
# data file reached the disk), as by the OOM killer.
_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    sys.path[:0] = sys.argv[2:]
    from tests.trainer.test_trainer_learner_checkpoint import Learner, _batch, _cfg, _model
    from rz_agents.trainer.checkpoint import save_checkpoint

    torch.set_num_threads(1)
    learner = Learner(_model("bf16"), _cfg())
    learner.step(_batch(1))
    save_checkpoint(sys.argv[1], learner.save_state, {"steps": 1})
    learner.step(_batch(2))

    def killed_midway(folder):
        learner.save_state(folder)
        os.unlink(os.path.join(folder, ".metadata"))  # DCP writes it last: this is a write cut short
        os.kill(os.getpid(), signal.SIGKILL)

    save_checkpoint(sys.argv[1], killed_midway, {"steps": 2})
    """
)


def test_sigkill_inside_the_learner_folder_write_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), root, os.path.join(root, "kernels")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    torn = list(tmp_path.glob(".checkpoint.pt.*.tmp"))
    assert len(torn) == 1 and torn[0].is_dir() and any(torn[0].iterdir())  # killed inside the write
    payload = load_checkpoint(path, restore_rng=False)
    assert payload["runtime"] == {"steps": 1}
    reference = Learner(_model("bf16"), _cfg())
    reference.step(_batch(1))
    resumed = Learner(_model("bf16", seed=7), _cfg())
    resumed.load_state(payload["learner"], payload["learner_folder"])
    _bitwise(whole_state(resumed), whole_state(reference))
    # The next save removes the torn folder.
    save_checkpoint(path, resumed.save_state, {"steps": 3})
    assert not list(tmp_path.glob(".*.tmp")) and len([p for p in tmp_path.iterdir() if p.is_dir()]) == 1


# ---- two FSDP2 gloo ranks --------------------------------------------------------------------------------
def _ranks_save(rank: int, world: int, store: str, out: str, kind: str) -> None:
    """Step, save the folder (counting whole-tensor gathers during the save), step again."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from rz_agents.trainer.sharding import ShardedRanks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        learner = Learner(_model(kind), _cfg(), ranks=ShardedRanks())
        learner.step(_batch(1))
        gathers = []
        real = DTensor.full_tensor

        def counted(self, *args, **kwargs):
            gathers.append(tuple(self.shape))
            return real(self, *args, **kwargs)

        DTensor.full_tensor = counted
        try:  # what the Ray runtime does: every rank writes into the folder the driver made
            state = learner.save_state(os.path.join(out, "folder"))
        finally:
            DTensor.full_tensor = real
        at_save = copy.deepcopy(whole_state(learner))  # (gathered after the save; it shares AdamW's steps)
        metrics = learner.step(_batch(2))
        after = whole_state(learner)
        if rank == 0:
            torch.save({"gathers": gathers, "at_save": at_save, "metrics": metrics, "after": after,
                        "state": state}, os.path.join(out, "saved.pt"))  # fmt: skip
    finally:
        dist.destroy_process_group()


def _ranks_resume(rank: int, world: int, store: str, out: str, kind: str) -> None:
    """Fresh ranks (another init) load the folder and take the second step."""
    import torch.distributed as dist

    from rz_agents.trainer.sharding import ShardedRanks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        learner = Learner(_model(kind, seed=7), _cfg(), ranks=ShardedRanks())
        state = torch.load(os.path.join(out, "saved.pt"), weights_only=False)["state"]
        learner.load_state(state, os.path.join(out, "folder"))
        loaded = copy.deepcopy(whole_state(learner))
        metrics = learner.step(_batch(2))
        after = whole_state(learner)  # (a collective: every rank)
        if rank == 0:
            torch.save({"loaded": loaded, "metrics": metrics, "after": after},
                       os.path.join(out, "resumed.pt"))  # fmt: skip
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=["bf16", "moe"])
def two_ranks(request, tmp_path_factory, spawn_ranks):
    kind = request.param
    out = tmp_path_factory.mktemp(f"dcp_{kind}")
    spawn_ranks(_ranks_save, str(out / "store_a"), str(out), kind)
    spawn_ranks(_ranks_resume, str(out / "store_b"), str(out), kind)
    load = lambda name: torch.load(out / name, weights_only=False)  # noqa: E731
    return kind, out, load("saved.pt"), load("resumed.pt")


def test_two_ranks_resumed_from_their_folder_take_the_uninterrupted_next_step_bitwise(two_ranks):
    _, _, saved, resumed = two_ranks
    _bitwise(resumed["loaded"], saved["at_save"])
    _bitwise(resumed["metrics"], saved["metrics"])
    _bitwise(resumed["after"], saved["after"])


def test_no_rank_gathers_a_whole_tensor_while_it_saves(two_ranks):
    _, out, saved, _ = two_ranks
    assert saved["gathers"] == []
    # Each rank wrote its own data file; what the checkpoint file keeps holds no tensor.
    assert sorted(p.name for p in (out / "folder").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not any(isinstance(v, torch.Tensor) for v in saved["state"].values())


def test_one_process_loads_the_two_rank_folder_to_the_same_state(two_ranks):
    kind, out, saved, _ = two_ranks
    learner = Learner(_model(kind, seed=7), _cfg())
    learner.load_state(saved["state"], out / "folder")
    state = whole_state(learner)
    if kind == "bf16":  # the one-process layout has the tied LM head as a state-dict entry of its own
        saved_state = saved["at_save"]
        _bitwise(state["masters"], saved_state["masters"])
        _bitwise(state["optimizer"], saved_state["optimizer"])
        for k, v in saved_state["model"].items():
            assert torch.equal(state["model"][k], v), k
    else:
        _bitwise(state, saved["at_save"])
