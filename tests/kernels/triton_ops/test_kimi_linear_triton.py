"""A tiny Kimi Linear (one KDA layer, one NoPE MLA layer with an MoE after it) on the Triton op set, run by
the interpreter through the engine: prefill cut inside and across a 64-token delta-rule chunk, decode rows
riding along, static decode; every sampled token's log-prob equals the learner's packed forward bit for bit
(torch.equal), and the engine ran the KDA kernel (not the scalar one)."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams, generate_batch  # noqa: E402
from rz_agents.model.logprobs import packed_token_logprobs  # noqa: E402
from rz_agents.model.policy import PolicySpec, build_policy  # noqa: E402
from rz_kernels.triton_ops import kda  # noqa: E402
from rz_kernels.triton_ops.opset import TRITON  # noqa: E402

VOCAB = 64
TINY = dict(
    hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
    num_attention_heads=2, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    num_experts=4, num_experts_per_tok=2, linear_num_heads=1, linear_head_dim=16,
    layer_types=("linear_attention", "full_attention"), mlp_layer_types=("dense", "sparse"),
)  # fmt: skip


def _model(kernels: str):
    """Sharp logits (weights std 0.3, the LM head's x3) and a slow, channel-varied decay (the state carries
    across the chunk boundary), as tests/engine/test_engine_kimi_linear_alignment.py's model."""
    spec = PolicySpec(model_type="kimi_linear", vocab_size=VOCAB, kernels=kernels, tiny_overrides=TINY)
    model = build_policy(spec)
    model.reset_parameters(std=0.3, seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.lm_head.weight.mul_(3)
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.005, 0.05, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.empty(p.shape).uniform_(-4, -2, generator=gen))
    return model.eval()


def test_engine_logprobs_equal_the_learner_on_the_triton_op_set(monkeypatch):
    model = _model("triton")
    assert model.ops_for("cpu") is TRITON
    launches = []
    real = kda.launch_kda

    def counting(*args, **kwargs):
        launches.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(kda, "launch_kda", counting)
    monkeypatch.setattr("rz_kernels.triton_ops.delta_rule.launch_kda", counting)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (63, 5)]
    params = [SamplingParams(temperature=1.0, max_tokens=3, seed=i, ignore_eos=True) for i in range(2)]
    # a 40-token budget cuts the 63-token prompt inside chunk 0 with the short one riding along; its decode
    # steps feed positions 63 (completing chunk 0) and 64 (chunk 1, on the state after chunk 0)
    engine = RZEngine(model, EngineConfig(max_len=128, max_batch_tokens=40, num_threads=1))
    outs = generate_batch(engine, prompts, params)
    assert launches
    with torch.no_grad():
        lps = packed_token_logprobs(model, [p + o.tokens for p, o in zip(prompts, outs, strict=True)])
    for p, o, lp in zip(prompts, outs, lps, strict=True):
        assert o.finish_reason == "length", o.error
        assert torch.equal(o.logprobs, lp[len(p) - 1 :]), (o.logprobs - lp[len(p) - 1 :]).abs().max()
    assert engine.stats()["static_decode_steps"] > 0
    # close to the CPU op set's learner (another kernel set: close, not equal)
    cpu = _model("aligned")
    with torch.no_grad():
        ref = packed_token_logprobs(cpu, [p + o.tokens for p, o in zip(prompts, outs, strict=True)])
    for a, b in zip(lps, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
