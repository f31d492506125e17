"""Kimi Delta Attention (the delta rule with a per-channel decay, g [T, H, dk]) on the Triton op set, run
by the interpreter: a token gets the learner's packed-forward bits in a prefill cut at any offset in a chunk,
any batch and one-token decode; close to the CPU kernel and to a float64 recurrence; the per-channel decay
is live (a scalar decay per head differs); a grid restarted at the cut differs (negative control).

The interpreter runs every program in Python (about a second per chunk and head here), so the production
grid (CHUNK = 64) is checked at chosen offsets, and every offset within a chunk on the same kernel and
wrapper compiled for a 16-token chunk (`small_chunk`: the grid's length is a parameter of both)."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_kernels import delta_rule as cpu_delta  # noqa: E402
from rz_kernels.delta_rule import CHUNK, l2_normalize  # noqa: E402
from rz_kernels.triton_ops import delta_rule, kda  # noqa: E402

H, DK, DV = 1, 16, 16


def _inputs(seed, t, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(t, H, DK, generator=gen))
    k = l2_normalize(torch.randn(t, H, DK, generator=gen))
    v = torch.randn(t, H, DV, generator=gen)
    # a log decay per key channel, from nearly none to fast: channels forget at very different rates
    g = -torch.rand(t, H, DK, generator=gen) * torch.linspace(0.01, 1.0, DK)
    beta = torch.rand(t, H, generator=gen)
    return tuple(x.to(dtype) for x in (q, k, v, g, beta))


def _cut(xs, a, b):
    return tuple(x[a:b] for x in xs)


def _cat(*parts):
    return tuple(torch.cat(p) for p in zip(*parts, strict=True))


def _run(xs, lens, caches=None):
    return delta_rule.gated_delta_rule(*xs, lens, caches, keep_caches=True)


def _recurrent64(q, k, v, g, beta):
    """The KDA recurrence in float64, token by token: S = Diag(exp(g_t)) S + k_t (beta_t (v_t - S^T k_t))^T
    with S decayed first, o_t = S^T q_t / sqrt(dk)."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    state = torch.zeros(H, DK, DV, dtype=torch.float64)
    outs = []
    for t in range(q.shape[0]):
        state = state * g[t].exp().unsqueeze(-1)
        err = v[t] - torch.einsum("hkv,hk->hv", state, k[t])
        state = state + torch.einsum("hk,hv->hkv", k[t], beta[t].unsqueeze(-1) * err)
        outs.append(torch.einsum("hkv,hk->hv", state, q[t]) * DK**-0.5)
    return torch.stack(outs)


@pytest.fixture
def small_chunk(monkeypatch):
    """The Triton wrapper and kernel on a 16-token chunk grid (the CPU kernel keeps its 64)."""
    monkeypatch.setattr(delta_rule, "CHUNK", 16)
    monkeypatch.setattr(kda, "CHUNK", 16)
    return 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kda_engine_uses_give_the_learner_packed_bits_on_the_production_grid(dtype):
    t = CHUNK + 3
    xs, other = _inputs(0, t, dtype), _inputs(1, 9, dtype)
    packed, _ = delta_rule.gated_delta_rule(*_cat(other, xs), [9, t])  # the learner's pack
    full = packed[9:]
    assert full.dtype == dtype
    ref, (cpu_cache,) = cpu_delta.gated_delta_rule(*xs, [t], keep_caches=True)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(full, ref, **tol)
    # prefill cuts inside chunk 0, at its last offset and on the boundary: three sequences in one batch
    cuts = (5, CHUNK - 1, CHUNK)
    heads, caches = _run(_cat(*(_cut(xs, 0, c) for c in cuts)), list(cuts))
    tails, ends = _run(_cat(*(_cut(xs, c, t) for c in cuts)), [t - c for c in cuts], caches)
    starts = [0, *torch.tensor(cuts).cumsum(0).tolist()]
    tail_starts = [0, *torch.tensor([t - c for c in cuts]).cumsum(0).tolist()]
    for i, c in enumerate(cuts):
        got = torch.cat([heads[starts[i] : starts[i + 1]], tails[tail_starts[i] : tail_starts[i + 1]]])
        assert torch.equal(got, full), c
        assert ends[i].pending == t % CHUNK and torch.equal(ends[i].state, ends[0].state)
    torch.testing.assert_close(ends[0].state, cpu_cache.state, rtol=1e-4, atol=1e-4)
    # one-token decode across the chunk boundary, alone (the prefill above ran beside another sequence)
    rows, (c,) = _run(_cut(xs, 0, CHUNK - 2), [CHUNK - 2])
    rows = [rows]
    for i in range(CHUNK - 2, t):
        o, (c,) = _run(_cut(xs, i, i + 1), [1], [c])
        rows.append(o)
    assert torch.equal(torch.cat(rows), full)


def test_kda_prefill_cut_at_every_offset_within_a_chunk_in_one_batch(small_chunk):
    t = small_chunk + 5
    xs, other = _inputs(2, t), _inputs(3, 7)
    packed, _ = delta_rule.gated_delta_rule(*_cat(other, xs), [7, t])
    full = packed[7:]
    cuts = list(range(1, small_chunk + 1))  # a cut at every offset of chunk 0, the sequences in one batch
    heads, caches = _run(_cat(*(_cut(xs, 0, c) for c in cuts)), cuts)
    tails, _ = _run(_cat(*(_cut(xs, c, t) for c in cuts)), [t - c for c in cuts], caches)
    a = b = 0
    for c in cuts:
        assert torch.equal(torch.cat([heads[a : a + c], tails[b : b + t - c]]), full), c
        a, b = a + c, b + t - c


def test_kda_one_token_decode_through_a_chunk_and_a_grid_restarted_at_a_cut_differs(small_chunk):
    t = small_chunk + 3
    xs = _inputs(6, t)
    full, _ = delta_rule.gated_delta_rule(*xs, [t])
    cache, rows = None, []
    for i in range(t):  # one-token decode from the first token: the pending chunk at every offset
        o, (cache,) = _run(_cut(xs, i, i + 1), [1], [cache])
        rows.append(o)
    assert torch.equal(torch.cat(rows), full)
    # negative control: the grid restarted at a cut (the first 9 tokens closed as a zero-padded chunk, the
    # rest a fresh grid: zero k, v, g, beta leave the state unchanged) is close, not bit-identical
    pad = tuple(torch.zeros_like(x[: small_chunk - 9]) for x in xs)
    first, (c,) = _run(_cat(_cut(xs, 0, 9), pad), [small_chunk])
    rest, _ = _run(_cut(xs, 9, t), [t - 9], [c])
    moved = torch.cat([first[:9], rest])
    torch.testing.assert_close(moved, full, rtol=1e-4, atol=1e-4)
    assert not torch.equal(moved, full)


def test_kda_is_close_to_a_float64_recurrence_and_its_channel_decay_is_live():
    t = CHUNK + 9
    xs = _inputs(4, t)
    out, _ = delta_rule.gated_delta_rule(*xs, [t])
    exact = _recurrent64(*xs)
    assert (out.double() - exact).abs().max() < 1e-5
    # the same decay averaged over the channels (the scalar kernel's input) gives another result
    q, k, v, g, beta = xs
    scalar, _ = delta_rule.gated_delta_rule(q, k, v, g.mean(-1), beta, [t])
    assert (scalar - out).abs().max() > 1e-2
    # and a decay equal across channels runs the channel kernel to the scalar kernel's result
    flat = g.mean(-1, keepdim=True).expand_as(g).contiguous()
    same, _ = delta_rule.gated_delta_rule(q, k, v, flat, beta, [t])
    torch.testing.assert_close(same, scalar, rtol=1e-5, atol=1e-5)


def test_kda_gradients_follow_the_torch_form_and_bad_decays_are_refused():
    xs = _inputs(5, 21)
    a = [x.clone().requires_grad_() for x in xs]
    b = [x.clone().requires_grad_() for x in xs]
    out, caches = delta_rule.gated_delta_rule(*a, [12, 9])
    assert caches is None
    out.square().sum().backward()
    cpu_delta.gated_delta_rule(*b, [12, 9])[0].square().sum().backward()
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.grad, y.grad)
    q, k, v, g, beta = xs
    with pytest.raises(ValueError, match=r"g has shape \(21, 1, 8\)"):
        delta_rule.gated_delta_rule(q, k, v, g[..., :8], beta, [21])
