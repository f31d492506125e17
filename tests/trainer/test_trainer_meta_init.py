"""Sharded learner ranks start from a checkpoint without building the whole model: each shards a meta-device
skeleton, allocates only its shards and cuts them from the checkpoint one tensor at a time. The result is
the learner the full build gives, bit for bit (weights, fp32 masters, and a training step after)."""

from __future__ import annotations

import os

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.checkpoint import LazyState, load_hf_checkpoint, model_skeleton, save_hf_checkpoint
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trajectory import Trajectory
from tests.trainer.learner_state import whole_state

NOT_BITWISE = ("time_", "learner_tokens_per_s", "learner_thread_cpu_s")


def _batch(seed: int = 3) -> list[Trajectory]:
    """Six synthetic trajectories (three groups of two) with random behavior log-probs."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(6):
        n_prompt, n_new = 3, 5 + i % 3
        tokens = torch.randint(0, 64, (n_prompt + n_new,), generator=gen).tolist()
        behavior = [0.0] * n_prompt + (-torch.rand(n_new, generator=gen) * 3).tolist()
        out.append(Trajectory(tokens, [False] * n_prompt + [True] * n_new, behavior,
                              [-1] * n_prompt + [0] * n_new, float(i % 2), i // 2))  # fmt: skip
    return out


def _worker(rank: int, world: int, store: str, ckpt: str, out_dir: str) -> None:
    import torch.distributed as dist

    from rz_agents.trainer.sharding import ShardedRanks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        cfg = LearnerConfig(optim=OptimConfig(lr=1e-3), micro_batch_tokens=24)
        results = {}
        for way in ("full", "meta"):
            if way == "full":
                learner = Learner(load_hf_checkpoint(ckpt, dtype="bfloat16"), cfg, ranks=ShardedRanks())
            else:
                skeleton = model_skeleton(ckpt, dtype="bfloat16")
                assert next(skeleton.parameters()).is_meta
                learner = Learner(skeleton, cfg, ranks=ShardedRanks())
                learner.replace_weights(LazyState(ckpt, torch.bfloat16))
            start = whole_state(learner)
            metrics = learner.step(_batch())
            results[way] = (start, metrics, whole_state(learner))
        if rank == 0:
            torch.save(results, os.path.join(out_dir, "meta.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def both(tmp_path_factory, spawn_ranks):
    out = tmp_path_factory.mktemp("meta")
    torch.manual_seed(0)
    model = Transformer(ModelConfig.tiny("qwen3", vocab_size=64, tie_word_embeddings=True))  # fp32 on disk
    model.reset_parameters(std=0.1, seed=1)
    ckpt = save_hf_checkpoint(model, out / "ckpt")
    spawn_ranks(_worker, str(out / "store"), str(ckpt), str(out))
    return torch.load(out / "meta.pt", weights_only=False)


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (a != a and b != b)  # NaN == NaN


def test_the_meta_start_gives_the_full_builds_weights_and_fp32_masters_bitwise(both):
    (full, _, _), (meta, _, _) = both["full"], both["meta"]
    assert full["model"]["model.embed_tokens.weight"].dtype == torch.bfloat16  # rounded as the full build
    assert _equal(full["model"], meta["model"]) and _equal(full["masters"], meta["masters"])


def test_a_step_after_the_meta_start_is_bitwise_the_full_builds(both):
    (_, m_full, after_full), (_, m_meta, after_meta) = both["full"], both["meta"]
    keys = [k for k in m_full if not k.startswith(NOT_BITWISE)]
    assert m_full["step_skipped_nonfinite"] == 0 and keys == [
        k for k in m_meta if not k.startswith(NOT_BITWISE)
    ]
    assert all(_equal(m_full[k], m_meta[k]) for k in keys), [
        k for k in keys if not _equal(m_full[k], m_meta[k])
    ]
    assert _equal(after_full["model"], after_meta["model"]) and _equal(
        after_full["optimizer"], after_meta["optimizer"]
    )


def test_a_meta_model_without_sharded_ranks_is_refused(tmp_path):
    ckpt = save_hf_checkpoint(Transformer(ModelConfig.tiny("qwen3", vocab_size=64)), tmp_path / "c")
    with pytest.raises(ValueError, match="meta device needs sharded learner ranks"):
        Learner(model_skeleton(ckpt), LearnerConfig())
