"""Qwen3.5-MoE's MLP (transformers' `Qwen3_5MoeSparseMoeBlock`): the Qwen3-MoE routed experts (transformer.py
``SparseMoE``: softmax over the router's logits, top k renormalized, the op set's stable dispatch and fp32
combine in top-k order, so engine and learner pick the same experts and sum them in the same order) plus a
shared expert whose output is scaled by a sigmoid gate. Parameter names are the checkpoint's:
`mlp.gate.weight`, `mlp.experts.N.{gate,up,down}_proj.weight`, `mlp.shared_expert.{gate,up,down}_proj.weight`,
`mlp.shared_expert_gate.weight`."""

from __future__ import annotations

import torch
from torch import nn

from rz_agents.model.layers import MLP
from rz_agents.model.qwen3_5_config import Qwen35Config
from rz_agents.model.transformer import SparseMoE
from rz_kernels.elementwise import aligned_unary


class Qwen35SparseMoE(SparseMoE):
    """Routed experts (``SparseMoE``, reused as it is) + a sigmoid-gated shared expert."""

    def __init__(self, cfg: Qwen35Config) -> None:
        super().__init__(cfg)  # (the config answers SparseMoE's fields: experts, top k, renormalization)
        self.shared_expert = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor, batch) -> torch.Tensor:
        """x [T, H] -> [T, H]; ``batch``: the forward's context (its ``ops``; ``fused`` False)."""
        ops = batch.ops
        routed = super().forward(x, batch)
        gate = aligned_unary(torch.sigmoid, ops.linear(x, self.shared_expert_gate.weight))
        return routed + gate * self.shared_expert.run(x, ops)
