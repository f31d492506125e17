"""Kimi Linear (KDA + NoPE MLA + MoE) in the engine: every sampled token's log-prob equals the learner's
packed forward bit for bit (torch.equal), with the KDA state and MLA K/V in the model's own paged cache,
under batch sizes 1..N, chunked prefill cut at every offset inside a 64-token chunk, static decode,
preemption, prefix reuse and a weight update, in fp32 and bf16; the MoE router picks the same experts for a
token however it is computed; and the negative controls (the standard op set in the engine, transformers'
chunked KDA in the learner) differ."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams, generate_batch
from rz_agents.model.deepseek_moe import DeepseekMoE
from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.model.policy import PolicySpec, build_policy
from rz_agents.model.qwen3_5 import SequenceState
from rz_kernels.delta_rule import DeltaRuleCache

VOCAB = 96


def _model(dtype: str = "float32", seed: int = 0, kernels: str = "aligned"):
    """A tiny random Kimi Linear (3 KDA layers, 1 MLA; MoE after the first layer) with sharp logits (weights
    std 0.3, the LM head's x3): flat logits would hide errors."""
    spec = PolicySpec(model_type="kimi_linear", vocab_size=VOCAB, dtype=dtype, kernels=kernels)
    model = build_policy(spec)
    model.reset_parameters(std=0.3, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(3)
        for name, p in model.named_parameters():
            if name.endswith("A_log"):  # slow decay (A 0.005..0.05): the state carries across chunks
                p.copy_(torch.empty(p.shape).uniform_(0.005, 0.05, generator=gen).log())
            elif name.endswith("dt_bias"):  # softplus(-3 + x): a slow per-channel decay, varied by channel
                p.copy_(torch.empty(p.shape).uniform_(-4, -2, generator=gen))
    return model.eval()


def _prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in lengths]


def _params(n, max_tokens=12):
    return [SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=i) for i in range(n)]


def _learner_logprobs(model, prompts, outs):
    with torch.no_grad():
        lps = packed_token_logprobs(model, [p + o.tokens for p, o in zip(prompts, outs, strict=True)])
    return [lp[len(p) - 1 :] for p, lp in zip(prompts, lps, strict=True)]


def _assert_equal(model, prompts, outs):
    for p, o, lp in zip(prompts, outs, _learner_logprobs(model, prompts, outs), strict=True):
        assert o.finish_reason == "length", o.error
        assert torch.equal(o.logprobs, lp), (len(p), (o.logprobs - lp).abs().max().item())


def test_the_tiny_model_has_sharp_logits_and_a_state_that_carries_across_chunks():
    model = _model()
    (seq,) = _prompts([130])
    tokens = torch.tensor(seq)
    with torch.no_grad():
        logits = model.logits(model(tokens, seq_lens=[130]))
        # the delta-rule state entering chunk 2 zeroed: the last tokens' logits must move (a snapshot bug
        # would show; with a fast decay the state would be forgotten within a chunk and hide it)
        state = SequenceState()
        model(tokens[:128], seq_lens=[128], states=[state])
        for _window, cache in state.layers.values():
            if isinstance(cache, DeltaRuleCache):
                cache.state.zero_()
        forgot = model.logits(model(tokens[128:], seq_lens=[2], states=[state]))
    assert logits.softmax(-1).max(-1).values.mean() > 0.5
    assert (forgot.log_softmax(-1) - logits[128:].log_softmax(-1)).abs().max() > 0.1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_engine_logprobs_equal_the_learner_across_batch_sizes(dtype, batch):
    model = _model(dtype)
    # a 37-token budget cuts prompts inside 64-token chunks and mixes prefill chunks with decodes
    engine = RZEngine(model, EngineConfig(max_len=256, max_batch_tokens=37, num_threads=1))
    prompts = _prompts([3, 63, 64, 65, 130][:batch], seed=batch)
    outs = generate_batch(engine, prompts, _params(batch))
    _assert_equal(model, prompts, outs)
    assert engine.stats()["static_decode_steps"] > 0  # the static decode buffers ran


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefill_cut_at_every_offset_within_a_chunk(dtype):
    """A one-token budget prefills token by token: a cut at every offset of the first two chunks."""
    model = _model(dtype)
    engine = RZEngine(model, EngineConfig(max_len=192, max_batch_tokens=1, num_threads=1))
    prompts = _prompts([131])
    outs = generate_batch(engine, prompts, _params(1, max_tokens=5))
    _assert_equal(model, prompts, outs)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_preemption_recomputes_the_recurrent_state_exactly(dtype):
    model = _model(dtype)
    page = model.kv_page_bytes()
    # 7 pages (one the scratch page) for 4 sequences of 2-3 pages: the newest are preempted and recompute
    engine = RZEngine(model, EngineConfig(max_len=192, max_batch_tokens=48, kv_cache_bytes=7 * page))
    prompts = _prompts([70, 100, 90, 60], seed=3)
    outs = generate_batch(engine, prompts, _params(4, max_tokens=40))
    assert engine.stats()["preemptions"] > 0
    _assert_equal(model, prompts, outs)


def test_prefix_reuse_takes_the_state_snapshots_of_whole_pages_exactly():
    model = _model()
    # one 150-token prefill call completes chunks 0 and 1: both snapshots must be kept (the third prompt
    # resumes from page 0's)
    engine = RZEngine(model, EngineConfig(max_len=256, max_batch_tokens=200, num_threads=1))
    (base,) = _prompts([150], seed=4)
    first = generate_batch(engine, [base], _params(1))
    # the same prompt again (cached pages of a finished sequence) and a longer one sharing 150 tokens
    prompts = [base, base + first[0].tokens[:5], base[:100] + _prompts([30], seed=5)[0]]
    outs = generate_batch(engine, prompts, _params(3))
    stats = engine.stats()
    assert stats["prefix_tokens_reused"] >= 128 + 64  # whole pages by reference, a partial page copied
    _assert_equal(model, [base, *prompts], [*first, *outs])


def test_a_weight_update_recomputes_running_sequences_with_the_new_weights():
    model = _model()
    new = _model(seed=1)
    engine = RZEngine(model, EngineConfig(max_len=256, max_batch_tokens=40, num_threads=1))
    prompts = _prompts([70, 5, 100], seed=6)

    async def run():
        tasks = [
            asyncio.ensure_future(engine.generate(p, q)) for p, q in zip(prompts, _params(3, 24), strict=True)
        ]
        while engine.counters["generated_tokens"] < 12:
            await asyncio.sleep(0)
        engine.load_weights(new.state_dict(), version=1)
        return await asyncio.gather(*tasks)

    outs = asyncio.run(run())
    learner = _learner_logprobs(new, prompts, outs)
    seen = 0
    for o, lp in zip(outs, learner, strict=True):
        after = torch.tensor([v == 1 for v in o.versions])
        seen += int(after.sum())
        assert torch.equal(o.logprobs[after], lp[after])
    assert seen > 0


def test_negative_control_the_standard_op_set_in_the_engine_differs():
    model = _model()
    engine_model = _model(kernels="standard")
    engine = RZEngine(engine_model, EngineConfig(max_len=256, max_batch_tokens=37, num_threads=1))
    prompts = _prompts([3, 65, 130], seed=7)
    outs = generate_batch(engine, prompts, _params(3))
    learner = _learner_logprobs(model, prompts, outs)
    assert any(not torch.equal(o.logprobs, lp) for o, lp in zip(outs, learner, strict=True))


def test_negative_control_transformers_chunked_kda_in_the_learner_differs(monkeypatch):
    """The reference's chunked KDA (its own grid from each call's first token, padded to 64) in the
    learner: close to the engine's tokens, not bit-identical."""
    hf = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")

    def reference_delta_rule(q, k, v, g, beta, seq_lens, caches=None, keep_caches=False, scale=None, **_):
        outs, start = [], 0
        for n in seq_lens:
            part = [x[start : start + n].unsqueeze(0) for x in (q, k, v, g, beta)]
            out, _ = hf.chunk_kimi_delta_attention(*part, output_final_state=False)
            outs.append(out[0].to(q.dtype))
            start += n
        return torch.cat(outs), None

    model = _model()
    engine = RZEngine(_model(), EngineConfig(max_len=256, max_batch_tokens=37, num_threads=1))
    prompts = _prompts([65, 130], seed=8)
    outs = generate_batch(engine, prompts, _params(2))
    aligned = model.ops
    monkeypatch.setattr(
        type(model),
        "ops_for",
        lambda self, device: dataclasses.replace(aligned, delta_rule=reference_delta_rule),
    )
    learner = _learner_logprobs(model, prompts, outs)
    diffs = [(o.logprobs - lp).abs().max().item() for o, lp in zip(outs, learner, strict=True)]
    assert max(diffs) > 0.0 and max(diffs) < 1e-3


def test_the_moe_router_never_flips_between_the_packed_forward_cut_prefill_and_decode(monkeypatch):
    """Every MoE layer's expert choice for a token is the same in the learner's packed forward (next to
    another sequence) as in a prefill cut inside a chunk followed by one-token decode."""
    model = _model()
    seen: list[torch.Tensor] = []
    route = DeepseekMoE.route

    def recording(self, x, ops):
        weights, experts = route(self, x, ops)
        seen.append(experts)
        return weights, experts

    monkeypatch.setattr(DeepseekMoE, "route", recording)
    seq, other = (torch.tensor(p) for p in _prompts([100, 100], seed=9))
    layers = sum(isinstance(m, DeepseekMoE) for m in model.modules())

    def experts_of(tokens, lens, states=None, rows=slice(None)):  # [layers, rows, k] of one call
        seen.clear()
        model(tokens, seq_lens=lens, states=states)
        return torch.stack([e[rows] for e in seen])

    with torch.no_grad():
        packed = experts_of(torch.cat([other[:7], seq]), [7, 100], rows=slice(7, None))
        state, state_other = SequenceState(), SequenceState()
        calls = [experts_of(seq[:41], [41], [state]), experts_of(seq[41:70], [29], [state])]
        for i in range(70, 100):
            step = torch.stack([seq[i], other[i]])
            calls.append(experts_of(step, [1, 1], [state, state_other], rows=slice(0, 1)))
    assert packed.shape[:2] == (layers, 100) and layers == 3
    assert torch.equal(torch.cat(calls, 1), packed)
