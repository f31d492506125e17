"""The aligned gated delta rule: one chunk grid from the sequence start, so a packed forward, a prefill cut
at any offset, one-token decode and any batch give every token the same bits (fp32 and bf16), close to
transformers' chunked reference; the reference's per-call chunking is shown to differ (negative control)."""

import pytest
import torch

from rz_kernels.delta_rule import CHUNK, DeltaRuleCache, gated_delta_rule, l2_normalize

# Many small GEMMs: one intra-op thread (OpenMP barriers stall on shared cores; see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

H, DK, DV = 2, 16, 8


def _inputs(seed: int, t: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(t, H, DK, generator=gen))
    k = l2_normalize(torch.randn(t, H, DK, generator=gen))
    v = torch.randn(t, H, DV, generator=gen)
    g = -0.3 * torch.rand(t, H, generator=gen)  # log decay, as -exp(A_log) * softplus(.)
    beta = torch.rand(t, H, generator=gen)
    return tuple(x.to(dtype) for x in (q, k, v, g, beta))


def _run(xs, lens, caches=None):
    return gated_delta_rule(*xs, lens, caches, keep_caches=True)


def _cut(xs, a, b):
    return tuple(x[a:b] for x in xs)


def _recurrent(q, k, v, g, beta):
    """The recurrence in fp64 (the definition the chunked form computes)."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    s = torch.zeros(H, DK, DV, dtype=torch.float64)
    out = []
    for t in range(q.shape[0]):
        s = s * g[t].exp()[:, None, None]
        delta = (v[t] - torch.einsum("hkv,hk->hv", s, k[t])) * beta[t][:, None]
        s = s + k[t][:, :, None] * delta[:, None, :]
        out.append(torch.einsum("hkv,hk->hv", s, q[t] * DK**-0.5))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_cut_at_every_offset_within_a_chunk_equals_the_full_forward(dtype):
    t = 2 * CHUNK + 21
    xs = _inputs(0, t, dtype)
    full, (cache_full,) = _run(xs, [t])
    assert full.dtype == dtype
    for cut in range(CHUNK, 2 * CHUNK + 1):  # every offset within chunk 1, both ends included
        first, (cache,) = _run(_cut(xs, 0, cut), [cut])
        rest, (cache_end,) = _run(_cut(xs, cut, t), [t - cut], [cache])
        assert torch.equal(torch.cat([first, rest]), full), cut
        assert torch.equal(cache_end.state, cache_full.state) and cache_end.pending == t % CHUNK


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_token_by_token_equals_the_full_forward(dtype):
    t = CHUNK + 40
    xs = _inputs(1, t, dtype)
    full, _ = _run(xs, [t])
    cache, rows = None, []
    for i in range(t):
        out, (cache,) = _run(_cut(xs, i, i + 1), [1], [cache])
        rows.append(out)
    assert torch.equal(torch.cat(rows), full)
    # and a decode after an uneven prefill (37 tokens, then 3 at a time)
    out, (cache,) = _run(_cut(xs, 0, 37), [37])
    rows = [out]
    for i in range(37, t, 3):
        out, (cache,) = _run(_cut(xs, i, min(i + 3, t)), [min(i + 3, t) - i], [cache])
        rows.append(out)
    assert torch.equal(torch.cat(rows), full)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sequence_gets_the_same_bits_in_any_batch(dtype):
    lens = [CHUNK + 9, 5, 2 * CHUNK + 33, CHUNK, 70, 1, 130]
    xs = _inputs(2, sum(lens), dtype)
    starts = [sum(lens[:i]) for i in range(len(lens))]
    alone = [_run(_cut(xs, a, a + n), [n])[0] for a, n in zip(starts, lens, strict=True)]
    for batch in range(1, len(lens) + 1):
        packed, caches = _run(_cut(xs, 0, sum(lens[:batch])), lens[:batch])
        assert torch.equal(packed, torch.cat(alone[:batch])), batch
    # a decode step of several sequences at different chunk offsets, next to a prefill chunk
    _, caches = _run(xs, lens)
    more = _inputs(3, 4 + 50, dtype)
    step, _ = _run(more, [1, 1, 50, 1, 1, 0, 0], caches)
    for i, (a, b) in enumerate([(0, 1), (1, 2), (2, 52), (52, 53), (53, 54)]):
        one, _ = _run(_cut(more, a, b), [b - a], [caches[i]])
        assert torch.equal(step[a:b], one), i


def test_matches_the_recurrence():
    t = 3 * CHUNK + 7
    xs = _inputs(4, t)
    out, _ = _run(xs, [t])
    assert (out.double() - _recurrent(*xs)).abs().max() < 1e-5


def test_cache_of_a_fresh_sequence_is_the_empty_cache():
    xs = _inputs(5, 10)
    a, _ = _run(xs, [10])
    b, _ = _run(xs, [10], [DeltaRuleCache.empty(H, DK, DV)])
    assert torch.equal(a, b)


def test_bad_lengths_are_refused_with_a_clear_error():
    xs = _inputs(6, 10)
    with pytest.raises(ValueError, match="seq_lens add up to 9"):
        gated_delta_rule(*xs, [4, 5])


def test_gradients_flow_through_the_aligned_forward():
    xs = [x.clone().requires_grad_(True) for x in _inputs(7, CHUNK + 5)]
    out, _ = gated_delta_rule(*xs, [40, CHUNK - 35])
    out.square().sum().backward()
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in xs)


# -- against transformers' pure-torch reference --------------------------------------------------------------
def _hf():
    return pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


def _hf_chunk(xs, state=None):
    """transformers' torch_chunk_gated_delta_rule on [T, H, *] inputs (batch of one), chunked per call."""
    q, k, v, g, beta = (x.unsqueeze(0) for x in xs)
    out, final = _hf().torch_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=False
    )
    return out[0], final


def test_close_to_transformers_chunked_reference():
    t = 3 * CHUNK + 7
    xs = _inputs(8, t)
    ref, _ = _hf_chunk(xs)
    out, _ = _run(xs, [t])
    assert (out - ref).abs().max() <= 1e-5


def test_negative_control_the_reference_differs_when_cut_or_run_recurrently():
    t = 2 * CHUNK + 21
    xs = _inputs(9, t)
    full, _ = _hf_chunk(xs)
    first, state = _hf_chunk(_cut(xs, 0, 37))
    rest, _ = _hf_chunk(_cut(xs, 37, t), state)
    assert not torch.equal(torch.cat([first, rest]), full)  # per-call chunking moves the grid
    q, k, v, g, beta = (x.unsqueeze(0) for x in xs)
    rec, _ = _hf().torch_recurrent_gated_delta_rule(q, k, v, g, beta, None, False, False)
    assert not torch.equal(rec[0], full)  # the recurrent form rounds differently
    # ours, cut at the same place, is exact
    out, _ = _run(xs, [t])
    a, (c,) = _run(_cut(xs, 0, 37), [37])
    b, _ = _run(_cut(xs, 37, t), [t - 37], [c])
    assert torch.equal(torch.cat([a, b]), out)
