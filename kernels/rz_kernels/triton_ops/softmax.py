"""Row softmax, log-softmax and log-softmax + gather in Triton, one program per row.

A row is walked in fixed BLOCK-wide column blocks: first its exact maximum (order-free), then the sum
of exp(x - max) accumulated lane-wise in block order and reduced once; lse = max + log(sum). The
gathered variant returns x[target] - lse, the very subtraction the full log-softmax does for that
column, so an engine that takes log_softmax(logits)[sampled] and a learner that calls
log_softmax_gather(logits, targets) agree bitwise. Inputs are fp32 (logits after temperature).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 4096


@triton.jit
def _row_stats(x_ptr, row, V, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mx = tl.full((BLOCK,), float("-inf"), tl.float32)
    for c0 in range(0, V, BLOCK):
        x = tl.load(x_ptr + row * V + c0 + cols, mask=c0 + cols < V, other=float("-inf"))
        mx = tl.maximum(mx, x)
    m = tl.max(mx, axis=0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for c0 in range(0, V, BLOCK):
        x = tl.load(x_ptr + row * V + c0 + cols, mask=c0 + cols < V, other=float("-inf"))
        acc += tl.exp(x - m)
    return m, tl.sum(acc, axis=0)


@triton.jit(do_not_specialize=["R"])
def _softmax_kernel(x_ptr, out_ptr, R, V, LOG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    m, s = _row_stats(x_ptr, row, V, BLOCK)
    lse = m + tl.log(s)
    cols = tl.arange(0, BLOCK)
    for c0 in range(0, V, BLOCK):
        mask = c0 + cols < V
        x = tl.load(x_ptr + row * V + c0 + cols, mask=mask, other=float("-inf"))
        if LOG:
            y = x - lse
        else:
            y = tl.exp(x - m) / s
        tl.store(out_ptr + row * V + c0 + cols, y, mask=mask)


@triton.jit(do_not_specialize=["R"])
def _log_softmax_gather_kernel(x_ptr, t_ptr, out_ptr, lse_ptr, R, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    m, s = _row_stats(x_ptr, row, V, BLOCK)
    lse = m + tl.log(s)
    target = tl.load(t_ptr + row).to(tl.int64)
    x_t = tl.load(x_ptr + row * V + target)
    tl.store(out_ptr + row, x_t - lse)
    tl.store(lse_ptr + row, lse)


def _block(v: int) -> int:
    return min(BLOCK_V, triton.next_power_of_2(v))


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32:
        raise ValueError(f"row softmax kernels take fp32 input, got {x.dtype}")
    return x.reshape(-1, x.shape[-1]).contiguous()


def _launch(x: torch.Tensor, log: bool) -> torch.Tensor:
    x2 = _rows(x)
    out = torch.empty_like(x2)
    if x2.shape[0]:
        _softmax_kernel[(x2.shape[0],)](x2, out, x2.shape[0], x2.shape[1], LOG=log, BLOCK=_block(x2.shape[1]))
    return out.view(x.shape)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, log):
        out = _launch(x, log)
        ctx.save_for_backward(out)
        ctx.log = log
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (out,) = ctx.saved_tensors
        if ctx.log:
            return grad_out - out.exp() * grad_out.sum(-1, keepdim=True), None
        return out * (grad_out - (grad_out * out).sum(-1, keepdim=True)), None


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Row softmax over the last dim (fp32)."""
    return _Softmax.apply(x, False) if torch.is_grad_enabled() and x.requires_grad else _launch(x, False)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    """Row log-softmax over the last dim (fp32)."""
    return _Softmax.apply(x, True) if torch.is_grad_enabled() and x.requires_grad else _launch(x, True)


def _gather_launch(x: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x2 = _rows(x)
    n = x2.shape[0]
    out = torch.empty(n, dtype=torch.float32, device=x.device)
    lse = torch.empty(n, dtype=torch.float32, device=x.device)
    if n:
        t = targets.reshape(-1).contiguous()
        _log_softmax_gather_kernel[(n,)](x2, t, out, lse, n, x2.shape[1], BLOCK=_block(x2.shape[1]))
    return out, lse


class _LogSoftmaxGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, targets):
        out, lse = _gather_launch(x, targets)
        ctx.save_for_backward(x, targets, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, targets, lse = ctx.saved_tensors
        x2 = x.reshape(-1, x.shape[-1])
        grad = -(x2 - lse[:, None]).exp() * grad_out[:, None]
        grad.scatter_add_(1, targets.reshape(-1, 1), grad_out[:, None])
        return grad.view(x.shape), None


def log_softmax_gather(x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(x)[row, targets[row]] for x [n, V] fp32, without writing the [n, V] result."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _LogSoftmaxGather.apply(x, targets)
    return _gather_launch(x, targets)[0]
