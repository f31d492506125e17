"""MasterWeights: which fp32 tensors AdamW optimizes, the fp32 gradient sums over micro-batches, the rounding
into the model, and the masters a checkpoint holds; one process (separate copies), an fp32 model (none) and
FSDP2 on 2 gloo ranks (the fp32 shards are the masters)."""

from __future__ import annotations

import os

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.master_weights import MasterWeights
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trainer.sharding import ShardedRanks, SingleProcess
from rz_agents.trajectory import Trajectory
from tests.trainer.learner_state import whole_state


def _model(dtype: str = "bfloat16", seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig.tiny("qwen3", vocab_size=64, dtype=dtype), kernels="aligned")


def _trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _batch(n: int = 6) -> list[Trajectory]:
    """Six 10-token trajectories in two groups with mixed rewards (behavior log-probs made up: lag > 0)."""
    out = []
    for i in range(n):
        tokens = [(7 * i + 3 * k) % 64 for k in range(10)]
        mask = [False] * 3 + [True] * 7
        out.append(Trajectory(tokens, mask, [0.0] * 3 + [-2.0] * 7, [-1] * 3 + [0] * 7, i % 2, i // 3))
    return out


def _cfg(**kw) -> LearnerConfig:
    base = dict(optim=OptimConfig(lr=1e-3, max_grad_norm=1.0), micro_batch_tokens=20)
    base.update(kw)
    return LearnerConfig(**base)


def test_the_ranks_state_whether_their_shards_are_the_fp32_masters():
    assert SingleProcess.keeps_fp32_shards is False
    assert ShardedRanks.keeps_fp32_shards is True


def test_a_bf16_model_in_one_process_gets_fp32_copies_that_adamw_optimizes():
    model = _model()
    params = _trainable(model)
    masters = MasterWeights(params, torch.bfloat16, SingleProcess())
    assert masters.exist and not masters.in_shards
    assert masters.copies is not None and masters.optimized() is masters.copies
    for p, m in zip(params, masters.copies, strict=True):
        assert p.dtype == torch.bfloat16 and m.dtype == torch.float32 and m.requires_grad
        assert m.data_ptr() != p.data_ptr() and torch.equal(m, p.float())
    learner = Learner(_model(), _cfg())
    optimized = learner.optimizer.param_groups[0]["params"]
    assert [id(t) for t in optimized] == [id(m) for m in learner.master_weights.copies]
    assert learner.masters is learner.master_weights.copies


def test_micro_batch_gradients_sum_in_fp32_on_the_masters_not_in_bf16():
    """Two real backward passes through a bf16 model: the masters hold g1.float() + g2.float() exactly
    (a bf16 sum would round it) and the model's gradients are dropped after each accumulation."""
    model = _model()
    params = _trainable(model)
    masters = MasterWeights(params, torch.bfloat16, SingleProcess())
    grads = []
    for tokens in ([1, 5, 9, 2, 7, 3], [4, 4, 8, 1, 6, 2, 2]):
        packed_token_logprobs(model, [tokens])[0].sum().backward()
        grads.append([p.grad.clone() for p in params])
        masters.accumulate()
        assert all(p.grad is None for p in params)
    sums = [g1.float() + g2.float() for g1, g2 in zip(*grads, strict=True)]
    for m, expected in zip(masters.copies, sums, strict=True):
        assert m.grad.dtype == torch.float32 and torch.equal(m.grad, expected)
    bf16_sums = [(g1 + g2).float() for g1, g2 in zip(*grads, strict=True)]
    assert any(not torch.equal(s, b) for s, b in zip(sums, bf16_sums, strict=True))
    masters.zero_grads()
    assert all(m.grad is None for m in masters.copies) and all(p.grad is None for p in params)


def test_after_a_step_the_masters_round_to_nearest_into_the_model():
    model = _model()
    params = _trainable(model)
    masters = MasterWeights(params, torch.bfloat16, SingleProcess())
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in masters.copies:
            m.add_(torch.randn(m.shape, generator=gen) * 1e-3)
    assert any(not torch.equal(m, m.to(torch.bfloat16).float()) for m in masters.copies)
    masters.round_into_model()
    for p, m in zip(params, masters.copies, strict=True):
        assert p.dtype == torch.bfloat16 and torch.equal(p, m.to(torch.bfloat16))


def test_an_fp32_model_has_no_separate_masters():
    model = _model("float32")
    params = _trainable(model)
    masters = MasterWeights(params, torch.float32, SingleProcess())
    assert not masters.exist and masters.copies is None and masters.state() is None
    assert [id(t) for t in masters.optimized()] == [id(p) for p in params]
    packed_token_logprobs(model, [[1, 5, 9, 2]])[0].sum().backward()
    before = [p.grad.clone() for p in params]
    masters.accumulate()  # nothing to move: the gradients stay on the fp32 parameters
    assert all(torch.equal(p.grad, g) for p, g in zip(params, before, strict=True))
    learner = Learner(_model("float32"), _cfg())
    assert learner.masters is None and whole_state(learner)["masters"] is None


def test_the_masters_round_trip_through_state_and_load_bitwise(tmp_path):
    learner = Learner(_model(), _cfg(assert_lag0_exact=False))
    learner.step(_batch())
    saved = learner.master_weights.state()
    assert [m.dtype for m in saved] == [torch.float32] * len(learner.params)
    assert any(not torch.equal(m, m.to(torch.bfloat16).float()) for m in saved)  # fp32 bits bf16 lacks
    saved[0].add_(1.0)  # a copy: the live masters are not touched
    assert not torch.equal(saved[0], learner.masters[0])
    saved[0].sub_(1.0)
    other = Learner(_model(seed=5), _cfg(assert_lag0_exact=False))
    other.load_state(learner.save_state(tmp_path / "learner"), tmp_path / "learner")
    for a, b in zip(learner.masters, other.masters, strict=True):
        assert torch.equal(a, b)
    # Without saved masters (new weights from outside) the masters take the weights.
    weights = [p.detach().clone() for p in _trainable(_model(seed=6))]
    other.master_weights.load(None, weights)
    for m, w in zip(other.masters, weights, strict=True):
        assert torch.equal(m, w.float())


def test_a_model_whose_parameters_mix_dtypes_is_refused_in_one_line():
    model = _model()
    model.model.norm.float()
    with pytest.raises(ValueError, match="share one dtype"):
        Learner(model, _cfg())


# ---- FSDP2 on 2 gloo ranks --------------------------------------------------------------------------------
def _sharded_worker(rank: int, world: int, store: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        out = {}
        for dtype in ("bfloat16", "float32"):
            learner = Learner(_model(dtype), _cfg(assert_lag0_exact=False), ranks=ShardedRanks())
            mw = learner.master_weights
            initial = mw.state()
            metrics = learner.step(_batch())
            saved = mw.state()
            out[dtype] = dict(
                exist=mw.exist,
                in_shards=mw.in_shards,
                copies=mw.copies,
                optimized_is_params=all(a is b for a, b in zip(mw.optimized(), learner.params, strict=True)),
                shard_dtypes={p.dtype for p in learner.params},
                all_dtensors=all(isinstance(p, DTensor) for p in learner.params),
                initial=initial,
                saved=saved,
                weights=[learner.ranks.full(p.detach().to(learner.dtype)) for p in learner.params],
                metrics=metrics,
            )
            if saved is not None:  # load the gathered masters back into the shards: the same bits
                learner.master_weights.load(saved, [None] * len(saved))
                out[dtype]["reloaded"] = mw.state()
        if rank == 0:
            torch.save(out, os.path.join(out_dir, "masters.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, spawn_ranks):
    out = tmp_path_factory.mktemp("masters")
    spawn_ranks(_sharded_worker, str(out / "store"), str(out))
    return torch.load(out / "masters.pt", weights_only=False)


def test_sharded_bf16_the_fp32_shards_are_the_masters_and_no_copy_exists(sharded):
    r = sharded["bfloat16"]
    assert r["exist"] and r["in_shards"] and r["copies"] is None
    assert r["optimized_is_params"] and r["all_dtensors"] and r["shard_dtypes"] == {torch.float32}
    assert r["metrics"]["step_skipped_nonfinite"] == 0 and r["metrics"]["version"] == 0
    # The checkpoint's masters are whole fp32 tensors, the one-process layout.
    single = _trainable(_model())
    assert [m.shape for m in r["saved"]] == [p.shape for p in single]
    assert all(m.dtype == torch.float32 for m in r["saved"])
    for m, p in zip(r["initial"], single, strict=True):
        assert torch.equal(m, p.float())
    # After the step the masters hold fp32 bits bf16 lacks; the published weights are them rounded.
    assert any(not torch.equal(m, m.to(torch.bfloat16).float()) for m in r["saved"])
    for m, w in zip(r["saved"], r["weights"], strict=True):
        assert w.dtype == torch.bfloat16 and torch.equal(w, m.to(torch.bfloat16))
    for a, b in zip(r["saved"], r["reloaded"], strict=True):
        assert torch.equal(a, b)


def test_sharded_fp32_has_no_masters(sharded):
    r = sharded["float32"]
    assert not r["exist"] and not r["in_shards"] and r["copies"] is None and r["saved"] is None
    assert r["optimized_is_params"] and r["shard_dtypes"] == {torch.float32}
