"""The weight-update record: the learner makes one ``WeightUpdate`` per publication (its version, the tensors
sent, the claim on the frozen rest as a field, not as a fake tensor among the weights), the in-process
publisher sends it, the engine applies that one record type, and lag-0 tokens stay exact through it."""

from __future__ import annotations

import copy

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams, generate_batch
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.held_weights import HELD_KEY, digest
from rz_agents.model.lora import LoraConfig, adapter_names, add_lora
from rz_agents.model.weight_update import WeightUpdate
from rz_agents.runtime.publish_local import InProcessPublisher
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trajectory import Trajectory

LORA = LoraConfig(rank=4, alpha=8.0)


def _model(lora: bool, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(ModelConfig.tiny("qwen3", vocab_size=64, dtype="bfloat16"))
    if lora:
        add_lora(model, LORA)
    with torch.no_grad():  # sharp logits: a wrong weight moves the sampled tokens' log-probs visibly
        model.lm_head.weight.mul_(8.0)
    return model


def _engine(model: Transformer) -> RZEngine:
    return RZEngine(copy.deepcopy(model).requires_grad_(False), EngineConfig(max_running=4, max_len=64))


def _batch(engine: RZEngine, seed: int) -> list[Trajectory]:
    prompts = [[1 + g, 5, 7] for g in range(2) for _ in range(4)]
    params = [SamplingParams(temperature=1.0, max_tokens=6, seed=seed * 100 + i) for i in range(len(prompts))]
    out = []
    for i, (p, c) in enumerate(zip(prompts, generate_batch(engine, prompts, params), strict=True)):
        reward = float(sum(t % 2 == 0 for t in c.tokens))
        out.append(
            Trajectory(
                p + c.tokens, [False] * len(p) + [True] * len(c.tokens), [0.0] * len(p) + c.logprobs.tolist(),
                [-1] * len(p) + list(c.versions), reward, i // 4,
            )
        )  # fmt: skip
    return out


def _learner(model: Transformer, lora: bool) -> Learner:
    adapters = LORA if lora else LoraConfig()
    cfg = LearnerConfig(optim=OptimConfig(lr=1e-2), assert_lag0_exact=True, lora=adapters)
    return Learner(model, cfg)


def test_the_flat_form_round_trips_and_the_claim_is_a_field_not_a_tensor_name():
    tensors = {"a": torch.arange(4.0), "b": torch.ones(2, 3, dtype=torch.bfloat16)}
    claim = digest(tensors.items())
    update = WeightUpdate(3, tensors, claim)
    state = update.to_state()
    assert sorted(state) == sorted(["a", "b", HELD_KEY])  # the claim is a tensor in the flat form only
    back = WeightUpdate.from_state(state, 3)
    assert back.version == 3 and back.held_sha256 == claim and sorted(back.tensors) == ["a", "b"]
    assert all(torch.equal(back.tensors[k], tensors[k]) for k in tensors)
    assert WeightUpdate.from_state(tensors, 1).held_sha256 is None and not WeightUpdate(1, tensors).partial
    assert update.nbytes == 4 * 4 + 6 * 2 + 32 and WeightUpdate(1, tensors).nbytes == 4 * 4 + 6 * 2
    with pytest.raises(ValueError, match="not a tensor name"):
        WeightUpdate(1, state)
    with pytest.raises(ValueError, match="64 hex digits"):
        WeightUpdate(1, tensors, "abc")


def test_a_lora_learner_makes_one_record_with_the_adapters_and_the_base_claim_as_a_field():
    model = _model(lora=True)
    learner = _learner(model, lora=True)
    update = learner.weight_update()
    names = adapter_names(model)
    assert update.version == learner.version == 0
    assert sorted(update.tensors) == sorted(names) and HELD_KEY not in update.tensors
    base = [(n, t) for n, t in model.state_dict().items() if n not in set(names)]
    assert update.held_sha256 == digest(base)
    whole = _learner(_model(lora=False), lora=False).weight_update()
    assert whole.held_sha256 is None and not whole.partial  # nothing frozen: every weight, no claim


def test_in_process_publisher_keeps_lag0_exact_and_a_snapshot_is_unchanged_by_the_next_step():
    model = _model(lora=True)
    engine = _engine(model)
    learner = _learner(model, lora=True)
    publisher = InProcessPublisher(engine, learner)
    assert publisher.current_is_partial()
    kept = publisher.snapshot(publisher.current())
    for step in range(2):
        m = learner.step(_batch(engine, seed=step))
        assert m["lag0_token_count"] > 0 and m["lag0_abs_dlogp_max"] == 0.0
        publisher.publish(publisher.current())
        assert engine.version == learner.version == step + 1
        assert publisher.last_bytes == publisher.current().nbytes > 0
    b = [n for n in adapter_names(model) if ".lora_B." in n][0]
    assert kept.tensors[b].abs().sum() == 0 and model.state_dict()[b].abs().sum() > 0  # the snapshot kept v0


def test_the_engine_refuses_a_record_whose_claim_it_does_not_hold_and_changes_nothing():
    model = _model(lora=True)
    learner = _learner(model, lora=True)
    other = _engine(_model(lora=True, seed=1))  # another base: the claim cannot hold
    before = {k: v.clone() for k, v in other.model.state_dict().items()}
    with pytest.raises(ValueError, match="partial update"):
        other.apply_update(learner.weight_update())
    assert other.version == 0
    assert all(torch.equal(v, other.model.state_dict()[k]) for k, v in before.items())
    other.apply_update(InProcessPublisher(other, learner).whole())  # the whole weights first, then it holds
    other.apply_update(learner.weight_update())
    # negative control: the same tensors without their claim are taken by an engine that holds another base
    stray = _engine(_model(lora=True, seed=2))
    stray.apply_update(WeightUpdate(0, learner.weight_update().tensors))
