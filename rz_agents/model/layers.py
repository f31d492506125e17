"""The building blocks every decoder family shares: RMSNorm, the parameter holder of a linear layer, and the
gated MLP. Transformer (model/transformer.py), MLA (model/mla.py) and DeepSeek MoE (model/deepseek_moe.py)
all build from these, so the family files import this one and never each other."""

from __future__ import annotations

import torch
from torch import nn

from rz_agents.model.fused import FusedLinears, project
from rz_agents.model.lora_math import linear as adapted_linear
from rz_kernels import ALIGNED, OpSet


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, ops: OpSet = ALIGNED) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


def _linear(n_in: int, n_out: int, bias: bool = False) -> nn.Linear:
    # nn.Linear only holds the parameters (names .weight/.bias); the op set does the math.
    return nn.Linear(n_in, n_out, bias=bias)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = _linear(hidden, intermediate)
        self.up_proj = _linear(hidden, intermediate)
        self.down_proj = _linear(intermediate, hidden)
        self.gate_up: FusedLinears | None = None  # set by Transformer.fuse_projections

    def run(self, x: torch.Tensor, ops: OpSet, fused: bool = False) -> torch.Tensor:
        gate, up = project(self.gate_up, (self.gate_proj, self.up_proj), x, ops, fused)
        return adapted_linear(self.down_proj, ops.silu_mul(gate, up), ops)

    def forward(self, x: torch.Tensor, ctx) -> torch.Tensor:  # ctx: a forward's context (transformer.py)
        return self.run(x, ctx.ops, ctx.fused)
