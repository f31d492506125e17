"""The short causal depthwise conv of Gated DeltaNet layers in Triton (the op set's `causal_conv1d`).

One program per (token, channel block): out[t, c] = sum_j weight[c, j] * x[t - K + 1 + j, c] as K fp32
multiply-adds in the fixed order j = 0..K-1 (the CPU kernel's recipe, rz_kernels.causal_conv), then SiLU.
A token reads its K inputs from one buffer of each sequence's window followed by its new tokens, so its
arithmetic is the same in a packed training forward, a prefill cut anywhere and a one-token decode; nothing
depends on the other tokens of the call. Backward: autograd through the torch form (recompute.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from rz_kernels.causal_conv import causal_conv1d as torch_causal_conv1d
from rz_kernels.triton_ops.recompute import with_reference_backward

# Channels per program (Qwen3.5's conv runs over 2 * key_dim + value_dim channels, 8k+).
CONV_BLOCK = 256


@triton.jit(do_not_specialize=["T"])
def _causal_conv_kernel(
    xs_ptr, src_ptr, w_ptr, out_ptr, T, CH, K: tl.constexpr, SILU: tl.constexpr, BLOCK: tl.constexpr
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < CH
    first = tl.load(src_ptr + t).to(tl.int64)  # the buffer row of the token's first tap (t - K + 1)
    x = tl.load(xs_ptr + first * CH + cols, mask=mask, other=0.0).to(tl.float32)
    acc = x * tl.load(w_ptr + cols * K, mask=mask, other=0.0)
    for j in tl.static_range(1, K):  # fixed tap order
        x = tl.load(xs_ptr + (first + j) * CH + cols, mask=mask, other=0.0).to(tl.float32)
        acc = acc + x * tl.load(w_ptr + cols * K + j, mask=mask, other=0.0)
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(out_ptr + t * CH + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _buffer(x, kw, seq_lens, windows):
    """Each sequence's window then its new tokens, stacked, and each token's first-tap row in it."""
    ch = x.shape[1]
    parts, src, kept = [], [], []
    row, start = 0, 0
    for n, win in zip(seq_lens, windows, strict=True):
        win = x.new_zeros(kw - 1, ch) if win is None else win.to(x.dtype)
        seg = torch.cat([win, x[start : start + n]])
        parts.append(seg)
        kept.append(seg[seg.shape[0] - (kw - 1) :].detach())
        src.append(torch.arange(row, row + n, dtype=torch.int32))
        row += seg.shape[0]
        start += n
    return torch.cat(parts).contiguous(), torch.cat(src).to(x.device), kept


def _forward(x, weight, seq_lens, windows, silu):
    t, ch = x.shape
    kw = weight.shape[-1]
    xs, src, kept = _buffer(x, kw, seq_lens, windows)
    out = torch.empty(t, ch, dtype=x.dtype, device=x.device)
    if t:
        w = weight.reshape(ch, kw).float().contiguous()
        grid = (t, triton.cdiv(ch, CONV_BLOCK))
        _causal_conv_kernel[grid](xs, src, w, out, t, ch, K=kw, SILU=silu, BLOCK=CONV_BLOCK)
    return out, kept


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: Sequence[int],
    windows: Sequence[torch.Tensor | None] | None = None,
    silu: bool = True,
    keep_windows: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """Causal depthwise conv (then SiLU if `silu`) over packed sequences; the interface of
    rz_kernels.causal_conv.causal_conv1d (x [T, Ch], weight [Ch, K] or [Ch, 1, K], windows [K - 1, Ch])."""
    if sum(seq_lens) != x.shape[0]:
        raise ValueError(f"seq_lens add up to {sum(seq_lens)} tokens, the input has {x.shape[0]}")
    windows = list(windows) if windows is not None else [None] * len(seq_lens)
    if len(windows) != len(seq_lens):
        raise ValueError(f"{len(windows)} windows for {len(seq_lens)} sequences")
    lens, wins = list(seq_lens), windows

    def fast(x, weight):
        return _forward(x, weight, lens, wins, silu)[0]

    def reference(x, weight):
        return torch_causal_conv1d(x, weight, lens, wins, silu=silu)[0]

    if keep_windows:
        out, kept = _forward(x, weight, lens, wins, silu)
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            out = with_reference_backward(fast, reference, (x, weight))
        return out, kept
    return with_reference_backward(fast, reference, (x, weight)), None
