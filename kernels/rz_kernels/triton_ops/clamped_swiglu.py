"""DeepSeek-V4's expert activation in Triton: silu(min(gate, limit)) * clamp(up, -limit, limit), one program
per row (rz_agents.model.deepseek_v4_layers.clamped_swiglu is the CPU form).

A row's arithmetic depends on its own length alone (fixed column blocks), so a token's activation has the
same bits whatever the other rows of the call: the engine's decode and the learner's packed forward agree.
The rounding points are the torch form's: the limit rounded to the tensor's dtype (as torch's clamp does with
a Python scalar), silu in fp32 rounded to the dtype (as F.silu), the product rounded once. The backward is the
plain fp32 formula; a clamped element passes no gradient (torch's clamp passes it at the bound itself).
"""

from __future__ import annotations

import math
import struct

import torch
import triton
import triton.language as tl

from rz_kernels.triton_ops.rowwise import SILU_BLOCK


@triton.jit(do_not_specialize=["R"])
def _clamped_swiglu_kernel(g_ptr, u_ptr, out_ptr, R, N, limit, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    for c0 in range(0, N, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < N
        g = tl.load(g_ptr + row * N + cols, mask=mask, other=0.0)
        u = tl.load(u_ptr + row * N + cols, mask=mask, other=0.0)
        gf = tl.minimum(g.to(tl.float32), limit)  # exact: the limit is a value of g's dtype
        uf = tl.minimum(tl.maximum(u.to(tl.float32), -limit), limit)
        s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # silu rounded to the input dtype, as F.silu does
        out = s.to(tl.float32) * uf
        tl.store(out_ptr + row * N + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _limit_in(dtype: torch.dtype, limit: float) -> float:
    """The limit as torch's clamp applies it to a tensor of ``dtype``: rounded to fp32, then to that dtype
    (round to nearest even), in plain Python: a tensor here would be read back with ``.item()``, which the
    host-read check before a CUDA-graph capture refuses (engine/cuda_graphs.py)."""
    bits = struct.unpack("<I", struct.pack("<f", limit))[0]
    if dtype == torch.bfloat16:  # keep the upper 16 bits, rounded to nearest even (a finite limit)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    value = struct.unpack("<f", struct.pack("<I", bits))[0]
    if dtype == torch.float16:
        try:
            return struct.unpack("<e", struct.pack("<e", value))[0]
        except OverflowError:  # past fp16's range: torch rounds it to infinity
            return math.copysign(math.inf, value)
    return value


def _forward(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    n = gate.shape[-1]
    g2 = gate.reshape(-1, n).contiguous()
    u2 = up.reshape(-1, n).contiguous()
    out = torch.empty_like(g2)
    if g2.shape[0]:
        block = min(SILU_BLOCK, triton.next_power_of_2(n))
        _clamped_swiglu_kernel[(g2.shape[0],)](g2, u2, out, g2.shape[0], n, _limit_in(gate.dtype, limit),
                                               BLOCK=block)  # fmt: skip
    return out.view(gate.shape)


class _ClampedSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, limit):
        ctx.save_for_backward(gate, up)
        ctx.limit = _limit_in(gate.dtype, limit)
        return _forward(gate, up, limit)

    @staticmethod
    def backward(ctx, grad_out):
        gate, up = ctx.saved_tensors
        limit = ctx.limit
        g, u, go = gate.float(), up.float(), grad_out.float()
        gc, uc = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
        sig = torch.sigmoid(gc)
        grad_gate = go * uc * sig * (1 + gc * (1 - sig)) * (g <= limit)
        grad_up = go * gc * sig * ((u >= -limit) & (u <= limit))
        return grad_gate.to(gate.dtype), grad_up.to(up.dtype), None


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit), one program per row; differentiable."""
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _ClampedSwiGLU.apply(gate, up, limit)
    return _forward(gate, up, limit)
