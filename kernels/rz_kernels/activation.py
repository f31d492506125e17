"""SwiGLU gate: silu(gate) * up (the silu on the vector path for every element; see elementwise.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rz_kernels.elementwise import aligned_unary


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return aligned_unary(F.silu, gate) * up
