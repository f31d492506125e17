"""RMSNorm and LayerNorm in fp32 (per-row reductions over the hidden size: row-invariant)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`weight * x / sqrt(mean(x^2) + eps)`, computed in fp32 and cast back, as HF Llama/Qwen3 do."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """`(x - mean) / sqrt(var + eps) * weight + bias` over the last dim, in fp32, cast back to x's dtype.

    Written out of row-wise means (as `rms_norm`) rather than `F.layer_norm`, so its arithmetic is plainly
    per row: a row's result never depends on the other rows of the call (the vision tower's norms).
    """
    dtype = x.dtype
    h = x.float()
    centred = h - h.mean(-1, keepdim=True)
    h = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
    return (h * weight.float() + bias.float()).to(dtype)


def standard_layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """Stock `F.layer_norm` (the standard op set's)."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
