"""Qwen3.5's gated RMSNorm in Triton (the op set's `gated_rms_norm`), one program per row.

The rounding steps of the CPU kernel (rz_kernels.gated_norm): normalized in fp32, cast to x's dtype, scaled by
the weight (rounded to the promoted dtype of weight and x, as torch's multiply does), gated by silu(gate) in
fp32, cast back to x's dtype. The row is reduced by one tl.sum over one block fixed by the row length, so a
row's bits never depend on the other rows of the call. Backward: autograd through the torch form.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rz_kernels.gated_norm import gated_rms_norm as torch_gated_rms_norm
from rz_kernels.triton_ops.recompute import with_reference_backward

_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit(do_not_specialize=["R"])
def _gated_rms_norm_kernel(x_ptr, g_ptr, w_ptr, out_ptr, R, N, eps, MID: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    h = (xf * tl.math.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)).to(x.dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    mid = (w * h.to(tl.float32)).to(MID)
    gf = tl.load(g_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    out = mid.to(tl.float32) * (gf / (1.0 + tl.exp(-gf)))
    tl.store(out_ptr + row * N + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _forward(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    g2 = gate.reshape(-1, n).contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        mid = _TL_DTYPES[torch.promote_types(weight.dtype, x.dtype)]
        _gated_rms_norm_kernel[(x2.shape[0],)](
            x2, g2, weight.contiguous(), out, x2.shape[0], n, eps, MID=mid, BLOCK=triton.next_power_of_2(n)
        )
    return out


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`weight * rms_norm(x) * silu(gate)` per row; the interface of rz_kernels.gated_norm.gated_rms_norm."""
    if gate.shape != x.shape:
        raise ValueError(f"gate shape {tuple(gate.shape)} differs from x's {tuple(x.shape)}")
    return with_reference_backward(_forward, torch_gated_rms_norm, (x, gate, weight), eps=eps)
