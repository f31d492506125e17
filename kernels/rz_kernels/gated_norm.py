"""Gated RMSNorm (Gated DeltaNet's output norm): rms_norm(x) * weight * silu(gate), per row in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rz_kernels.elementwise import aligned_unary


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`weight * (x / sqrt(mean(x^2) + eps)) * silu(gate)`, the rounding steps of transformers' Qwen3.5
    `RMSNormGated`: normalized in fp32, cast to x's dtype, scaled by weight, gated in fp32, cast back.
    Every step is per row (a reduction over the last dim) or per element, so a row's bits never depend on
    the other rows of the call."""
    dtype = x.dtype
    h = x.float()
    h = h * aligned_unary(torch.rsqrt, h.pow(2).mean(-1, keepdim=True) + eps)
    h = weight * h.to(dtype)
    h = h * aligned_unary(F.silu, gate.float())
    return h.to(dtype)
