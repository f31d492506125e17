"""DeepSeek MoE (V3): routed experts chosen by sigmoid scores with group-limited top-k, plus shared experts.

Parameter names are HF DeepseekV3's on-disk names: `mlp.gate.weight`, `mlp.gate.e_score_correction_bias`
(a buffer, kept in fp32 as transformers keeps it; it steers the selection only, never the weights),
`mlp.experts.N.{gate,up,down}_proj.weight`, `mlp.shared_experts.{gate,up,down}_proj.weight`. The router
logits are computed in fp32 (as HF does); routing is the op set's `sigmoid_route` (rz_kernels.grouped_route:
per token, stable, fixed order), dispatch and combine the op set's `moe` (stable dispatch, fp32 combine in
top-k order) as for Qwen3-MoE, so engine and trainer pick the same experts and sum them in the same order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from rz_agents.model.config import ModelConfig
from rz_agents.model.layers import MLP, _linear


class SigmoidRouter(nn.Module):
    """The router's weight [E, H] and its fp32 correction bias [E]."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.weight = _linear(cfg.hidden_size, cfg.num_experts).weight
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.num_experts, dtype=torch.float32))

    def _apply(self, fn, recurse: bool = True):
        # A model-wide .to(bfloat16) must not round the bias (it decides near-ties between experts): keep
        # fp32.
        old = self.e_score_correction_bias
        out = super()._apply(fn, recurse)
        new = self.e_score_correction_bias
        if new.dtype != torch.float32:
            self._buffers["e_score_correction_bias"] = old.to(device=new.device, dtype=torch.float32)
        return out


class DeepseekMoE(nn.Module):
    """`expert(hidden, intermediate)` builds one routed expert (a module with `run(x, ops, fused)` and
    `gate_proj`/`up_proj`/`down_proj` linears; another family's on-disk names may stand behind them)."""

    def __init__(self, cfg: ModelConfig, expert: Callable[[int, int], nn.Module] = MLP) -> None:
        super().__init__()
        self.num_experts = cfg.num_experts
        self.top_k = cfg.num_experts_per_tok
        self.n_group, self.topk_group = cfg.n_group, cfg.topk_group
        self.normalize = cfg.norm_topk_prob
        self.scaling = cfg.routed_scaling_factor
        self.gate = SigmoidRouter(cfg)
        self.experts = nn.ModuleList(
            expert(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.num_experts)
        )
        self.shared_experts = (
            MLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts)
            if cfg.n_shared_experts
            else None
        )

    def route(self, x: torch.Tensor, ops) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] fp32, experts [T, k]) of hidden states x [T, H]."""
        logits = ops.linear(x.float(), self.gate.weight.float())
        return ops.sigmoid_route(
            logits,
            self.gate.e_score_correction_bias,
            self.top_k,
            self.n_group,
            self.topk_group,
            self.normalize,
            self.scaling,
        )

    def forward(self, x: torch.Tensor, ctx) -> torch.Tensor:
        ops = ctx.ops
        weights, experts = self.route(x, ops)
        expert_weights = tuple(
            [getattr(mlp, name).weight for mlp in self.experts]
            for name in ("gate_proj", "up_proj", "down_proj")
        )
        out = ops.moe(
            x,
            weights,
            experts,
            self.num_experts,
            lambda e, xe: self.experts[e].run(xe, ops, ctx.fused),
            expert_weights=expert_weights,
        )
        if self.shared_experts is not None:
            out = out + self.shared_experts.run(x, ops, ctx.fused)
        return out
