"""DeepSeek-V4's lightning indexer: per query, a score for every compressed block, and the top-k blocks.

score[t, w] = sum_h weight[t, h] * relu(q[t, h] . k[w]) * scale, over the blocks w the query may see (the
others -inf). The aligned form computes each dot product and the sum over heads as a reduction of fixed
length along the last dimension of a contiguous tensor (a row's arithmetic does not depend on the rows beside
it), and selects with a stable descending sort: ties go to the lowest block index, and the blocks the query
may not see (-inf) sort after every visible one, so a query selects the same blocks, in the same order,
whatever the call's other queries or its number of blocks. Fewer visible blocks than k: the slots past them
are -1 (nothing). The standard form is transformers': matmul scores and torch.topk.
"""

from __future__ import annotations

import torch

# Score elements (rows x heads x blocks x dim) formed at once by the aligned form (rows are independent).
WORK_BUDGET = 1 << 23


def aligned_scores(
    q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """Scores [T, W] fp32 of queries q [T, H, c] against their blocks keys [T, W, c] (per query: its
    sequence's blocks), head weights [T, H] fp32, visible [T, W] bool."""
    t, h, c = q.shape
    w = keys.shape[1]
    out = q.new_empty(t, w, dtype=torch.float32)
    rows = max(1, WORK_BUDGET // max(1, h * w * c))
    for a in range(0, t, rows):
        qa, ka = q[a : a + rows].float(), keys[a : a + rows].float()
        dots = (qa.unsqueeze(2) * ka.unsqueeze(1)).sum(-1)  # [r, H, W], each a length-c reduction
        s = torch.relu(dots) * scale * weights[a : a + rows].unsqueeze(-1)
        out[a : a + rows] = s.transpose(1, 2).contiguous().sum(-1)  # over heads, fixed length H
    return out.masked_fill(~visible, float("-inf"))


def standard_scores(
    q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """transformers' form: a matmul per query against its blocks, relu, weighted sum over heads."""
    s = torch.matmul(q.float(), keys.float().transpose(-1, -2))  # [T, H, W]
    s = torch.relu(s) * scale
    return (s * weights.unsqueeze(-1)).sum(dim=1).masked_fill(~visible, float("-inf"))


def aligned_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [T, k] of each row's k best visible blocks (stable: ties to the lowest index), -1 past them."""
    t, w = scores.shape
    if w < k:  # pad with invisible blocks: they sort last and come out as -1
        scores = torch.cat([scores, scores.new_full((t, k - w), float("-inf"))], dim=1)
    order = torch.sort(scores, dim=-1, descending=True, stable=True)
    idx = order.indices[:, :k]
    return torch.where(torch.isinf(order.values[:, :k]), torch.full_like(idx, -1), idx)


def standard_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """torch.topk over the row (its tie order is the kernel's), invisible picks as -1."""
    t, w = scores.shape
    top = scores.topk(min(k, w), dim=-1)
    idx = torch.where(torch.isinf(top.values), torch.full_like(top.indices, -1), top.indices)
    return torch.cat([idx, idx.new_full((t, k - idx.shape[1]), -1)], dim=1)
