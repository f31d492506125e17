"""Attention of one query over its own key set with a per-head sink (DeepSeek-V4): a sliding window of the
last W positions plus compressed entries (all visible ones, or the indexer's top-k).

Keys are K = V (one shared head). Per query row t and head h the key set is two fixed-size groups,
  slide  [T, W, D]  the window's keys, `slide_ok` [T, W] says which slots hold a position
  comp   [T, C, D]  compressed entries, `comp_ok` [T, C] which ones the query sees,
and the result is softmax over [slide scores | comp scores | sink_h] applied to the values (the sink's value
is zero). The aligned form gives a row the same bits whatever else is in the call: every dot product is a
reduction over D, the window a reduction of fixed length W, the compressed group sums `block` entries at a
time (each a fixed-length reduction) and adds the blocks in a fixed binary tree over their index, so extra
blocks of invisible entries add exact zeros; the max is exact and the exponentials take the vector path
(`aligned_unary`). The standard form is transformers' eager attention (matmul, stock softmax).
"""

from __future__ import annotations

import torch

from rz_kernels.elementwise import aligned_unary

# Score elements (rows x heads x keys x dim) formed at once by the aligned form (rows are independent).
WORK_BUDGET = 1 << 23


def tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim in a fixed binary tree over its index (adjacent pairs, level by level): padding
    with zeros at the end gives the same bits."""
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = torch.cat([x, torch.zeros_like(x[..., :1])], dim=-1)
        x = x[..., 0::2] + x[..., 1::2]
    return x[..., 0]


def _group_sum(x: torch.Tensor, block: int | None) -> torch.Tensor:
    """Sum over the last dim: one reduction (block None) or block-sized reductions added in a tree."""
    if block is None or x.shape[-1] == 0:
        return x.sum(-1)
    n = x.shape[-1]
    pad = (-n) % block
    if pad:
        x = torch.cat([x, x.new_zeros(*x.shape[:-1], pad)], dim=-1)
    return tree_sum(x.reshape(*x.shape[:-1], -1, block).sum(-1))


def _dots(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """[r, H, K]: q [r, H, D] . keys [r, K, D], each a length-D reduction."""
    return (q.unsqueeze(2) * keys.unsqueeze(1)).sum(-1)


def _weighted(p: torch.Tensor, keys: torch.Tensor, block: int | None) -> torch.Tensor:
    """[r, H, D]: sum_k p [r, H, K] * keys [r, K, D] (reduction over K on the last dim)."""
    values = keys.transpose(1, 2).contiguous().unsqueeze(1)  # [r, 1, D, K]
    return _group_sum(p.unsqueeze(2) * values, block)


def aligned_sink_attention(
    q: torch.Tensor,
    slide: torch.Tensor,
    slide_ok: torch.Tensor,
    comp: torch.Tensor,
    comp_ok: torch.Tensor,
    sinks: torch.Tensor,
    scale: float,
    block: int | None,
) -> torch.Tensor:
    """Attention output [T, H, D] in q's dtype (see the module docstring); math in q's dtype, softmax fp32."""
    t, h, d = q.shape
    keys = slide.shape[1] + comp.shape[1]
    out = q.new_empty(t, h, d)
    rows = max(1, WORK_BUDGET // max(1, h * keys * d))
    neg = float("-inf")
    for a in range(0, t, rows):
        b = min(t, a + rows)
        qa, sa, ca = q[a:b].contiguous(), slide[a:b].contiguous(), comp[a:b].contiguous()
        s_sl = (_dots(qa, sa).float() * scale).masked_fill(~slide_ok[a:b].unsqueeze(1), neg)
        s_c = (_dots(qa, ca).float() * scale).masked_fill(~comp_ok[a:b].unsqueeze(1), neg)
        sink = sinks.float().view(1, h).expand(b - a, h)
        top = torch.maximum(s_sl.amax(-1), sink)
        if s_c.shape[-1]:
            top = torch.maximum(top, s_c.amax(-1))
        e_sl = aligned_unary(torch.exp, s_sl - top.unsqueeze(-1))
        e_c = aligned_unary(torch.exp, s_c - top.unsqueeze(-1))
        total = aligned_unary(torch.exp, sink - top) + e_sl.sum(-1) + _group_sum(e_c, block)
        o = _weighted(e_sl.to(q.dtype), sa, None) + _weighted(e_c.to(q.dtype), ca, block)
        out[a:b] = (o.float() / total.unsqueeze(-1)).to(q.dtype)
    return out


def standard_sink_attention(
    q: torch.Tensor,
    slide: torch.Tensor,
    slide_ok: torch.Tensor,
    comp: torch.Tensor,
    comp_ok: torch.Tensor,
    sinks: torch.Tensor,
    scale: float,
    block: int | None,
) -> torch.Tensor:
    """transformers' eager arithmetic: matmul scores, the sink as one more logit, stock softmax, matmul."""
    keys = torch.cat([slide, comp], dim=1)  # [T, K, D]
    ok = torch.cat([slide_ok, comp_ok], dim=1)
    s = torch.matmul(q, keys.transpose(1, 2)) * scale  # [T, H, K]
    s = s.masked_fill(~ok.unsqueeze(1), float("-inf"))
    logits = torch.cat([s, sinks.to(s.dtype).view(1, -1, 1).expand(s.shape[0], -1, 1)], dim=-1)
    logits = logits - logits.amax(-1, keepdim=True)
    p = torch.softmax(logits, dim=-1)[..., :-1]
    return torch.matmul(p.to(keys.dtype), keys)
