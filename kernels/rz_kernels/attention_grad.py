"""The blocked attention's backward on CPU through PyTorch's flash-attention backward kernel.

Only the forward's bits are part of the alignment contract (the engine samples from the forward; nothing
samples from a gradient), so the backward may use any algorithm that gives the attention's gradient. The
flash kernel (``aten::_scaled_dot_product_flash_attention_for_cpu_backward``) takes the forward's output and
per-row log-sum-exp, recomputes the probabilities block by block and skips the causal future: on SmolLM2
shapes it costs a fraction of the tile-by-tile recompute in ``attention._backward`` (see
bench/attention_grad.py).

Layout: queries are spread into a [sequences, heads, span, D] grid at their absolute positions (query at
position p of sequence s is row p of batch s), so "causal" in the kernel's sense (row p sees keys 0..p) is
exactly the plan's mask, for a packed training forward and for a chunk of queries over earlier keys alike.
Grid rows that hold no query have zero output-gradient; their q, output and log-sum-exp are zero, so their
probabilities are finite and every term they add to dK / dV is an exact zero. Sequences are batched by their
span (the highest query position rounded up to a key block), so no sequence is padded past its own span.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KEY_BLOCK = 64  # the blocked attention's key block (attention.KEY_BLOCK); spans are multiples of it


def _flash_backward_op():
    try:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    except (AttributeError, RuntimeError):
        return None


FLASH_BACKWARD = _flash_backward_op()


@dataclass(frozen=True)
class SpanGroup:
    """Sequences whose highest query position rounds up to the same span, and where their queries go."""

    seqs: torch.Tensor  # [g] buffer sequence ids
    span: int  # keys (and grid rows) per sequence: a multiple of KEY_BLOCK
    tokens: torch.Tensor  # [n] indices into the call's query tokens
    slots: torch.Tensor  # [n] row of each of those tokens in the flat [g * span] grid
    pad: torch.Tensor  # grid rows that hold no query (zeros in every grid)
    all_tokens: bool  # tokens is arange(T): every query of the call, in call order
    first_seqs: bool  # seqs is arange(g): the buffer's first g sequences (K/V read as views)


def span_groups(q_seq: torch.Tensor, q_pos: torch.Tensor) -> list[SpanGroup] | None:
    """The span groups of a call's queries, or None when a (sequence, position) pair repeats (the grid would
    hold two queries in one row; the caller then keeps its own backward)."""
    t = q_seq.numel()
    if t == 0:
        return []
    num_seqs = int(q_seq.max()) + 1
    top = torch.full((num_seqs,), -1, dtype=q_pos.dtype).scatter_reduce_(0, q_seq, q_pos, "amax")
    top_pos = int(q_pos.max()) + 1
    if torch.unique(q_seq * top_pos + q_pos).numel() != t:
        return None
    spans = torch.div(top, KEY_BLOCK, rounding_mode="floor") * KEY_BLOCK + KEY_BLOCK
    groups = []
    for span in torch.unique(spans[top >= 0]).tolist():
        seqs = ((spans == span) & (top >= 0)).nonzero().squeeze(1)
        rank = torch.full((num_seqs,), -1, dtype=torch.long)
        rank[seqs] = torch.arange(seqs.numel())
        tokens = (rank[q_seq] >= 0).nonzero().squeeze(1)
        slots = rank[q_seq[tokens]] * span + q_pos[tokens]
        empty = torch.ones(seqs.numel() * span, dtype=torch.bool)
        empty[slots] = False
        groups.append(
            SpanGroup(
                seqs,
                int(span),
                tokens,
                slots,
                pad=empty.nonzero().squeeze(1),
                all_tokens=tokens.numel() == t,  # (tokens ascend: all of them is arange(t))
                first_seqs=bool(torch.equal(seqs, torch.arange(seqs.numel()))),
            )
        )
    return groups


def _grid(x: torch.Tensor, g: SpanGroup) -> torch.Tensor:
    """x [T, *rest] (the call's rows; the group's tokens are placed) at their slots of a zero fp32
    [g * span, *rest] grid, in that memory layout: row p of sequence i is grid row i * span + p."""
    rows = x if g.all_tokens else x.index_select(0, g.tokens)
    grid = torch.empty(g.seqs.numel() * g.span, *x.shape[1:], dtype=torch.float32, device=x.device)
    return grid.index_fill_(0, g.pad, 0.0).index_copy_(0, g.slots, rows.float())


def _group_keys(x: torch.Tensor, g: SpanGroup) -> torch.Tensor:
    """K or V [S, Hkv, L, D] of the group's sequences and its span, fp32 [g, Hkv, span, D] (a view where it
    can be one: fp32 buffer, the first sequences)."""
    x = x[: g.seqs.numel()] if g.first_seqs else x.index_select(0, g.seqs)
    return x[:, :, : g.span].float()


def flash_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    groups: list[SpanGroup],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 (dq [T, H, D], dk, dv [S, Hkv, L, D]) of causal attention whose forward gave ``out`` [T, H, D]
    and ``lse`` [T, H] (per-row log-sum-exp of the scaled scores), keys/values in k, v [S, Hkv, L, D].

    The kernel has no grouped-query form that sums a kv head's gradient over its query heads in this order,
    so it runs once per query head *within* a group (index i of every kv head's `group` query heads): each
    call's heads are [Hkv] strided views of the query grids and read their kv heads' K/V in place (no
    repeated copy of K/V per query head). Per (sequence, head) the kernel's arithmetic is the same as in one
    call over all heads with K/V repeated, and the per-kv-head sums run over the group index in the same
    order (one slice after another, as a sum over that dim adds them), so the gradients are those bits.
    """
    t, h, d = q.shape
    hkv = k.shape[1]
    group = h // hkv
    dq = torch.zeros(q.shape, dtype=torch.float32) if not _covers_all(groups, t) else None
    dk = torch.zeros(k.shape, dtype=torch.float32)
    dv = torch.zeros(v.shape, dtype=torch.float32)
    for g in groups:
        n, span = g.seqs.numel(), g.span
        # grids [n * span, H, D] seen as [n, span, Hkv, group, D]: query head j = kv head j // group, index
        # j % group
        grids = [_grid(x, g).view(n, span, hkv, group, d) for x in (q, grad_out, out)]
        lse_grid = _grid(lse, g).view(n, span, hkv, group)
        keys, values = _group_keys(k, g), _group_keys(v, g)
        dq_grid = torch.empty(n, span, hkv, group, d)
        dks, dvs = [], []
        for i in range(group):
            qi, gi, oi = (x[:, :, :, i].transpose(1, 2) for x in grids)  # [n, Hkv, span, D] views
            gq, gk, gv = FLASH_BACKWARD(
                gi, qi, keys, values, oi, lse_grid[:, :, :, i].transpose(1, 2).contiguous(), 0.0, True,
                attn_mask=None, scale=scale,
            )  # fmt: skip
            dq_grid[:, :, :, i] = gq.transpose(1, 2)
            dks.append(gk)
            dvs.append(gv)
        rows = dq_grid.view(n * span, h, d).index_select(0, g.slots)
        if dq is None:
            dq = rows
        else:
            dq.index_copy_(0, g.tokens, rows)
        dk[g.seqs, :, :span] = _sum_in_order(dks)
        dv[g.seqs, :, :span] = _sum_in_order(dvs)
    return dq, dk, dv


def _sum_in_order(parts: list[torch.Tensor]) -> torch.Tensor:
    """((parts[0] + parts[1]) + parts[2]) + ...: the order in which a sum over a small dim adds its slices"""
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def _covers_all(groups: list[SpanGroup], t: int) -> bool:
    """Whether one group holds every query of the call (the packed training forward of equal-span
    sequences): its rows are dq itself, in order."""
    return len(groups) == 1 and groups[0].all_tokens and t > 0
