"""Qwen3.5 (Gated DeltaNet + gated attention) in the engine: every sampled token's log-prob equals the
learner's packed forward bit for bit (torch.equal), with the recurrent state in the engine's pages, under
batch sizes 1..N, chunked prefill cut at every offset inside a 64-token chunk, static decode, preemption,
prefix reuse and a weight update, in fp32 and bf16; and the negative controls (the standard op set in the
engine, transformers' chunked delta rule in the learner) differ."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, generate_batch
from rz_agents.model.policy import PolicySpec, build_policy
from rz_agents.model.qwen3_5 import SequenceState
from rz_kernels.delta_rule import DeltaRuleCache
from tests.engine.engine_alignment import (
    assert_equal_to_learner as _assert_equal,
)
from tests.engine.engine_alignment import (
    assert_update_recomputes_exactly,
    random_prompts,
    seeded_params,
)
from tests.engine.engine_alignment import learner_logprobs as _learner_logprobs

VOCAB = 96


def _model(dtype: str = "float32", seed: int = 0, kernels: str = "aligned"):
    """A tiny random Qwen3.5 (3 Gated DeltaNet layers, 1 full attention) with sharp logits (weights std 0.3,
    the LM head's x3): flat logits would hide errors."""
    model = build_policy(PolicySpec(model_type="qwen3_5", vocab_size=VOCAB, dtype=dtype, kernels=kernels))
    model.reset_parameters(std=0.3, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(3)
        for name, p in model.named_parameters():
            if name.endswith("A_log"):  # slow decay (A 0.005..0.05): the state carries across chunks
                p.copy_(torch.empty(p.shape).uniform_(0.005, 0.05, generator=gen).log())
    return model.eval()


def _prompts(lengths, seed=0):
    return random_prompts(lengths, VOCAB, seed)


def _params(n, max_tokens=12):
    return seeded_params(n, max_tokens)


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
    assert_update_recomputes_exactly(engine, new, _prompts([70, 5, 100], seed=6), _params(3, 24), 12)


def test_negative_control_the_standard_op_set_in_the_engine_differs():
    model = _model()
    engine_model = _model(kernels="standard")
    engine = RZEngine(engine_model, EngineConfig(max_len=256, max_batch_tokens=37, num_threads=1))
    prompts = _prompts([3, 65, 130], seed=7)
    outs = generate_batch(engine, prompts, _params(3))
    learner = _learner_logprobs(model, prompts, outs)
    assert any(not torch.equal(o.logprobs, lp) for o, lp in zip(outs, learner, strict=True))


def test_negative_control_transformers_chunked_delta_rule_in_the_learner_differs(monkeypatch):
    """The reference's chunked path (its own grid from each call's first token, padded to 64) in the
    learner: close to the engine's tokens, not bit-identical."""
    hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

    def reference_delta_rule(q, k, v, g, beta, seq_lens, caches=None, keep_caches=False, scale=None, **_):
        outs, start = [], 0
        for n in seq_lens:
            part = [x[start : start + n].unsqueeze(0) for x in (q, k, v, g, beta)]
            out, _ = hf.torch_chunk_gated_delta_rule(*part, output_final_state=False)
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
