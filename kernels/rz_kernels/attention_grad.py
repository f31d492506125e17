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

The kernel walks each query block against every key of its key block (up to 512 keys: the whole span of
a short sequence), so its cost grows with the grid's query rows. The grid holds only the rows up to the
group's highest query position (the keys stay the whole span): rows past every query add exact zeros, and the
kernel's query block size is chosen from the row count in classes (``Q_SPLIT_FLOORS``), so the grid keeps
at least the floor of its span's class and runs the same blocks, with the same bits, as the full span.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KEY_BLOCK = 64  # the blocked attention's key block (attention.KEY_BLOCK); spans are multiples of it
# The CPU flash backward's query block is 256 rows from 768 query rows on, 64 from 192, else 32 (its
# dispatcher); a grid of `span` key rows trimmed to fewer query rows stays in the class of `span`.
Q_SPLIT_FLOORS = (768, 192, 0)


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
    span: int  # keys per sequence: a multiple of KEY_BLOCK
    rows: int  # query rows per sequence in the grids (<= span; see the module docstring)
    tokens: torch.Tensor  # [n] indices into the call's query tokens
    slots: torch.Tensor  # [n] row of each of those tokens in the flat [g * rows] grid
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
        rows = _grid_rows(int(top[seqs].max()) + 1, int(span))
        slots = rank[q_seq[tokens]] * rows + q_pos[tokens]
        empty = torch.ones(seqs.numel() * rows, dtype=torch.bool)
        empty[slots] = False
        groups.append(
            SpanGroup(
                seqs,
                int(span),
                rows,
                tokens,
                slots,
                pad=empty.nonzero().squeeze(1),
                all_tokens=tokens.numel() == t,  # (tokens ascend: all of them is arange(t))
                first_seqs=bool(torch.equal(seqs, torch.arange(seqs.numel()))),
            )
        )
    return groups


def _grid_rows(queries: int, span: int) -> int:
    """Query rows of a grid whose sequences' highest query is row ``queries - 1``: that many, or the floor of
    the span's query-block class."""
    floor = next(f for f in Q_SPLIT_FLOORS if span >= f)
    return max(queries, floor)


def _grid(x: torch.Tensor, g: SpanGroup) -> torch.Tensor:
    """x [T, *rest] (the call's rows; the group's tokens are placed) at their slots of a zero fp32
    [g * rows, *rest] grid, in that memory layout: row p of sequence i is grid row i * rows + p."""
    rows = x if g.all_tokens else x.index_select(0, g.tokens)
    grid = torch.empty(g.seqs.numel() * g.rows, *x.shape[1:], dtype=torch.float32, device=x.device)
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

    The kernel's own grouped-query form sums a kv head's gradient over its query heads in another order, so
    with `group` query heads per kv head it runs once per kv head: its `group` heads are a strided view of the
    query grids, and its K/V the kv head's, read in place and broadcast over those heads (stride 0: no
    repeated copy). Per (sequence, query head) the kernel's arithmetic is the one of a single call over all
    heads with K/V repeated; its dK / dV land in the layout that call gives them and are summed over each kv
    head's query heads by the same reduction (whose order depends on the layout); and every call has at
    least two (sequence, head) items, so at several threads each item runs inside the kernel's parallel loop
    (single-threaded BLAS) as it did in the single call. The gradients are that call's bits.
    """
    t, h, d = q.shape
    hkv = k.shape[1]
    group = h // hkv
    dq = torch.zeros(q.shape, dtype=torch.float32) if not _covers_all(groups, t) else None
    dk = torch.zeros(k.shape, dtype=torch.float32)
    dv = torch.zeros(v.shape, dtype=torch.float32)
    for g in groups:
        n, span, rows = g.seqs.numel(), g.span, g.rows
        # grids [n * rows, H, D] seen as [n, rows, Hkv, group, D] (query head i = kv head i // group)
        grids = [_grid(x, g).view(n, rows, hkv, group, d) for x in (q, grad_out, out)]
        lse_grid = _grid(lse, g).view(n, rows, hkv, group)
        keys, values = _group_keys(k, g), _group_keys(v, g)  # [n, Hkv, span, D]
        dq_grid = torch.empty(n, rows, hkv, group, d)
        # the kernel's dK / dV for every query head, laid out as one call over all heads lays them out
        dkv = [torch.empty(n, span, h, d).transpose(1, 2) for _ in range(2)] if group > 1 else []
        # one call over every head when each has its own K/V; else one per kv head
        calls = [slice(None)] if group == 1 else [slice(j, j + 1) for j in range(hkv)]
        for j in calls:
            heads = [x[:, :, j].reshape(n, rows, -1, d).transpose(1, 2) for x in grids]  # [n, heads, rows, D]
            kv = [x[:, j].expand(n, heads[0].shape[1], span, d) for x in (keys, values)]
            lse_heads = lse_grid[:, :, j].reshape(n, rows, -1).transpose(1, 2).contiguous()
            gq, gk, gv = FLASH_BACKWARD(
                heads[1], heads[0], *kv, heads[2], lse_heads, 0.0, True, attn_mask=None, scale=scale
            )
            dq_grid[:, :, j] = gq.transpose(1, 2).view(n, rows, -1, group, d)
            if group == 1:
                dkv = [gk, gv]  # (the one call's own)
            else:
                dkv[0][:, j.start * group : j.stop * group] = gk
                dkv[1][:, j.start * group : j.stop * group] = gv
        # summed over each kv head's query heads by the same reduction over the same layout as before
        dk[g.seqs, :, :span] = dkv[0].reshape(n, hkv, group, span, d).sum(2)
        dv[g.seqs, :, :span] = dkv[1].reshape(n, hkv, group, span, d).sum(2)
        placed = dq_grid.view(n * rows, h, d).index_select(0, g.slots)
        if dq is None:
            dq = placed
        else:
            dq.index_copy_(0, g.tokens, placed)
    return dq, dk, dv


def _covers_all(groups: list[SpanGroup], t: int) -> bool:
    """Whether one group holds every query of the call (the packed training forward of equal-span
    sequences): its rows are dq itself, in order."""
    return len(groups) == 1 and groups[0].all_tokens and t > 0
