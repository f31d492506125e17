"""DeepSeek-V3 routing: sigmoid scores, a correction bias for selection only, group-limited top-k.

Per token (row): scores = sigmoid(router logits) in fp32; the selection scores add the per-expert correction
bias; experts are split into `n_group` equal groups, each group scored by the sum of its two best selection
scores; the `topk_group` best groups stay eligible; the `top_k` best eligible experts are chosen; their
weights are their *uncorrected* scores, divided by their sum (+1e-20) when `normalize`, times `scaling`.

Every step is per row and exact or elementwise: sorts are stable and descending (ties go to the lowest group /
expert index, whatever else is in the batch), the sums run in a fixed order, and the sigmoid takes the vector
path for every element (`aligned_unary`). A token's experts and weights therefore never depend on the other
tokens of the call: engine and trainer route it identically. Shared by every op set (as `moe.top_k_of` is);
`sigmoid` is the op set's elementwise sigmoid (the Triton one on GPU).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rz_kernels.elementwise import aligned_unary


def aligned_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """Elementwise sigmoid whose value for an element does not depend on the tensor's size."""
    return aligned_unary(torch.sigmoid, x)


def grouped_top_k(
    scores: torch.Tensor,
    correction: torch.Tensor,
    top_k: int,
    n_group: int,
    topk_group: int,
    normalize: bool,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] fp32, experts [T, k]) from sigmoid scores [T, E] fp32 (see module docstring)."""
    t, e = scores.shape
    per_group = e // n_group
    choice = scores + correction.float()
    if n_group > 1 and topk_group < n_group:
        best = torch.sort(choice.view(t, n_group, per_group), dim=-1, descending=True, stable=True).values
        group_scores = best[..., 0] + best[..., 1]
        groups = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices[:, :topk_group]
        keep = torch.zeros(t, n_group, dtype=torch.bool, device=scores.device).scatter_(1, groups, True)
        choice = choice.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
    experts = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(1, experts)
    if normalize:
        total = weights[:, 0]
        for j in range(1, top_k):  # fixed order
            total = total + weights[:, j]
        weights = weights / (total + 1e-20).unsqueeze(-1)
    return weights * scaling, experts


def make_sigmoid_route(sigmoid: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """An op set's `sigmoid_route`: (router_logits, correction, top_k, n_group, topk_group, normalize,
    scaling) -> (weights, experts), with `sigmoid` for the scores."""

    def sigmoid_route(logits, correction, top_k, n_group, topk_group, normalize, scaling):
        scores = sigmoid(logits.float())
        return grouped_top_k(scores, correction, top_k, n_group, topk_group, normalize, scaling)

    return sigmoid_route


sigmoid_route = make_sigmoid_route(aligned_sigmoid)
