"""DeepSeek-V4's lightning indexer in Triton: block scores per query, and the stable top-k.

Scores (one program per (query, block of key blocks)): score[t, w] = sum_h relu(q[t, h] . k[t, w]) * scale *
weight[t, h], the heads added in head order, each dot product one tl.sum over the index dim: a query's scores
depend on its own row alone. Invisible blocks are -inf.

Top-k (one program per (query, block of candidates)): a candidate's rank is the number of blocks before it
in a stable descending sort (higher score, or an equal score at a lower index); the candidates ranked below k
are written at their rank, the other slots stay -1, and invisible (-inf) blocks are never selected. Integer
counts: the selection is exactly the CPU kernel's (rz_kernels.sparse_select.aligned_top_k, a stable sort),
whatever the call's other queries or its number of blocks. Cost: W^2 comparisons per query (fine at the
indexer's thousands of blocks; a radix select would be the next step for far longer contexts).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rz_kernels.sparse_select import aligned_scores as torch_aligned_scores
from rz_kernels.triton_ops.recompute import with_reference_backward

SCORE_BLOCK = 32  # key blocks per scoring program
RANK_BLOCK = 64  # candidates per top-k program, and blocks compared per step


@triton.jit(do_not_specialize=["T", "W"])
def _index_scores_kernel(
    q_ptr, k_ptr, w_ptr, vis_ptr, out_ptr, T, W, H, C, scale, BW: tl.constexpr, BC: tl.constexpr
):
    t = tl.program_id(0).to(tl.int64)
    blocks = tl.program_id(1) * BW + tl.arange(0, BW)
    cc = tl.arange(0, BC)
    bmask = blocks < W
    keys = tl.load(
        k_ptr + (t * W + blocks[:, None]) * C + cc[None, :],
        mask=bmask[:, None] & (cc < C)[None, :],
        other=0.0,
    ).to(tl.float32)
    acc = tl.zeros([BW], tl.float32)
    for h in range(0, H):  # head order
        qh = tl.load(q_ptr + (t * H + h) * C + cc, mask=cc < C, other=0.0).to(tl.float32)
        dot = tl.sum(keys * qh[None, :], axis=1)
        acc += tl.maximum(dot, 0.0) * scale * tl.load(w_ptr + t * H + h)
    vis = tl.load(vis_ptr + t * W + blocks, mask=bmask, other=0)
    acc = tl.where(vis != 0, acc, float("-inf"))
    tl.store(out_ptr + t * W + blocks, acc, mask=bmask)


@triton.jit(do_not_specialize=["T", "W"])
def _top_k_kernel(s_ptr, out_ptr, T, W, K, BI: tl.constexpr, BJ: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BI + tl.arange(0, BI)
    imask = i < W
    si = tl.load(s_ptr + t * W + i, mask=imask, other=float("-inf"))
    rank = tl.zeros([BI], tl.int32)
    for j0 in range(0, W, BJ):
        j = j0 + tl.arange(0, BJ)
        sj = tl.load(s_ptr + t * W + j, mask=j < W, other=float("-inf"))
        ahead = (sj[None, :] > si[:, None]) | ((sj[None, :] == si[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((ahead & (j < W)[None, :]).to(tl.int32), axis=1)
    chosen = imask & (rank < K) & (si > float("-inf"))
    tl.store(out_ptr + t * K + rank, i.to(tl.int64), mask=chosen)


def _scores(q, keys, weights, visible, scale):
    t, h, c = q.shape
    w = keys.shape[1]
    out = torch.empty(t, w, dtype=torch.float32, device=q.device)
    if t and w:
        _index_scores_kernel[(t, triton.cdiv(w, SCORE_BLOCK))](
            q.contiguous(), keys.contiguous(), weights.float().contiguous(),
            visible.to(torch.int8).contiguous(), out, t, w, h, c, float(scale),
            BW=SCORE_BLOCK, BC=triton.next_power_of_2(c),
        )  # fmt: skip
    return out


def aligned_scores(
    q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """Scores [T, W] fp32; the interface of rz_kernels.sparse_select.aligned_scores."""
    return with_reference_backward(
        _scores, torch_aligned_scores, (q, keys, weights), visible=visible, scale=scale
    )


def aligned_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [T, k] of each row's k best visible blocks (ties to the lowest index), -1 past them."""
    t, w = scores.shape
    out = torch.full((t, k), -1, dtype=torch.long, device=scores.device)
    if t and w and k:
        _top_k_kernel[(t, triton.cdiv(w, RANK_BLOCK))](
            scores.float().contiguous(), out, t, w, k, BI=RANK_BLOCK, BJ=RANK_BLOCK
        )
    return out
