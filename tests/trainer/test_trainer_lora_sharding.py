"""LoRA on 2 gloo learner ranks with FSDP2 against the one-process LoRA learner, bit for bit.

Two spawned ranks shard the frozen base (FSDP2) and hold the adapters whole (replicated, with fp32 masters for
the bf16 model); each round of micro-batches they all-gather the adapters' per-micro-batch gradients and add
them in micro-batch order (trainer/replicated_grads.py). The batches are sampled by the real engine with the
weights the sharded learner publishes (every token of a step is a lag-0 token). The ranks save, per step, the
batch, the metrics, the published tensors and the whole learner state; a checkpoint written after step 1 is
loaded by a fresh sharded learner and by a one-process learner, each replaying step 2. The test replays every
step with one process.

What holds bitwise (``torch.equal``, ``==``), unlike the full-weight sharded learner
(tests/trainer/test_trainer_sharding.py, equal to rounding): every metric including the loss and the
gradient norm, the published adapters, the fp32 masters and AdamW state after every step, and the resumed
step; lag-0 |dlogp| is 0.0 on every step.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.held_weights import HELD_KEY
from rz_agents.model.lora import LoraConfig, adapter_names, add_lora
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from tests.trainer.fsdp_warnings import view_warnings
from tests.trainer.learner_state import whole_state
from tests.trainer.test_trainer_sharding import _sample

LORA = LoraConfig(rank=4, alpha=8.0)
ATTENTION_LORA = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
STEPS = 3
KINDS = ("bf16", "fp32", "moe")
NOT_BITWISE = ("time_", "learner_tokens_per_s", "learner_thread_cpu_s")


def _model(kind: str) -> Transformer:
    torch.manual_seed(0)
    if kind == "moe":  # (adapters on the attention projections: MoE experts cannot be adapted)
        model = Transformer(ModelConfig.tiny("qwen3_moe", vocab_size=64), kernels="aligned")
        add_lora(model, ATTENTION_LORA)
        return model
    cfg = ModelConfig.tiny(
        "qwen3", vocab_size=64, tie_word_embeddings=True, dtype="bfloat16" if kind == "bf16" else "float32"
    )
    model = Transformer(cfg, kernels="aligned")
    add_lora(model, LORA)
    return model


def _cfg(kind: str = "bf16") -> LearnerConfig:
    # 9 sequences of 16 tokens in micro-batches of 2: 5 micro-batches, rank 1 runs an idle pass
    optim = OptimConfig(lr=2e-2, max_grad_norm=1.0)
    lora = ATTENTION_LORA if kind == "moe" else LORA
    return LearnerConfig(optim=optim, assert_lag0_exact=True, micro_batch_tokens=40, lora=lora)


def _worker(rank: int, world: int, store: str, out_dir: str) -> None:
    import torch.distributed as dist

    from rz_agents.trainer.sharding import ShardedRanks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        results = {}
        with view_warnings() as views:
            for kind in KINDS:
                learner = Learner(_model(kind), _cfg(kind), ranks=ShardedRanks())
                record, saved = [], None
                for step in range(STEPS):
                    batch = _sample(learner.weights(), kind, learner.version, seed=step, build=_model)
                    if step == 2:  # a checkpoint before the last step (every rank writes its shards)
                        folder = os.path.join(out_dir, f"ckpt-{kind}")
                        saved = (learner.save_state(folder), folder, batch)
                        if rank == 0:
                            torch.save(saved[0], folder + ".state.pt")
                    metrics = learner.step(batch)
                    published = {k: v.clone() for k, v in learner.published_weights().items()}
                    record.append((batch, metrics, published, copy.deepcopy(whole_state(learner))))
                resumed = Learner(_model(kind), _cfg(kind), ranks=ShardedRanks())
                state, folder, batch = saved
                resumed.load_state(state, folder)
                metrics = resumed.step(batch)
                results[kind] = (record, (metrics, resumed.published_weights(), whole_state(resumed)))
        results["view_warnings"] = views
        if rank == 0:
            torch.save(results, os.path.join(out_dir, "sharded_lora.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, spawn_ranks):
    out = tmp_path_factory.mktemp("fsdp_lora")
    spawn_ranks(_worker, str(out / "store"), str(out))
    return torch.load(out / "sharded_lora.pt", weights_only=False), out


def _same_metrics(mine: dict, expected: dict) -> None:
    assert set(mine) == set(expected)
    for key, value in expected.items():
        if not key.startswith(NOT_BITWISE):
            assert mine[key] == value or (value != value and mine[key] != mine[key]), key


def _same_tensors(mine: dict, expected: dict) -> None:
    assert set(mine) == set(expected)
    for k, v in expected.items():
        assert mine[k].dtype == v.dtype and torch.equal(mine[k], v), k


def _same_state(mine: dict, expected: dict) -> None:
    _same_tensors(mine["model"], expected["model"])
    if expected["masters"] is None:
        assert mine["masters"] is None
    else:
        assert all(torch.equal(a, b) for a, b in zip(mine["masters"], expected["masters"], strict=True))
    theirs = expected["optimizer"]["state"]
    assert set(mine["optimizer"]["state"]) == set(theirs)
    for index, per in mine["optimizer"]["state"].items():
        for key, value in per.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(theirs[index][key])), (index, key)


def test_no_sharded_lora_forward_returns_a_view_tensor(sharded):
    assert sharded[0]["view_warnings"] == []  # (what FSDP2 warned on every forward: test_trainer_sharding.py)


@pytest.mark.parametrize("kind", KINDS)
def test_sharded_lora_steps_equal_the_one_process_lora_steps_bit_for_bit(sharded, kind):
    record, _ = sharded[0][kind]
    single = Learner(_model(kind), _cfg(kind))
    names = adapter_names(single.model)
    for batch, metrics, published, state in record:
        assert metrics["lag0_token_count"] == sum(sum(t.loss_mask) for t in batch) > 0
        assert metrics["lag0_abs_dlogp_max"] == 0.0 and metrics["step_skipped_nonfinite"] == 0
        expected = single.step(batch)
        _same_metrics(metrics, expected)  # loss and gradient norm included
        # adapters only, as one process publishes, and the claim on the base (the sharded ranks hash the
        # gathered base: the same SHA-256 as one process)
        assert sorted(published) == sorted([*names, HELD_KEY])
        _same_tensors(published, single.published_weights())
        _same_state(state, whole_state(single))
    assert any(v.abs().sum() > 0 for k, v in record[-1][2].items() if ".lora_B." in k)  # B trained


@pytest.mark.parametrize("kind", KINDS)
def test_a_sharded_lora_checkpoint_resumes_the_step_bit_for_bit(sharded, kind):
    record, (metrics, published, state) = sharded[0][kind]
    batch, expected_metrics, expected_published, expected_state = record[2]
    _same_metrics(metrics, expected_metrics)
    _same_tensors(published, expected_published)
    _same_state(state, expected_state)
    # The 2-rank checkpoint (folder + the base written once beside it) resumed by one process: the same step.
    saved = torch.load(sharded[1] / f"ckpt-{kind}.state.pt", weights_only=False)
    single = Learner(_model(kind), _cfg(kind))
    single.load_state(saved, sharded[1] / f"ckpt-{kind}")
    _same_metrics(single.step(batch), expected_metrics)
    _same_tensors(single.published_weights(), expected_published)
    _same_state(whole_state(single), expected_state)


def test_control_the_ranks_grouping_of_the_same_gradients_gives_other_bits(sharded):
    """Why the rows are gathered and added in order: the same per-micro-batch adapter gradients (fp32 model)
    summed the way an all-reduce of the ranks' partial sums groups them, ``((g0 + g2) + g4) + (g1 + g3)``,
    differ from one process's ``(((g0 + g1) + g2) + g3) + g4``, which the sharded learner reproduces. (In bf16
    the fp32 sums of a few bf16 gradients are exact in any order.)"""
    record, _ = sharded[0]["fp32"]
    single = Learner(_model("fp32"), _cfg("fp32"))
    grads = []  # per micro-batch, per adapter tensor: its gradient

    def capture():  # (after each micro-batch's backward; dropping it leaves the next one alone on .grad)
        grads.append([p.grad.clone() for p in single.params])
        for p in single.params:
            p.grad = None

    single.master_weights.accumulate = capture
    single.step(record[0][0])
    assert len(grads) == 5  # 9 sequences, 2 per micro-batch: rank 0 runs 0, 2, 4 and rank 1 runs 1, 3
    differ = 0
    for g0, g1, g2, g3, g4 in zip(*grads, strict=True):
        ordered = (((g0 + g1) + g2) + g3) + g4
        grouped = ((g0 + g2) + g4) + (g1 + g3)
        differ += not torch.equal(ordered, grouped)
    assert differ > 0
