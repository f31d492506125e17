"""The learner with LoRA: the base stays frozen (no gradient, fp32 master or AdamW state), only the adapters
train, a weight update publishes the adapters only, and lag-0 tokens sampled by the engine score exactly."""

from __future__ import annotations

import copy

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams, generate_batch
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.held_weights import HELD_KEY
from rz_agents.model.lora import LoraConfig, adapter_names, add_lora, publication_bytes
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trajectory import Trajectory

LORA = LoraConfig(rank=4, alpha=8.0)


def _pair(dtype: str, kernels: str = "aligned") -> tuple[Transformer, RZEngine]:
    """The learner's model with adapters and an engine over its own copy (as the local runtime wires them)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.tiny("qwen3", vocab_size=64, dtype=dtype), kernels=kernels)
    add_lora(model, LORA)
    engine_model = copy.deepcopy(model).requires_grad_(False)
    return model, RZEngine(engine_model, EngineConfig(max_running=4, max_len=64, num_threads=1))


def _batch(engine: RZEngine, seed: int) -> list[Trajectory]:
    prompts = [[1 + g, 5, 7] for g in range(2) for _ in range(4)]
    params = [SamplingParams(temperature=1.0, max_tokens=6, seed=seed * 100 + i) for i in range(len(prompts))]
    out = []
    for i, (p, c) in enumerate(zip(prompts, generate_batch(engine, prompts, params), strict=True)):
        reward = float(sum(t % 2 == 0 for t in c.tokens))  # even tokens are "good"
        out.append(
            Trajectory(
                p + c.tokens, [False] * len(p) + [True] * len(c.tokens), [0.0] * len(p) + c.logprobs.tolist(),
                [-1] * len(p) + list(c.versions), reward, i // 4,
            )
        )  # fmt: skip
    return out


def test_lora_learner_trains_adapters_only_and_lag0_stays_exact_through_adapter_updates():
    model, engine = _pair("bfloat16")
    base = {k: v.clone() for k, v in model.state_dict().items() if ".lora_" not in k}
    learner = Learner(model, LearnerConfig(optim=OptimConfig(lr=1e-2), assert_lag0_exact=True, lora=LORA))
    names = adapter_names(model)
    assert len(learner.params) == len(names) == 2 * 7 * model.config.num_hidden_layers
    assert len(learner.masters) == len(names)  # fp32 masters of the adapters only
    for version in range(2):  # step on the engine's tokens, publish, sample with the new adapters, again
        m = learner.step(_batch(engine, seed=version))
        assert m["lag0_token_count"] > 0 and m["lag0_abs_dlogp_max"] == 0.0
        published = learner.published_weights()
        assert sorted(published) == sorted([*names, HELD_KEY])  # the adapters, the claim on the base
        sent = sum(t.numel() * t.element_size() for k, t in published.items() if k != HELD_KEY)
        everything = sum(t.numel() * t.element_size() for t in learner.weights().values())
        # adapters only, vs the base weights a full update (without LoRA) sends
        assert (sent, everything - sent) == publication_bytes(model.config, LORA)
        engine.load_weights(published, learner.version)
    assert len(learner.optimizer.state) == len(names)  # AdamW state for the adapters only
    assert all(p.grad is None for n, p in model.named_parameters() if ".lora_" not in n)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in base.items())  # the base is frozen
    assert any(model.state_dict()[n].abs().sum() > 0 for n in names if ".lora_B." in n)  # B trained


def test_lora_negative_control_standard_ops_mismatch_and_missing_adapters_refused():
    model, engine = _pair("float32", kernels="standard")
    learner = Learner(model, LearnerConfig(optim=OptimConfig(lr=1e-2), lora=LORA))
    learner.step(_batch(engine, seed=0))
    engine.load_weights(learner.published_weights(), learner.version)  # B != 0 now: adapters count
    m = learner.step(_batch(engine, seed=1))
    assert m["lag0_token_count"] > 0 and m["lag0_abs_dlogp_max"] > 0.0
    with pytest.raises(ValueError, match="no adapters"):
        Learner(Transformer(ModelConfig.tiny("qwen3", vocab_size=64)), LearnerConfig(lora=LORA))
