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
        groups.append(SpanGroup(seqs, int(span), tokens, slots))
    return groups


def _grid(x: torch.Tensor, g: SpanGroup) -> torch.Tensor:
    """x [n, H, *rest] (the group's tokens' rows) placed at their slots of a zero [g, H, span, *rest] grid."""
    rest = x.shape[1:]
    grid = x.new_zeros(g.seqs.numel() * g.span, *rest).index_copy_(0, g.slots, x)
    return grid.view(g.seqs.numel(), g.span, *rest).transpose(1, 2)


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
    and ``lse`` [T, H] (per-row log-sum-exp of the scaled scores), keys/values in k, v [S, Hkv, L, D]."""
    _, h, d = q.shape
    hkv = k.shape[1]
    group = h // hkv
    dq = torch.zeros(q.shape, dtype=torch.float32)
    dk = torch.zeros(k.shape, dtype=torch.float32)
    dv = torch.zeros(v.shape, dtype=torch.float32)
    for g in groups:
        n = g.seqs.numel()
        rows = [_grid(x[g.tokens].float(), g) for x in (q, grad_out, out)]
        lse_grid = _grid(lse[g.tokens].float(), g).contiguous()
        # every query head reads its kv head's keys: the kernel has no grouped-query form
        kv = [
            x.index_select(0, g.seqs)[:, :, : g.span].float().repeat_interleave(group, dim=1) for x in (k, v)
        ]
        gq, gk, gv = FLASH_BACKWARD(
            rows[1], rows[0], kv[0], kv[1], rows[2], lse_grid, 0.0, True, attn_mask=None, scale=scale
        )
        dq[g.tokens] = gq.transpose(1, 2).reshape(n * g.span, h, d)[g.slots]
        dk[g.seqs, :, : g.span] = gk.reshape(n, hkv, group, g.span, d).sum(2)
        dv[g.seqs, :, : g.span] = gv.reshape(n, hkv, group, g.span, d).sum(2)
    return dq, dk, dv
