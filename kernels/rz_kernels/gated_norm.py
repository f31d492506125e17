"""Qwen3.5's two RMSNorm forms, per row in fp32: the gated one (Gated DeltaNet's output norm,
rms_norm(x) * weight * silu(gate)) and the zero-centred one (every other norm: rms_norm(x) * (1 + weight))."""

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


def zero_centered_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`(x / sqrt(mean(x^2) + eps)) * (1 + weight)` in fp32, cast back to x's dtype once at the end (the
    rounding steps of transformers' `Qwen3_5RMSNorm`, whose weight is stored centred on zero)."""
    h = x.float()
    h = h * aligned_unary(torch.rsqrt, h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).to(x.dtype)
