"""The vision-language learner on 2 gloo ranks with FSDP2 against the one-process learner.

A vision-language model keeps its decoder layers under ``model.language_model`` (the ``decoder`` property),
not under ``model`` as a text model does, and its vision tower sits beside them. Two spawned processes shard a
tiny Qwen3-VL and take one step on a batch of image episodes that the real engine sampled from the learner's
published weights (every sampled token is a lag-0 token). Micro-batches of two sequences: each rank runs one,
so both ranks re-encode images in their packed forward.

What must hold (as for the text model, tests/trainer/test_trainer_sharding.py): every language-model layer is
its own FSDP unit; the all-gathered forward is bit-identical to the engine (assert_lag0_exact, lag-0 |dlogp|
== 0.0), so the loss and every log-prob metric are bitwise the one-process step's from the same state; the
gradients are summed in another grouping, so the updated weights (vision tower included) agree to float
rounding: no weight differs by more than lr / 100 after one AdamW step, and the gradient norm to 1e-6
relative. Negative control: the step moves the tower and the language model by about lr (AdamW's first step),
far more than the tolerance, so matching weights is not a trivial no-op agreement."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from tests.trainer.learner_state import restore_whole_state, whole_state
from tests.trainer.vl_batch import sample_vl_batch, tiny_vl_model

LR = 1e-3


def _cfg() -> LearnerConfig:
    # 4 sequences of 25-26 tokens: two micro-batches of two sequences, one per rank
    return LearnerConfig(
        optim=OptimConfig(lr=LR, max_grad_norm=1.0), assert_lag0_exact=True, micro_batch_tokens=52
    )


def _worker(rank: int, world: int, store: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from rz_agents.trainer.sharding import ShardedRanks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        learner = Learner(tiny_vl_model(), _cfg(), ranks=ShardedRanks())
        units = [isinstance(layer, FSDPModule) for layer in learner.model.decoder.layers]
        before = copy.deepcopy(whole_state(learner))  # (it shares tensors with the live state)
        sampler = tiny_vl_model()
        sampler.load_state_dict(learner.weights())
        batch = sample_vl_batch(sampler)
        metrics = learner.step(batch)
        result = {
            "units": units,
            "before": before,
            "batch": batch,
            "metrics": metrics,
            "after": learner.weights(),
        }
        if rank == 0:
            torch.save(result, os.path.join(out_dir, "sharded_vl.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, spawn_ranks):
    out = tmp_path_factory.mktemp("fsdp_vl")
    spawn_ranks(_worker, str(out / "store"), str(out))
    return torch.load(out / "sharded_vl.pt", weights_only=False)


NOT_BITWISE = ("time_", "learner_tokens_per_s", "learner_thread_cpu_s", "grad_norm")


def test_each_language_model_layer_is_its_own_fsdp_unit(sharded):
    assert sharded["units"] == [True] * tiny_vl_model().vl_config.text.num_hidden_layers


def test_the_sharded_vl_step_matches_the_one_process_step_from_the_same_state(sharded):
    metrics, batch = sharded["metrics"], sharded["batch"]
    assert all(t.images for t in batch) and len({t.reward for t in batch}) > 1  # images and a gradient
    assert metrics["lag0_token_count"] == sum(sum(t.loss_mask) for t in batch) > 0
    assert metrics["lag0_abs_dlogp_max"] == 0.0 and metrics["step_skipped_nonfinite"] == 0
    single = Learner(tiny_vl_model(), _cfg())
    restore_whole_state(single, sharded["before"])
    expected = single.step(batch)
    for key, value in expected.items():
        if not key.startswith(NOT_BITWISE):
            assert metrics[key] == value or (value != value and metrics[key] != metrics[key]), key
    assert metrics["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-6)
    after, reference, start = sharded["after"], single.weights(), sharded["before"]["model"]
    assert set(after) == set(reference)
    for k, v in reference.items():
        assert after[k].dtype == v.dtype
        assert float((after[k] - v).abs().max()) <= LR / 100, k
    # the step moved both halves of the model by about lr: agreeing to lr / 100 is not agreeing on nothing
    for prefix in ("model.visual.", "model.language_model."):
        moved = max(float((reference[k] - start[k]).abs().max()) for k in reference if k.startswith(prefix))
        assert moved > LR / 2, prefix
