"""DeepSeek-V4's compressor pooling in Triton: one program per (window, channel block).

The CPU kernel's recipe (rz_kernels.window_pool.aligned_pool): per channel, the exact max of the window's
gates, the sum of exp(gate - max) over the slots in slot order, then the slots' values weighted by the
softmax (rounded to kv's dtype) added in slot order, each product and partial sum rounded to kv's dtype as
torch's elementwise ops do. An entry's bits depend on its own window alone, never on the call's other
windows. Backward: autograd through the torch form (recompute.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rz_kernels.triton_ops.recompute import with_reference_backward
from rz_kernels.window_pool import aligned_pool as torch_aligned_pool

# Channels per program.
POOL_BLOCK = 128


@triton.jit(do_not_specialize=["N", "R"])
def _window_pool_kernel(kv_ptr, gate_ptr, out_ptr, N, R, D, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    base = n * R * D + cols
    top = tl.full([BLOCK], float("-inf"), tl.float32)
    for j in range(0, R):
        top = tl.maximum(top, tl.load(gate_ptr + base + j * D, mask=mask, other=0.0).to(tl.float32))
    total = tl.zeros([BLOCK], tl.float32)
    for j in range(0, R):  # slot order
        total += tl.exp(tl.load(gate_ptr + base + j * D, mask=mask, other=0.0).to(tl.float32) - top)
    dt = out_ptr.dtype.element_ty
    out = tl.zeros([BLOCK], tl.float32)
    for j in range(0, R):  # slot order; 0 + the first product is that product exactly
        e = tl.exp(tl.load(gate_ptr + base + j * D, mask=mask, other=0.0).to(tl.float32) - top)
        p = (e / total).to(dt).to(tl.float32)
        kv = tl.load(kv_ptr + base + j * D, mask=mask, other=0.0).to(tl.float32)
        out = (out + (kv * p).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    tl.store(out_ptr + n * D + cols, out.to(dt), mask=mask)


def _forward(kv: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    n, r, d = kv.shape
    out = torch.empty(n, d, dtype=kv.dtype, device=kv.device)
    if n and r:
        grid = (n, triton.cdiv(d, POOL_BLOCK))
        _window_pool_kernel[grid](kv.contiguous(), gate.float().contiguous(), out, n, r, d, BLOCK=POOL_BLOCK)
    return out


def aligned_pool(kv: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Entries [N, D] of windows kv, gate [N, R, D]; the interface of rz_kernels.window_pool.aligned_pool."""
    if kv.shape != gate.shape:
        raise ValueError(f"kv {tuple(kv.shape)} and gate {tuple(gate.shape)} must have one shape [N, R, D]")
    return with_reference_backward(_forward, torch_aligned_pool, (kv, gate))
