"""Gated DeltaNet's Triton kernels (causal conv, gated RMSNorm, the fixed-chunk-grid delta rule), run by the
interpreter: the engine's uses (prefill cut at any offset, one-token decode, any batch) give every token the
bits of the learner's packed forward, close to the CPU kernels; negative controls show the checks can fail."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_kernels import causal_conv as cpu_conv  # noqa: E402
from rz_kernels import delta_rule as cpu_delta  # noqa: E402
from rz_kernels import gated_norm as cpu_norm  # noqa: E402
from rz_kernels.delta_rule import CHUNK, l2_normalize  # noqa: E402
from rz_kernels.triton_ops import causal_conv, delta_rule, gated_norm  # noqa: E402

CH, KW = 40, 4


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


def _conv_inputs(seed, t, dtype):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(t, CH, generator=gen).to(dtype), torch.randn(CH, 1, KW, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_prefill_cuts_decode_and_batch_give_the_packed_forward_bits(dtype):
    x, w = _conv_inputs(0, 23, dtype)
    other, _ = _conv_inputs(1, 9, dtype)
    packed, _ = causal_conv.causal_conv1d(torch.cat([other, x]), w, [9, 23])  # the learner's pack
    full = packed[9:]
    torch.testing.assert_close(full, cpu_conv.causal_conv1d(x, w, [23])[0], **_tol(dtype))
    for cut in (1, 2, 3, 11):  # a prefill cut (inside and past the first window)
        a, (win,) = causal_conv.causal_conv1d(x[:cut], w, [cut], keep_windows=True)
        b, _ = causal_conv.causal_conv1d(x[cut:], w, [23 - cut], [win])
        assert torch.equal(torch.cat([a, b]), full), cut
    outs, (win,) = causal_conv.causal_conv1d(x[:5], w, [5], keep_windows=True)
    outs = [outs]
    for t in range(5, 23):  # decode, token by token, beside another sequence's prefill
        o, (_, win) = causal_conv.causal_conv1d(
            torch.cat([other, x[t : t + 1]]), w, [9, 1], [None, win], keep_windows=True
        )
        outs.append(o[9:])
    assert torch.equal(torch.cat(outs), full)
    # negative control: a cut that loses the window (the state) changes the bits
    b, _ = causal_conv.causal_conv1d(x[11:], w, [12])
    assert not torch.equal(b, full[11:])


def test_conv_gradients_follow_the_torch_form_and_bad_lengths_are_refused():
    x, w = _conv_inputs(2, 13, torch.float32)
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    xb, wb = x.clone().requires_grad_(), w.clone().requires_grad_()
    causal_conv.causal_conv1d(xa, wa, [6, 7])[0].square().sum().backward()
    cpu_conv.causal_conv1d(xb, wb, [6, 7])[0].square().sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad)
    torch.testing.assert_close(wa.grad, wb.grad)
    with pytest.raises(ValueError, match="add up to 12"):
        causal_conv.causal_conv1d(x, w, [6, 6])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_norm_rows_do_not_depend_on_the_batch_and_match_the_cpu_form(dtype):
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(37, 48, generator=gen) * 3).to(dtype)
    z = torch.randn(37, 48, generator=gen).to(dtype)
    w = (1 + 0.2 * torch.randn(48, generator=gen)).to(dtype)
    full = gated_norm.gated_rms_norm(x, z, w, 1e-6)
    assert full.dtype == dtype
    torch.testing.assert_close(full, cpu_norm.gated_rms_norm(x, z, w, 1e-6), **_tol(dtype))
    for i in (0, 17, 36):  # a decode row alone, and among other rows
        assert torch.equal(gated_norm.gated_rms_norm(x[i : i + 1], z[i : i + 1], w, 1e-6), full[i : i + 1])
        both = gated_norm.gated_rms_norm(
            torch.cat([x[:3], x[i : i + 1]]), torch.cat([z[:3], z[i : i + 1]]), w, 1e-6
        )
        assert torch.equal(both[3:], full[i : i + 1])
    # negative control: the norm reads its own row; another row's statistics change the bits
    swapped = gated_norm.gated_rms_norm(x[1:2], z[:1], w, 1e-6)
    assert not torch.equal(swapped, full[:1])


def test_gated_norm_with_an_fp32_weight_on_bf16_rows_and_gradients():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 32, generator=gen).bfloat16()
    z = torch.randn(5, 32, generator=gen).bfloat16()
    w = 1 + 0.2 * torch.randn(32, generator=gen)
    torch.testing.assert_close(
        gated_norm.gated_rms_norm(x, z, w, 1e-6), cpu_norm.gated_rms_norm(x, z, w, 1e-6)
    )
    xa, wa = x.float().requires_grad_(), w.clone().requires_grad_()
    xb, wb = x.float().requires_grad_(), w.clone().requires_grad_()
    gated_norm.gated_rms_norm(xa, z.float(), wa, 1e-6).sum().backward()
    cpu_norm.gated_rms_norm(xb, z.float(), wb, 1e-6).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad)
    torch.testing.assert_close(wa.grad, wb.grad)


# --- the delta rule ---------------------------------------------------------------------------------------
H, DK, DV = 2, 16, 16


def _dr_inputs(seed, t, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(t, H, DK, generator=gen))
    k = l2_normalize(torch.randn(t, H, DK, generator=gen))
    v = torch.randn(t, H, DV, generator=gen)
    g = -0.3 * torch.rand(t, H, generator=gen)  # log decay, as -exp(A_log) * softplus(.)
    beta = torch.rand(t, H, generator=gen)
    return tuple(x.to(dtype) for x in (q, k, v, g, beta))


def _cut(xs, a, b):
    return tuple(x[a:b] for x in xs)


def _cat(*parts):
    return tuple(torch.cat(p) for p in zip(*parts, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_delta_rule_engine_uses_give_the_learner_packed_bits(dtype):
    t = CHUNK + 13
    xs, other = _dr_inputs(0, t, dtype), _dr_inputs(1, 9, dtype)
    packed, _ = delta_rule.gated_delta_rule(*_cat(other, xs), [9, t])  # the learner's pack
    full = packed[9:]
    assert full.dtype == dtype
    ref, (cpu_cache,) = cpu_delta.gated_delta_rule(*xs, [t], keep_caches=True)
    torch.testing.assert_close(full, ref, **_tol(dtype))
    for cut in (5, CHUNK, CHUNK + 7):  # prefill cuts inside chunk 0, on the boundary, inside chunk 1
        a, (c,) = delta_rule.gated_delta_rule(*_cut(xs, 0, cut), [cut], keep_caches=True)
        b, (end,) = delta_rule.gated_delta_rule(*_cut(xs, cut, t), [t - cut], [c], keep_caches=True)
        assert torch.equal(torch.cat([a, b]), full), cut
        assert end.pending == t % CHUNK and len(c.completed) + len(end.completed) == 1
        torch.testing.assert_close(end.state, cpu_cache.state, rtol=1e-4, atol=1e-4)
    # decode token by token after a 60-token prefill, beside another sequence: crosses the chunk boundary
    outs, (c,) = delta_rule.gated_delta_rule(*_cut(xs, 0, 60), [60], keep_caches=True)
    outs = [outs]
    for i in range(60, t):
        o, (_, c) = delta_rule.gated_delta_rule(
            *_cat(other, _cut(xs, i, i + 1)), [9, 1], [None, c], keep_caches=True
        )
        outs.append(o[9:])
    assert torch.equal(torch.cat(outs), full)


def test_delta_rule_negative_control_a_grid_anchored_at_the_call_start_differs():
    """The same kernel with the chunk grid restarted at a prefill cut (the reference's per-call chunking):
    the state after the first 37 tokens as if they closed a chunk (zero-padded: k = v = g = beta = 0 leaves
    the state unchanged), then the rest as a fresh grid: close to the anchored result, not bit-identical."""
    t = CHUNK + 13
    xs = _dr_inputs(2, t)
    full, _ = delta_rule.gated_delta_rule(*xs, [t])
    pad = tuple(torch.zeros_like(x[: CHUNK - 37]) for x in xs)
    a, (c,) = delta_rule.gated_delta_rule(*_cat(_cut(xs, 0, 37), pad), [CHUNK], keep_caches=True)
    b, _ = delta_rule.gated_delta_rule(*_cut(xs, 37, t), [t - 37], [c])
    moved = torch.cat([a[:37], b])
    torch.testing.assert_close(moved, full, rtol=1e-4, atol=1e-4)
    assert not torch.equal(moved, full)


def test_delta_rule_gradients_follow_the_torch_form_and_bad_inputs_are_refused():
    xs = _dr_inputs(3, 21)
    a = [x.clone().requires_grad_() for x in xs]
    b = [x.clone().requires_grad_() for x in xs]
    out, caches = delta_rule.gated_delta_rule(*a, [12, 9])
    assert caches is None
    out.square().sum().backward()
    cpu_delta.gated_delta_rule(*b, [12, 9])[0].square().sum().backward()
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.grad, y.grad)
    with pytest.raises(ValueError, match="add up to 20"):
        delta_rule.gated_delta_rule(*xs, [12, 8])
