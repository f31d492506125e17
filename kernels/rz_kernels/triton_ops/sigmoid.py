"""Row-wise sigmoid in Triton: DeepSeek-V3's router scores (the Triton op set's `sigmoid_route`).

One program per row (token) over a block fixed by the row length, fp32 in and out: a row's values never depend
on how many rows the call has. The backward is the plain PyTorch formula (gradients are not part of the
bit-identity contract). Routing itself (grouped top-k) is rz_kernels.grouped_route, shared by every op set.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rz_kernels.grouped_route import make_sigmoid_route


@triton.jit(do_not_specialize=["R"])
def _sigmoid_kernel(x_ptr, out_ptr, R, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + cols, 1.0 / (1.0 + tl.exp(-x)), mask=mask)


def _sigmoid_forward(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n).float().contiguous()
    out = torch.empty_like(x2)
    if x2.shape[0]:
        _sigmoid_kernel[(x2.shape[0],)](x2, out, x2.shape[0], n, BLOCK=triton.next_power_of_2(n))
    return out.view(x.shape)


class _Sigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = _sigmoid_forward(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (s,) = ctx.saved_tensors
        return grad_out * s * (1 - s)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """fp32 sigmoid of x [..., N], one program per row."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _Sigmoid.apply(x)
    return _sigmoid_forward(x)


sigmoid_route = make_sigmoid_route(sigmoid)
