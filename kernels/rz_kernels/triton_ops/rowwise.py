"""RMSNorm, RoPE and SiLU-mul in Triton, one program per row (token).

Each program reduces or transforms exactly one row with a block shape fixed by the row length, so a
row's arithmetic never depends on how many rows the call has. Math in fp32, results in the input
dtype, with the same rounding points as the CPU op set (rz_kernels.norm / rope / activation). The
backward passes are plain PyTorch formulas in fp32 (gradients are not part of the bit-identity contract).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Columns per step of the SiLU-mul row loop (intermediate sizes run to 14k+).
SILU_BLOCK = 1024


# --- RMSNorm ---------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["R"])
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, R, H, eps, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=0) / H
    h = (xf * tl.math.rsqrt(mean_sq + eps)).to(x.dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = w.to(tl.float32) * h.to(tl.float32)
    tl.store(out_ptr + row * H + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.shape[-1]
    x2 = x.reshape(-1, h).contiguous()
    # allocated in x's shape (contiguous: the same rows the kernel writes), so the result is no view: FSDP2
    # warns on every forward of a sharded model whose output (the final norm's) is a view
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, weight.contiguous(), out, x2.shape[0], h, eps, BLOCK_H=triton.next_power_of_2(h)
        )
    return out


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return _rms_norm_forward(x, weight, eps)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        xf = x.float()
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
        xhat = xf * r
        g = grad_out.float()
        grad_w = (
            (g * xhat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype) if ctx.needs_input_grad[1] else None
        )
        grad_x = None
        if ctx.needs_input_grad[0]:
            gx = g * weight.float()
            grad_x = (r * (gx - xhat * (gx * xhat).mean(-1, keepdim=True))).to(x.dtype)
        return grad_x, grad_w, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`weight * x / sqrt(mean(x^2) + eps)`, one program per row (fp32 math, cast as HF does)."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return _RMSNorm.apply(x, weight, eps)
    return _rms_norm_forward(x, weight, eps)


# --- RoPE ------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["T"])
def _rope_kernel(
    x_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    T,
    NH,
    HALF: tl.constexpr,
    BLOCK_NH: tl.constexpr,
    INVERSE: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    heads = tl.arange(0, BLOCK_NH)
    # HALF padded to a power of two (tl.arange needs one): Qwen3-VL's vision head dim 72 has HALF 36. The
    # padded columns are masked; the rotation is elementwise, so the padding changes no computed element.
    cols = tl.arange(0, BLOCK_HALF)
    col_ok = cols < HALF
    mask = (heads < NH)[:, None] & col_ok[None, :]
    base = t * NH * 2 * HALF + heads[:, None] * 2 * HALF + cols[None, :]
    x1 = tl.load(x_ptr + base, mask=mask, other=0.0)
    x2 = tl.load(x_ptr + base + HALF, mask=mask, other=0.0)
    c1 = tl.load(cos_ptr + pos * 2 * HALF + cols, mask=col_ok, other=0.0)[None, :]
    c2 = tl.load(cos_ptr + pos * 2 * HALF + HALF + cols, mask=col_ok, other=0.0)[None, :]
    s1 = tl.load(sin_ptr + pos * 2 * HALF + cols, mask=col_ok, other=0.0)[None, :]
    s2 = tl.load(sin_ptr + pos * 2 * HALF + HALF + cols, mask=col_ok, other=0.0)[None, :]
    if INVERSE:  # the transpose of the rotation (the backward): rotate by -angle
        s1 = -s1
        s2 = -s2
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    # rotate-half: [x1, x2] * cos + [-x2, x1] * sin
    o1 = a * c1 + (-b) * s1
    o2 = b * c2 + a * s2
    tl.store(out_ptr + base, o1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + base + HALF, o2.to(out_ptr.dtype.element_ty), mask=mask)


def _rope_launch(x, positions, cos, sin, inverse: bool) -> torch.Tensor:
    t, nh, d = x.shape
    x = x.contiguous()
    out = torch.empty_like(x)
    if t:
        _rope_kernel[(t,)](
            x,
            positions.contiguous(),
            cos.contiguous(),  # the kernel indexes rows as pos * head_dim: a strided table would misread
            sin.contiguous(),
            out,
            t,
            nh,
            HALF=d // 2,
            BLOCK_NH=triton.next_power_of_2(nh),
            INVERSE=inverse,
            BLOCK_HALF=triton.next_power_of_2(d // 2),
        )
    return out


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, positions, cos, sin):
        ctx.save_for_backward(positions, cos, sin)
        return _rope_launch(x, positions, cos, sin, inverse=False)

    @staticmethod
    def backward(ctx, grad_out):
        positions, cos, sin = ctx.saved_tensors
        return _rope_launch(grad_out, positions, cos, sin, inverse=True), None, None, None


def rope(table, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] by absolute positions [T] with `table`'s fp32 cos/sin (RopeTable)."""
    table.check_positions(positions)
    cos, sin = table.tables(x.device)
    if torch.is_grad_enabled() and x.requires_grad:
        return _Rope.apply(x, positions, cos, sin)
    return _rope_launch(x, positions, cos, sin, inverse=False)


# --- SiLU-mul --------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["R"])
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, R, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    for c0 in range(0, N, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < N
        g = tl.load(g_ptr + row * N + cols, mask=mask, other=0.0)
        u = tl.load(u_ptr + row * N + cols, mask=mask, other=0.0)
        gf = g.to(tl.float32)
        s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # silu rounded to the input dtype, as F.silu does
        out = s.to(tl.float32) * u.to(tl.float32)
        tl.store(out_ptr + row * N + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _silu_mul_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    n = gate.shape[-1]
    g2 = gate.reshape(-1, n).contiguous()
    u2 = up.reshape(-1, n).contiguous()
    out = torch.empty_like(g2)
    if g2.shape[0]:
        _silu_mul_kernel[(g2.shape[0],)](
            g2, u2, out, g2.shape[0], n, BLOCK=min(SILU_BLOCK, triton.next_power_of_2(n))
        )
    return out.view(gate.shape)


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return _silu_mul_forward(gate, up)

    @staticmethod
    def backward(ctx, grad_out):
        gate, up = ctx.saved_tensors
        g = gate.float()
        sig = torch.sigmoid(g)
        go = grad_out.float()
        grad_gate = (go * up.float() * sig * (1 + g * (1 - sig))).to(gate.dtype)
        grad_up = (go * g * sig).to(up.dtype)
        return grad_gate, grad_up


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, one program per row."""
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _SiluMul.apply(gate, up)
    return _silu_mul_forward(gate, up)
