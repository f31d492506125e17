"""The aligned short causal conv and gated RMSNorm of Gated DeltaNet layers: a token's bits do not depend on
how the sequence is cut or batched; both agree with transformers' Qwen3.5 forms to rounding."""

import pytest
import torch

from rz_kernels.causal_conv import causal_conv1d
from rz_kernels.gated_norm import gated_rms_norm

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CH, K = 24, 4


def _conv_case(seed, t, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(t, CH, generator=gen).to(dtype), torch.randn(CH, 1, K, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_cut_anywhere_decode_and_batch_give_the_full_forward_bits(dtype):
    t = 40
    x, w = _conv_case(0, t, dtype)
    full, (win_full,) = causal_conv1d(x, w, [t], keep_windows=True)
    for cut in range(0, t + 1):
        a, (win,) = causal_conv1d(x[:cut], w, [cut], keep_windows=True)
        b, (win_end,) = causal_conv1d(x[cut:], w, [t - cut], [win], keep_windows=True)
        assert torch.equal(torch.cat([a, b]), full) and torch.equal(win_end, win_full), cut
    win, rows = None, []
    for i in range(t):
        out, (win,) = causal_conv1d(x[i : i + 1], w, [1], [win], keep_windows=True)
        rows.append(out)
    assert torch.equal(torch.cat(rows), full)
    other, _ = _conv_case(1, 13, dtype)
    packed, _ = causal_conv1d(torch.cat([other, x, other[:2]]), w, [13, t, 2])
    assert torch.equal(packed[13 : 13 + t], full)


def test_conv_is_close_to_transformers_and_its_decode_update():
    hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    x, w = _conv_case(2, 50)
    ref = hf.causal_conv1d_fn(x.t().unsqueeze(0), w.squeeze(1), None, activation="silu")[0].t()
    out, _ = causal_conv1d(x, w, [50])
    assert (out - ref).abs().max() <= 1e-5
    # the reference's own decode update agrees with its prefill row to rounding as well
    state = x[46:49].t().unsqueeze(0).clone()
    step = hf.causal_conv1d_update(x[49:50].t().unsqueeze(0), state, w.squeeze(1), None, "silu")[0].t()
    assert (step - ref[49:50]).abs().max() <= 1e-5


def test_conv_refuses_lengths_that_do_not_match():
    x, w = _conv_case(3, 10)
    with pytest.raises(ValueError, match="seq_lens add up to 11"):
        causal_conv1d(x, w, [5, 6])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_norm_rows_do_not_depend_on_the_batch(dtype):
    gen = torch.Generator().manual_seed(4)
    x, z = (torch.randn(300, 32, generator=gen).to(dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(32, generator=gen)).to(dtype)
    full = gated_rms_norm(x, z, w, 1e-6)
    for rows in (1, 2, 7, 64, 129):
        assert torch.equal(gated_rms_norm(x[:rows], z[:rows], w, 1e-6), full[:rows])
    assert torch.equal(gated_rms_norm(x[299:], z[299:], w, 1e-6), full[299:])


def test_gated_norm_matches_transformers_rounding_steps():
    hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    gen = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16):
        x, z = (torch.randn(40, 32, generator=gen).to(dtype) for _ in range(2))
        norm = hf.Qwen3_5RMSNormGated(32, eps=1e-6).to(dtype)
        with torch.no_grad():
            norm.weight.copy_(1 + 0.1 * torch.randn(32, generator=gen))
            ref = norm(x, z)
        out = gated_rms_norm(x, z, norm.weight.detach(), 1e-6)
        tol = 1e-6 if dtype == torch.float32 else 1e-2
        assert (out.float() - ref.float()).abs().max() <= tol
        gated_off = gated_rms_norm(x, z * 1.01, norm.weight.detach(), 1e-6)
        assert not torch.equal(gated_off, out)  # the gate counts
