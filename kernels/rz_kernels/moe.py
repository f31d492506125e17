"""Mixture-of-experts routing, dispatch and combine.

Aligned: router softmax in fp32; top-k by a stable descending sort (ties go to the lowest expert
index); tokens dispatched to experts by a stable sort; each expert runs the tiled (batch-invariant)
GEMM on its rows; a token's k expert outputs are combined in fp32 in its fixed top-k order. No
token is ever dropped (no capacity factor). A token's result therefore depends only on its own
hidden state, never on which other tokens were routed alongside it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ExpertFn = Callable[[int, torch.Tensor], torch.Tensor]


def route(router_logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (weights [T, k] fp32, experts [T, k]) from router logits [T, E]."""
    return top_k_of(torch.softmax(router_logits.float(), dim=-1), top_k, normalize)


def top_k_of(probs: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts) of router probabilities [T, E]: stable descending top-k (ties go to the lowest
    expert), renormalized in a fixed order when ``normalize``. Shared by every op set's ``route``."""
    sorted_probs, sorted_idx = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights, experts = sorted_probs[:, :top_k], sorted_idx[:, :top_k]
    if normalize:
        total = weights[:, 0]
        for j in range(1, top_k):  # fixed order
            total = total + weights[:, j]
        weights = weights / total.unsqueeze(-1)
    return weights, experts


def aligned_moe(
    x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, num_experts: int, expert_fn: ExpertFn
) -> torch.Tensor:
    """Dispatch x [T, H] to experts, run them, combine in fp32 in top-k order. Returns x's dtype."""
    t, top_k = experts.shape
    flat_expert = experts.reshape(-1)
    order = torch.sort(flat_expert, stable=True).indices
    counts = torch.bincount(flat_expert, minlength=num_experts).tolist()
    token_of = order // top_k
    outputs = x.new_zeros(t * top_k, x.shape[-1], dtype=torch.float32)
    start = 0
    for e, n in enumerate(counts):
        if n:
            sel = order[start : start + n]
            y = expert_fn(e, x[token_of[start : start + n]])
            outputs = outputs.index_copy(0, sel, y.float())
        start += n
    outputs = outputs.view(t, top_k, -1)
    out = outputs[:, 0] * weights[:, :1]
    for j in range(1, top_k):
        out = out + outputs[:, j] * weights[:, j : j + 1]
    return out.to(x.dtype)


def standard_moe(
    x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, num_experts: int, expert_fn: ExpertFn
) -> torch.Tensor:
    """HF-style: per-expert loop, weights applied in the model dtype, index_add_ accumulation."""
    out = torch.zeros_like(x)
    for e in torch.unique(experts).tolist():
        tok, slot = torch.where(experts == e)
        y = expert_fn(e, x[tok]) * weights[tok, slot, None].to(x.dtype)
        out.index_add_(0, tok, y)
    return out
