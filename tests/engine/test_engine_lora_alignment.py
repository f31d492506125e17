"""LoRA adapters keep the engine's log-probs equal to the trainer's packed forward bit for bit, on every
engine path (prefill, chunked prefill, decode, the static decode step, fused q/k/v and gate/up)."""

from __future__ import annotations

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams, generate_batch
from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.model.lora import LoraConfig, adapter_names, add_lora


def _adapted(tiny_model, model_type="qwen3", dtype="float32", kernels="aligned", targets=None):
    model = tiny_model(model_type, dtype=dtype, kernels=kernels)
    cfg = LoraConfig(rank=4, alpha=8.0, **({"target_modules": targets} if targets else {}))
    add_lora(model, cfg)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # B starts at 0 (a no-op adapter): make every adapter count
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_((torch.randn(p.shape, generator=gen) * 0.05).to(p.dtype))
    return model


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (3, 40, 17, 66)]


def _engine_vs_trainer(model, static_decode: bool) -> list[bool]:
    engine = RZEngine(
        model,
        EngineConfig(
            max_running=3, max_len=256, max_batch_tokens=24, num_threads=1, static_decode=static_decode
        ),
    )
    prompts = _prompts(model.config.vocab_size)
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=1)
    outs = generate_batch(engine, prompts, params)
    # the trainer's forward: packed sequences, grad enabled (as in the learner), separate (unfused) GEMMs
    lps = packed_token_logprobs(model, [p + o.tokens for p, o in zip(prompts, outs, strict=True)])
    return [
        torch.equal(o.logprobs, lp[len(p) - 1 :].detach())
        for p, o, lp in zip(prompts, outs, lps, strict=True)
    ]


@pytest.mark.parametrize(
    "model_type,dtype,static_decode",
    [("qwen3", "float32", True), ("qwen3", "bfloat16", True), ("llama", "float32", False)],
)
def test_lora_engine_logprobs_equal_trainer(tiny_model, model_type, dtype, static_decode):
    model = _adapted(tiny_model, model_type, dtype)
    assert len(adapter_names(model)) == 2 * 7 * model.config.num_hidden_layers
    assert all(p.requires_grad == (".lora_" in n) for n, p in model.named_parameters())
    assert all(_engine_vs_trainer(model, static_decode))
    # the engine ran the stacked q/k/v and gate/up GEMMs (adapters added per part after them)
    attn = model.model.layers[0].self_attn
    assert model.fused_projections and attn.qkv is not None and attn.qkv.usable(model.ops)


def test_lora_changes_the_function_and_standard_ops_differ(tiny_model):
    """Negative controls: the adapters are live (logits move), and the standard op set breaks equality."""
    base = tiny_model()
    model = _adapted(tiny_model)
    tokens = torch.tensor(_prompts(base.config.vocab_size)[1])
    pos = torch.arange(tokens.numel())
    with torch.no_grad():
        assert not torch.equal(base.logits(base(tokens, pos)), model.logits(model(tokens, pos)))
    standard = _adapted(tiny_model, kernels="standard")
    assert not all(_engine_vs_trainer(standard, static_decode=True))


def test_lora_refuses_moe_experts_dropout_and_unknown_targets(tiny_model):
    with pytest.raises(ValueError, match="MoE experts"):
        add_lora(tiny_model("qwen3_moe"), LoraConfig(rank=2))
    add_lora(tiny_model("qwen3_moe"), LoraConfig(rank=2, target_modules=["q_proj", "v_proj"]))  # attention ok
    with pytest.raises(ValueError, match="dropout must be 0"):
        LoraConfig(rank=2, dropout=0.1).validate()
    with pytest.raises(ValueError, match="target_modules"):
        LoraConfig(rank=2, target_modules=["qkv"]).validate()
    with pytest.raises(ValueError, match="DeepSeek"):
        add_lora(tiny_model("deepseek_v3"), LoraConfig(rank=2))
