"""DeepSeek-V4's MoE layers: routed experts with a clamped SwiGLU plus one shared expert; the router picks
the experts by learned top-k (`moe`: scores + a selection-only bias) or by a fixed token-id table (`hash_moe`:
`tid2eid[token]`); either way the selected experts' *scores* (sqrtsoftplus, sigmoid or softmax of the router
logits) are normalised and scaled into the combine weights.

Names are the checkpoint's (`ffn.gate.weight`, `ffn.gate.bias` / `ffn.gate.tid2eid`,
`ffn.experts.N.w1|w2|w3.weight`, `ffn.shared_experts.w1|w2|w3.weight`; w1 gate, w3 up, w2 down). Aligned:
scores on the vector path, selection by a stable descending sort (ties to the lowest expert), the weight sum
in a fixed order, dispatch and combine by the op set's `moe` (stable, fp32 combine in top-k order): a token's
experts and output never depend on the other tokens of the call. Standard: torch.topk, stock MoE. On the
Triton op set the routed experts run as the grouped GEMMs of every family's MoE with the clamp in their
activation kernel (`swiglu_limit`), and the shared expert's activation is that kernel too
(rz_kernels.triton_ops.clamped_swiglu): row-wise, so engine and learner get the same bits there as well.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rz_agents.model.deepseek_v4_config import DeepseekV4Config
from rz_agents.model.deepseek_v4_layers import _softmax_last, clamped_swiglu, sigmoid
from rz_agents.model.layers import _linear
from rz_kernels import OpSet
from rz_kernels.elementwise import aligned_unary


class Expert(nn.Module):
    def __init__(self, hidden: int, intermediate: int, limit: float) -> None:
        super().__init__()
        self.w1 = _linear(hidden, intermediate)
        self.w2 = _linear(intermediate, hidden)
        self.w3 = _linear(hidden, intermediate)
        self.limit = limit

    def run(self, x: torch.Tensor, ops: OpSet) -> torch.Tensor:
        h = swiglu_form(ops)(ops.linear(x, self.w1.weight), ops.linear(x, self.w3.weight), self.limit)
        return ops.linear(h, self.w2.weight)


def swiglu_form(ops: OpSet):
    """The clamped SwiGLU of an op set: the Triton kernel on the Triton op set, else the torch form."""
    if ops.name == "triton":  # imported here: the Triton op set is only importable where triton is
        from rz_kernels.triton_ops.clamped_swiglu import clamped_swiglu as triton_clamped_swiglu

        return triton_clamped_swiglu
    return clamped_swiglu


class Router(nn.Module):
    """The gate's weight [E, H] and, by kind, its selection bias [E] (fp32) or token table [vocab, k]."""

    def __init__(self, cfg: DeepseekV4Config, hashed: bool) -> None:
        super().__init__()
        self.weight = _linear(cfg.hidden_size, cfg.n_routed_experts).weight
        if hashed:
            self.register_buffer(
                "tid2eid", torch.zeros(cfg.vocab_size, cfg.num_experts_per_tok, dtype=torch.long)
            )
        else:
            self.register_buffer("bias", torch.zeros(cfg.n_routed_experts, dtype=torch.float32))
        self.hashed = hashed

    def _apply(self, fn, recurse: bool = True):
        # a model-wide .to(bfloat16) must not round the selection bias (it decides near-ties) nor the table
        kept = {k: b for k, b in self._buffers.items() if b is not None}
        out = super()._apply(fn, recurse)
        for k, old in kept.items():
            new = self._buffers[k]
            if new.dtype != old.dtype:
                self._buffers[k] = old.to(device=new.device)
        return out


def router_scores(logits: torch.Tensor, func: str) -> torch.Tensor:
    """The router's expert scores of logits [T, E] (fp32), per row."""
    if func == "sqrtsoftplus":
        return aligned_unary(F.softplus, logits).sqrt()
    if func == "sigmoid":
        return sigmoid(logits)
    return _softmax_last(logits)


class MoE(nn.Module):
    def __init__(self, cfg: DeepseekV4Config, layer: int) -> None:
        super().__init__()
        hashed = cfg.mlp_layer_types[layer] == "hash_moe"
        self.gate = Router(cfg, hashed)
        limit = cfg.swiglu_limit
        self.experts = nn.ModuleList(
            Expert(cfg.hidden_size, cfg.moe_intermediate_size, limit) for _ in range(cfg.n_routed_experts)
        )
        self.shared_experts = Expert(cfg.hidden_size, cfg.moe_intermediate_size, limit)
        self.top_k, self.num_experts = cfg.num_experts_per_tok, cfg.n_routed_experts
        self.func, self.scaling = cfg.scoring_func, cfg.routed_scaling_factor

    def route(self, x: torch.Tensor, tokens: torch.Tensor, ops: OpSet) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] fp32, experts [T, k]) of hidden states x [T, H] and their token ids."""
        scores = router_scores(ops.linear(x, self.gate.weight).float(), self.func)
        if self.gate.hashed:
            experts = self.gate.tid2eid[tokens].long()
        elif ops.name == "standard":
            experts = torch.topk(scores + self.gate.bias, self.top_k, dim=-1, sorted=False).indices
        else:
            experts = torch.sort(scores + self.gate.bias, dim=-1, descending=True, stable=True).indices
            experts = experts[:, : self.top_k]
        weights = scores.gather(1, experts)
        total = weights[:, 0]
        for j in range(1, self.top_k):  # fixed order
            total = total + weights[:, j]
        return weights / (total + 1e-20).unsqueeze(-1) * self.scaling, experts

    def forward(self, x: torch.Tensor, tokens: torch.Tensor, ops: OpSet, trace=None) -> torch.Tensor:
        weights, experts = self.route(x, tokens, ops)
        if trace is not None and not self.gate.hashed:
            trace.append(("router", experts))
        expert_weights = tuple([getattr(e, w).weight for e in self.experts] for w in ("w1", "w3", "w2"))
        out = ops.moe(
            x, weights, experts, self.num_experts, lambda e, xe: self.experts[e].run(xe, ops),
            expert_weights=expert_weights, swiglu_limit=self.shared_experts.limit,
        )  # fmt: skip
        return out + self.shared_experts.run(x, ops)
