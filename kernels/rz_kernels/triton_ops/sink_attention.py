"""DeepSeek-V4's attention with a per-head sink in Triton: one program per (query, head).

A query's key set is the CPU kernel's (rz_kernels.sink_attention): the sliding window's W slots and C
compressed entries, each with a visibility mask, one shared K = V head, and the head's sink logit (its value
is zero). Two passes over the keys in fixed blocks of BLOCK_K anchored at key index 0: the exact max, then the
sum of exp(score - max) and the exp-weighted values, the blocks added in index order. A block past the
query's visible entries adds exact zeros (max unchanged, +0.0 to every sum), so a query gets the same bits
whether the call pads its compressed group to 5 entries or 500: the learner's packed forward (every row
padded to the batch's widest) and the engine's decode (its own entries) agree. Scores are fp32 dot products
rounded to q's dtype, as the CPU form's are; the softmax is fp32. Backward: autograd through the torch form.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rz_kernels.sink_attention import aligned_sink_attention as torch_sink_attention
from rz_kernels.triton_ops.recompute import with_reference_backward

BLOCK_K = 16  # keys per step (a [BLOCK_K, head_dim] tile)


@triton.jit
def _block_scores(q, k_ptr, ok_ptr, t, n, N, D, scale, dcols, BLOCK: tl.constexpr):
    """Scores of keys n..n + BLOCK of one row (-inf where invisible or past N) and the keys tile."""
    idx = n + tl.arange(0, BLOCK)
    inside = idx < N
    keys = tl.load(
        k_ptr + (t * N + idx[:, None]) * D + dcols[None, :],
        mask=inside[:, None] & (dcols < D)[None, :],
        other=0.0,
    )
    ok = tl.load(ok_ptr + t * N + idx, mask=inside, other=0) != 0
    s = tl.sum(keys.to(tl.float32) * q[None, :], axis=1).to(keys.dtype).to(tl.float32) * scale
    return tl.where(ok & inside, s, float("-inf")), keys


@triton.jit(do_not_specialize=["T", "C"])
def _sink_attention_kernel(
    q_ptr, sl_ptr, sl_ok_ptr, c_ptr, c_ok_ptr, sink_ptr, out_ptr, T, H, W, C, D, scale,
    BLOCK: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    dcols = tl.arange(0, BD)
    dmask = dcols < D
    q = tl.load(q_ptr + (t * H + h) * D + dcols, mask=dmask, other=0.0).to(tl.float32)
    sink = tl.load(sink_ptr + h).to(tl.float32)
    top = sink
    for n in range(0, W, BLOCK):
        s, _ = _block_scores(q, sl_ptr, sl_ok_ptr, t, n, W, D, scale, dcols, BLOCK)
        top = tl.maximum(top, tl.max(s, axis=0))
    for n in range(0, C, BLOCK):
        s, _ = _block_scores(q, c_ptr, c_ok_ptr, t, n, C, D, scale, dcols, BLOCK)
        top = tl.maximum(top, tl.max(s, axis=0))
    total = tl.exp(sink - top)
    acc = tl.zeros([BD], tl.float32)
    dt = out_ptr.dtype.element_ty
    for n in range(0, W, BLOCK):
        s, keys = _block_scores(q, sl_ptr, sl_ok_ptr, t, n, W, D, scale, dcols, BLOCK)
        e = tl.exp(s - top)
        total += tl.sum(e, axis=0)
        acc += tl.sum(e.to(dt).to(tl.float32)[:, None] * keys.to(tl.float32), axis=0)
    for n in range(0, C, BLOCK):
        s, keys = _block_scores(q, c_ptr, c_ok_ptr, t, n, C, D, scale, dcols, BLOCK)
        e = tl.exp(s - top)
        total += tl.sum(e, axis=0)
        acc += tl.sum(e.to(dt).to(tl.float32)[:, None] * keys.to(tl.float32), axis=0)
    tl.store(out_ptr + (t * H + h) * D + dcols, (acc / total).to(dt), mask=dmask)


def _forward(q, slide, comp, sinks, slide_ok, comp_ok, scale, block):
    t, h, d = q.shape
    out = torch.empty_like(q)
    if t:
        _sink_attention_kernel[(t, h)](
            q.contiguous(), slide.contiguous(), slide_ok.to(torch.int8).contiguous(), comp.contiguous(),
            comp_ok.to(torch.int8).contiguous(), sinks.float().contiguous(), out, t, h, slide.shape[1],
            comp.shape[1], d, float(scale), BLOCK=BLOCK_K, BD=triton.next_power_of_2(d),
        )  # fmt: skip
    return out


def _reference(q, slide, comp, sinks, slide_ok, comp_ok, scale, block):
    return torch_sink_attention(q, slide, slide_ok, comp, comp_ok, sinks, scale, block)


def aligned_sink_attention(
    q: torch.Tensor,
    slide: torch.Tensor,
    slide_ok: torch.Tensor,
    comp: torch.Tensor,
    comp_ok: torch.Tensor,
    sinks: torch.Tensor,
    scale: float,
    block: int | None,
) -> torch.Tensor:
    """Attention output [T, H, D] in q's dtype; the interface of rz_kernels.sink_attention's aligned form
    (`block` is accepted for it: this kernel's blocks are BLOCK_K keys from key 0, for both groups)."""
    return with_reference_backward(
        _forward, _reference, (q, slide, comp, sinks),
        slide_ok=slide_ok, comp_ok=comp_ok, scale=scale, block=block,
    )  # fmt: skip
