"""SwiGLU gate: silu(gate) * up, and GELU (the transcendentals on the vector path for every element; see
elementwise.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rz_kernels.elementwise import aligned_unary


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return aligned_unary(F.silu, gate) * up


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU (``approximate``: "none", the erf form, or "tanh"), every element on the vector path."""
    return aligned_unary(lambda t: F.gelu(t, approximate=approximate), x)
