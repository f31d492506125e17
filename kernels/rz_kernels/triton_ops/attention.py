"""Causal GQA attention in Triton with query tiles aligned to absolute positions.

Same interface as the CPU op sets (rz_kernels.attention): `plan_attention(q_seq, q_pos, H, Hkv)` once
per forward, then `attention(q, k, v, plan, scale)` per layer, with q [T, H, D] and k, v
[S, Hkv, L, D] buffers addressed by (sequence, position), or, with a page table in the plan, pages
[P, Hkv, 64, D] where key block j of sequence s is page page_table[s, j] (a page is one BLOCK_N key
block, so the walk loads the same keys in the same order and the bits do not change).

Alignment: a tile holds the queries of one sequence whose positions fall in
[j * TILE_POS, (j + 1) * TILE_POS) for a tile index j = pos // TILE_POS, times the G query heads that
share one kv head; row r of a tile is always (pos % TILE_POS) * G2 + group member (G2 = G rounded up
to a power of two). A query therefore sits at the same row of the same tile whether it comes in a full
prefill, a chunk, a one-token decode or the packed training forward; rows of queries absent from the
call are computed on zeros and dropped. Keys are walked from position 0 in fixed BLOCK_N blocks with an
online softmax (fp32); a tile walks up to the block of its last present query, and the blocks past a
row's own position are fully masked for that row, which leaves its running max, sum and accumulator
exactly unchanged (factor exp2(0) = 1, additions of exact zeros). One kernel serves every mode.

Backward: FlashAttention-2 style recompute from the saved log-sum-exp: one kernel for dQ (per tile),
one for dK/dV (per key block, walking the tiles of its sequence).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rz_kernels.triton_ops.gemm import precision_for

BLOCK_M = 64  # rows per tile (positions x padded group)
BLOCK_N = 64  # keys per block
LOG2E = 1.4426950408889634


@dataclass
class TritonAttentionPlan:
    """Tile layout of one call, shared by every layer of a forward."""

    num_tokens: int
    num_heads: int
    num_kv_heads: int
    group: int  # query heads per kv head
    group_pow2: int  # rows per position in a tile
    tile_pos: int  # positions per tile
    tile_tokens: torch.Tensor  # [NT, tile_pos] int32: token index of each position, -1 if absent
    tile_seq: torch.Tensor  # [NT] int32 buffer sequence
    tile_start: torch.Tensor  # [NT] int32 first position
    tile_blocks: torch.Tensor  # [NT] int32 key blocks to walk
    tile_last: torch.Tensor  # [NT] int32 last present position
    page_table: torch.Tensor | None = None  # [S, W] page of each key block (paged KV cache)

    @property
    def num_tiles(self) -> int:
        return self.tile_seq.numel()


def plan_attention(
    q_seq: torch.Tensor,
    q_pos: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    page_table: torch.Tensor | None = None,
    max_position: int | None = None,
    decode_positions=None,
):
    """Group the queries into position-aligned tiles (sorted by sequence, then position). ``max_position``:
    the highest of ``q_pos`` when the caller knows it (the engine does): no host sync to read it here.

    ``decode_positions`` given (a decode step: query i is the only token of its sequence q_seq[i]): one
    tile per query, built from the device tensors alone by elementwise ops, so the plan has a fixed shape,
    reads nothing back and can be captured in a CUDA graph (the host positions themselves are not read:
    a graph replays with other positions). The tiles are the general plan's, in query order."""
    group = num_heads // num_kv_heads
    g2 = triton.next_power_of_2(group)
    if g2 > BLOCK_M:
        raise ValueError(f"{group} query heads per kv head exceed the attention tile ({BLOCK_M} rows)")
    tile_pos = BLOCK_M // g2
    t = q_seq.numel()
    device = q_seq.device

    def plan(n, tile_tokens, tile_seq, tile_start, tile_last) -> TritonAttentionPlan:
        """The plan of n queries in these tiles, its tables in int32 as the kernels read them."""
        i32 = torch.int32
        return TritonAttentionPlan(
            n,
            num_heads,
            num_kv_heads,
            group,
            g2,
            tile_pos,
            tile_tokens.to(i32),
            tile_seq.to(i32),
            tile_start.to(i32),
            (tile_last // BLOCK_N + 1).to(i32),
            tile_last.to(i32),
            page_table,
        )

    if t == 0:
        empty = torch.zeros(0, dtype=torch.int32, device=device)
        return plan(0, empty.view(0, tile_pos), empty, empty, empty)
    q_seq = q_seq.long()
    q_pos = q_pos.long()
    if page_table is not None:
        page_table = page_table.to(torch.int32).contiguous()  # once per forward, not per layer
    if decode_positions is not None:  # one token per tile: every tile is its token's own
        slot = torch.arange(tile_pos, device=device).view(1, tile_pos)
        token = torch.arange(t, dtype=torch.int32, device=device).view(t, 1)
        tile_tokens = torch.where(slot == (q_pos % tile_pos).view(t, 1), token, -1)
        return plan(t, tile_tokens, q_seq, q_pos // tile_pos * tile_pos, q_pos)
    top = int(q_pos.max()) if max_position is None else max_position
    tiles_per_seq = top // tile_pos + 1
    keys = q_seq * tiles_per_seq + q_pos // tile_pos
    uniq, inv = torch.unique(keys, return_inverse=True)
    nt = uniq.numel()
    tile_tokens = torch.full((nt, tile_pos), -1, dtype=torch.int32, device=device)
    tile_tokens[inv, q_pos % tile_pos] = torch.arange(t, dtype=torch.int32, device=device)
    tile_last = torch.zeros(nt, dtype=torch.long, device=device).scatter_reduce(0, inv, q_pos, "amax")
    return plan(t, tile_tokens, uniq // tiles_per_seq, (uniq % tiles_per_seq) * tile_pos, tile_last)


@triton.jit
def _tile_rows(tile_tokens, tile, kvh, G, G2: tl.constexpr, TILE_POS: tl.constexpr, BLOCK_M: tl.constexpr):
    """Token, query head, presence and offset of every row of a tile."""
    r = tl.arange(0, BLOCK_M)
    p_off = r // G2
    g = r % G2
    tok = tl.load(tile_tokens + tile * TILE_POS + p_off)
    present = (tok >= 0) & (g < G)
    head = kvh * G + tl.where(g < G, g, 0)
    return tl.where(present, tok, 0).to(tl.int64), head, present, p_off


@triton.jit(do_not_specialize=["L"])
def _attn_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    lse_ptr,
    tile_tokens,
    tile_seq,
    tile_start,
    tile_blocks,
    page_ptr,
    stride_pt,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_kl,
    stride_vs,
    stride_vh,
    stride_vl,
    stride_ot,
    stride_oh,
    H,
    L,
    G,
    scale_log2,
    G2: tl.constexpr,
    TILE_POS: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    PAGED: tl.constexpr,
):
    tile = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    tok, head, present, p_off = _tile_rows(tile_tokens, tile, kvh, G, G2, TILE_POS, BLOCK_M)
    seq = tl.load(tile_seq + tile).to(tl.int64)
    start = tl.load(tile_start + tile)
    n_blocks = tl.load(tile_blocks + tile)
    row_pos = start + p_off
    d = tl.arange(0, HEAD_D)
    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=present[:, None],
        other=0.0,
    )
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_D), tl.float32)
    for j in range(0, n_blocks):
        kpos = j * BLOCK_N + tl.arange(0, BLOCK_N)
        if PAGED:  # block j is one whole page: the page table says which
            page = tl.load(page_ptr + seq * stride_pt + j).to(tl.int64)
            k_base = k_ptr + page * stride_ks + kvh * stride_kh
            v_base = v_ptr + page * stride_vs + kvh * stride_vh
            koff = tl.arange(0, BLOCK_N)
            kmask = koff < BLOCK_N
        else:
            k_base = k_ptr + seq * stride_ks + kvh * stride_kh
            v_base = v_ptr + seq * stride_vs + kvh * stride_vh
            koff = kpos
            kmask = kpos < L
        k = tl.load(
            k_base + koff[None, :].to(tl.int64) * stride_kl + d[:, None], mask=kmask[None, :], other=0.0
        )
        qk = tl.dot(q, k, input_precision=PRECISION) * scale_log2
        qk = tl.where(kpos[None, :] <= row_pos[:, None], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_base + koff[:, None].to(tl.int64) * stride_vl + d[None, :], mask=kmask[:, None], other=0.0
        )
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(
        o_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=present[:, None],
    )
    tl.store(lse_ptr + tok * H + head, m_i + tl.math.log2(l_i), mask=present)


@triton.jit(do_not_specialize=["L"])
def _attn_bwd_dq_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dq_ptr,
    tile_tokens,
    tile_seq,
    tile_start,
    tile_blocks,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_kl,
    stride_vs,
    stride_vh,
    stride_vl,
    H,
    L,
    G,
    scale_log2,
    scale,
    G2: tl.constexpr,
    TILE_POS: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    tile = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    tok, head, present, p_off = _tile_rows(tile_tokens, tile, kvh, G, G2, TILE_POS, BLOCK_M)
    seq = tl.load(tile_seq + tile).to(tl.int64)
    row_pos = tl.load(tile_start + tile) + p_off
    n_blocks = tl.load(tile_blocks + tile)
    d = tl.arange(0, HEAD_D)
    qo = tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + qo, mask=present[:, None], other=0.0)
    do = tl.load(do_ptr + qo, mask=present[:, None], other=0.0)
    lse = tl.load(lse_ptr + tok * H + head, mask=present, other=float("inf"))
    delta = tl.load(delta_ptr + tok * H + head, mask=present, other=0.0)
    k_base = k_ptr + seq * stride_ks + kvh * stride_kh
    v_base = v_ptr + seq * stride_vs + kvh * stride_vh
    dq = tl.zeros((BLOCK_M, HEAD_D), tl.float32)
    for j in range(0, n_blocks):
        kpos = j * BLOCK_N + tl.arange(0, BLOCK_N)
        kmask = kpos < L
        k = tl.load(
            k_base + kpos[:, None].to(tl.int64) * stride_kl + d[None, :], mask=kmask[:, None], other=0.0
        )
        v = tl.load(
            v_base + kpos[:, None].to(tl.int64) * stride_vl + d[None, :], mask=kmask[:, None], other=0.0
        )
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        causal = (kpos[None, :] <= row_pos[:, None]) & present[:, None]
        p = tl.where(causal, tl.math.exp2(qk - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    tl.store(dq_ptr + qo, (dq * scale).to(dq_ptr.dtype.element_ty), mask=present[:, None])


@triton.jit(do_not_specialize=["L"])
def _attn_bwd_dkdv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dk_ptr,
    dv_ptr,
    tile_tokens,
    tile_start,
    tile_last,
    seq_tile_lo,
    seq_tile_hi,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_kl,
    stride_vs,
    stride_vh,
    stride_vl,
    H,
    L,
    G,
    scale_log2,
    scale,
    G2: tl.constexpr,
    TILE_POS: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    jb = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    kvh = tl.program_id(2).to(tl.int64)
    d = tl.arange(0, HEAD_D)
    kpos = jb * BLOCK_N + tl.arange(0, BLOCK_N)
    kmask = kpos < L
    ko = seq * stride_ks + kvh * stride_kh + kpos[:, None].to(tl.int64) * stride_kl + d[None, :]
    vo = seq * stride_vs + kvh * stride_vh + kpos[:, None].to(tl.int64) * stride_vl + d[None, :]
    k = tl.load(k_ptr + ko, mask=kmask[:, None], other=0.0)
    v = tl.load(v_ptr + vo, mask=kmask[:, None], other=0.0)
    dk = tl.zeros((BLOCK_N, HEAD_D), tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_D), tl.float32)
    lo = tl.load(seq_tile_lo + seq)
    hi = tl.load(seq_tile_hi + seq)
    for tile in range(lo, hi):
        if tl.load(tile_last + tile) >= jb * BLOCK_N:  # the tile has a query at or after this block
            tok, head, present, p_off = _tile_rows(tile_tokens, tile, kvh, G, G2, TILE_POS, BLOCK_M)
            row_pos = tl.load(tile_start + tile) + p_off
            qo = tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
            q = tl.load(q_ptr + qo, mask=present[:, None], other=0.0)
            do = tl.load(do_ptr + qo, mask=present[:, None], other=0.0)
            lse = tl.load(lse_ptr + tok * H + head, mask=present, other=float("inf"))
            delta = tl.load(delta_ptr + tok * H + head, mask=present, other=0.0)
            qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
            causal = (kpos[None, :] <= row_pos[:, None]) & present[:, None]
            p = tl.where(causal, tl.math.exp2(qk - lse[:, None]), 0.0)
            dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv, input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            dk = tl.dot(tl.trans(ds.to(q.dtype)), q, dk, input_precision=PRECISION)
    tl.store(dk_ptr + ko, (dk * scale).to(dk_ptr.dtype.element_ty), mask=kmask[:, None])
    tl.store(dv_ptr + vo, dv.to(dv_ptr.dtype.element_ty), mask=kmask[:, None])


def _warps(d: int) -> int:
    return 8 if d >= 128 else 4


def _forward(q, k, v, plan: TritonAttentionPlan, scale: float):
    t, h, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(t, h, dtype=torch.float32, device=q.device)
    if t == 0 or plan.num_tiles == 0:
        return out, lse
    if triton.next_power_of_2(d) != d or d < 16:
        raise ValueError(f"Triton attention needs a power-of-two head_dim >= 16, got {d}")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("Triton attention needs contiguous head_dim in the key/value buffers")
    q = q.contiguous()
    pages = plan.page_table
    if pages is not None:
        if k.shape[2] != BLOCK_N:
            raise ValueError(f"paged attention needs pages of {BLOCK_N} positions, got {k.shape[2]}")
        pages = pages.to(torch.int32).contiguous()
    _attn_fwd_kernel[(plan.num_tiles, plan.num_kv_heads)](
        q,
        k,
        v,
        out,
        lse,
        plan.tile_tokens,
        plan.tile_seq,
        plan.tile_start,
        plan.tile_blocks,
        pages if pages is not None else plan.tile_seq,
        pages.stride(0) if pages is not None else 0,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        h,
        k.shape[2],
        plan.group,
        scale * LOG2E,
        G2=plan.group_pow2,
        TILE_POS=plan.tile_pos,
        HEAD_D=d,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        PRECISION=precision_for(q.dtype),
        PAGED=pages is not None,
        num_warps=_warps(d),
        num_stages=2,
    )
    return out, lse


def _backward(q, k, v, out, lse, grad_out, plan: TritonAttentionPlan, scale: float):
    t, h, d = q.shape
    s, hkv, length, _ = k.shape
    grad_out = grad_out.contiguous()
    delta = (grad_out.float() * out.float()).sum(-1).contiguous()  # [T, H]
    dq = torch.empty_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    common = dict(
        G2=plan.group_pow2,
        TILE_POS=plan.tile_pos,
        HEAD_D=d,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        PRECISION=precision_for(q.dtype),
        num_warps=_warps(d),
        num_stages=2,
    )
    strides = (
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
    )
    _attn_bwd_dq_kernel[(plan.num_tiles, hkv)](
        q, k, v, grad_out, lse, delta, dq,
        plan.tile_tokens, plan.tile_seq, plan.tile_start, plan.tile_blocks,
        *strides, h, length, plan.group, scale * LOG2E, scale, **common,
    )  # fmt: skip
    seqs = torch.arange(s, device=q.device, dtype=plan.tile_seq.dtype)
    lo = torch.searchsorted(plan.tile_seq, seqs).to(torch.int32)
    hi = torch.searchsorted(plan.tile_seq, seqs, right=True).to(torch.int32)
    _attn_bwd_dkdv_kernel[(triton.cdiv(length, BLOCK_N), s, hkv)](
        q, k, v, grad_out, lse, delta, dk, dv,
        plan.tile_tokens, plan.tile_start, plan.tile_last, lo, hi,
        *strides, h, length, plan.group, scale * LOG2E, scale, **common,
    )  # fmt: skip
    return dq, dk, dv


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan, scale):
        out, lse = _forward(q, k, v, plan, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan, ctx.scale = plan, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q.contiguous(), k, v, out, lse, grad_out, ctx.plan, ctx.scale)
        return dq, dk, dv, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: TritonAttentionPlan, scale: float):
    """Aligned causal GQA attention (see module docstring); returns [T, H, D] in q's dtype."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        if plan.page_table is not None:
            raise ValueError("Triton attention over a paged KV cache is inference-only (no backward)")
        return _Attention.apply(q, k.contiguous(), v.contiguous(), plan, scale)
    return _forward(q, k, v, plan, scale)[0]


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
