"""The learner on 2 gloo ranks with FSDP2 against the one-process learner.

Two spawned processes train a tiny model sharded with FSDP2; the batches are sampled by the real engine with
the weights the sharded learner published (so every token of a step's batch is a lag-0 token). Rank 0 saves,
for every step, the learner state before it, the batch, the metrics and the weights after it; the test then
replays each step in one process from the same state.

What holds bitwise: the all-gathered forward (lag-0 |dlogp| == 0.0 on every lag-0 token, with
assert_lag0_exact on), hence the loss, rewards, IS-weight and KL metrics of every step. What holds to float
rounding: the gradients (the ranks' partial sums are added by the reduce-scatter in another grouping, and
the gradient norm is assembled from per-shard sums) and so the updated weights. The stated tolerance: after
one AdamW step from the same state, no weight differs by more than lr / 100 = 1e-5 and the gradient norm
agrees to 1e-6 relative. Measured (these seeds; gloo's sums are deterministic for a fixed world size): at
most 9.5e-8 (dense fp32), 4.1e-7 (MoE), 0 (bf16: rounding into bf16 absorbs the difference); several steps
came out bitwise equal.
"""

from __future__ import annotations

import asyncio
import copy
import os
import sys

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams
from rz_agents.model import ModelConfig, Transformer
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trajectory import Trajectory
from tests.trainer.fsdp_warnings import view_warnings
from tests.trainer.learner_state import restore_whole_state, whole_state

LR = 1e-3
STEPS = 2


def _model(kind: str) -> Transformer:
    torch.manual_seed(0)
    if kind == "moe":
        cfg = ModelConfig.tiny("qwen3_moe", vocab_size=64)
    else:
        cfg = ModelConfig.tiny(
            "qwen3",
            vocab_size=64,
            tie_word_embeddings=True,
            dtype="bfloat16" if kind == "bf16" else "float32",
        )
    return Transformer(cfg, kernels="aligned")


def _cfg(**kw) -> LearnerConfig:
    base = dict(optim=OptimConfig(lr=LR, max_grad_norm=1.0), assert_lag0_exact=True, micro_batch_tokens=40)
    base.update(kw)
    return LearnerConfig(**base)


def _sample(
    weights: dict, kind: str, version: int, seed: int, groups: int = 3, g: int = 3, build=None
) -> list[Trajectory]:
    """Sample a batch with the real engine from ``weights``: prompt, then up to 12 sampled tokens (``build``:
    the model builder, default ``_model``)."""
    model = (build or _model)(kind)
    model.load_state_dict(weights)
    engine = RZEngine(model, EngineConfig(max_running=16, max_len=64, num_threads=1), version=version)

    async def run():
        jobs = []
        for gi in range(groups):
            prompt = [1 + gi, 5, 7, 2 + seed % 5]
            for j in range(g):
                params = SamplingParams(max_tokens=12, seed=seed * 100 + gi * 10 + j, ignore_eos=True)
                jobs.append((gi, prompt, engine.generate(prompt, params)))
        out = []
        for gi, prompt, job in jobs:
            c = await job
            n = len(c.tokens)
            reward = float(sum(1 for t in c.tokens if t % 2 == 0))
            out.append(
                Trajectory(
                    prompt + c.tokens,
                    [False] * len(prompt) + [True] * n,
                    [0.0] * len(prompt) + [float(x) for x in c.logprobs],
                    [-1] * len(prompt) + list(c.versions),
                    reward,
                    gi,
                )
            )
        return out

    return asyncio.run(run())


def _worker(rank: int, world: int, store: str, out_dir: str) -> None:
    import torch.distributed as dist

    from rz_agents.trainer.sharding import ShardedRanks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        results = {}
        with view_warnings() as views:
            for kind, steps in (("fp32", STEPS), ("bf16", 2), ("moe", 1)):
                learner = Learner(_model(kind), _cfg(), ranks=ShardedRanks())
                record = []
                for step in range(steps):
                    before = copy.deepcopy(whole_state(learner))  # (it shares tensors with the live state)
                    batch = _sample(learner.weights(), kind, learner.version, seed=step)
                    metrics = learner.step(batch)
                    record.append((before, batch, metrics, learner.weights()))
                results[kind] = record
        results["view_warnings"] = views
        # A non-finite loss in a micro-batch only rank 1 runs: every rank skips the step, then trains on.
        learner = Learner(_model("fp32"), _cfg(assert_lag0_exact=False), ranks=ShardedRanks())
        batch = _sample(learner.weights(), "fp32", 0, seed=7)
        # micro-batches of 2 sequences: trajectory 2 is in micro-batch 1, which rank 1 runs
        batch[2].behavior_logprobs[-1] = -1e4  # exp(logp + 1e4) overflows: the loss is inf
        skipped = learner.step(batch)
        after_skip = learner.weights()
        trained = learner.step(_sample(learner.weights(), "fp32", 0, seed=8))
        results["nonfinite"] = (skipped, after_skip, trained, learner.version)
        # Negative control: the same sharded learner on the standard op set does not match the engine.
        model = _model("fp32")
        model.set_kernels("standard")
        learner = Learner(model, _cfg(assert_lag0_exact=False), ranks=ShardedRanks())
        results["standard"] = learner.step(_sample(learner.weights(), "fp32", 0, seed=9))
        if rank == 0:
            torch.save(results, os.path.join(out_dir, "sharded.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, spawn_ranks):
    out = tmp_path_factory.mktemp("fsdp")
    spawn_ranks(_worker, str(out / "store"), str(out))
    return torch.load(out / "sharded.pt", weights_only=False)


NOT_BITWISE = ("time_", "learner_tokens_per_s", "learner_thread_cpu_s", "grad_norm")


def _replay(kind, before, batch):
    learner = Learner(_model(kind), _cfg())
    restore_whole_state(learner, before)
    metrics = learner.step(batch)
    return learner, metrics


def _assert_close_after_one_adamw_step(sharded_w, single_w):
    assert set(sharded_w) == set(single_w)
    for k, v in single_w.items():
        assert sharded_w[k].dtype == v.dtype
        assert float((sharded_w[k].float() - v.float()).abs().max()) <= LR / 100, k


@pytest.mark.parametrize("kind", ["fp32", "bf16", "moe"])
def test_sharded_forward_is_bit_identical_to_the_engine_on_every_lag0_token(sharded, kind):
    for _, batch, metrics, _ in sharded[kind]:
        assert metrics["lag0_token_count"] == sum(sum(t.loss_mask) for t in batch) > 0
        assert metrics["lag0_abs_dlogp_max"] == 0.0 and metrics["step_skipped_nonfinite"] == 0


@pytest.mark.parametrize("kind", ["fp32", "bf16", "moe"])
def test_each_sharded_step_matches_the_one_process_step_from_the_same_state(sharded, kind):
    for before, batch, metrics, weights in sharded[kind]:
        single, expected = _replay(kind, before, batch)
        # Loss and every metric computed from log-probs are bitwise the one-process values.
        for key, value in expected.items():
            if not key.startswith(NOT_BITWISE):
                assert metrics[key] == value or (value != value and metrics[key] != metrics[key]), key
        # The gradient norm is assembled from per-shard sums: equal to rounding.
        assert metrics["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-6)
        _assert_close_after_one_adamw_step(weights, single.weights())


def test_the_sharded_checkpoint_has_the_one_process_layout(sharded):
    before, _, _, _ = sharded["bf16"][1]  # after one step: AdamW state exists, fp32 masters differ from bf16
    single = Learner(_model("bf16"), _cfg())
    reference = whole_state(single)
    assert set(before) == set(reference)
    assert [m.dtype for m in before["masters"]] == [torch.float32] * len(single.params)
    assert {k: v.shape for k, v in before["model"].items()} == {
        k: v.shape for k, v in reference["model"].items()
    }
    for index, per in before["optimizer"]["state"].items():
        assert per["exp_avg"].shape == single.params[int(index)].shape


def test_negative_control_a_sharded_learner_on_standard_kernels_differs_from_the_engine(sharded):
    metrics = sharded["standard"]
    assert metrics["lag0_token_count"] > 0 and metrics["lag0_abs_dlogp_max"] > 0.0


def test_no_sharded_forward_returns_a_view_tensor(sharded):
    # FSDP2 warns on every forward of a sharded module that returns a view (an in-place op on it would skip
    # the pre-backward hook): Transformer.forward and the LM head (logits, a forward method of the root)
    assert sharded["view_warnings"] == []


def test_a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank(sharded):
    skipped, after_skip, trained, version = sharded["nonfinite"]
    assert skipped["step_skipped_nonfinite"] == 1
    initial = _model("fp32").state_dict()
    assert all(torch.equal(after_skip[k], v) for k, v in initial.items())
    assert trained["step_skipped_nonfinite"] == 0 and version == 1


if __name__ == "__main__":  # pragma: no cover - run the spawn workers by hand
    sys.exit(pytest.main([__file__, "-q"]))
