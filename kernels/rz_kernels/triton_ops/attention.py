"""Causal GQA attention in Triton with query tiles aligned to absolute positions and a fixed split of
the key range.

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
call are computed on zeros and dropped.

One tile shape for every mode: a tile has BLOCK_M = max(16, G2) rows (16 is tl.dot's minimum), so a
decode tile is the G2 heads of its one token padded to 16 rows (Qwen3-4B, G = 4: 4 of 16 rows live, where
a 64-row tile had 4 of 64), and the prefill / trainer tile is the same 16 rows (TILE_POS = 16 // G2
positions). Every mode therefore issues the identical q.k^T and p.v dots ([16, D] x [D, 64], same
dtype, same warps: the same MMA instruction on Hopper, where a 64-row tile would compile to wgmma and a
16-row one to mma.sync, with no promise that a row's sum comes out the same). The cost is on the
prefill / trainer side: m16 MMAs instead of wgmma, and each key block is loaded once per 16 query rows
instead of per 64 (4x the L2 reads of K/V); the backward uses the same plan and tile.

Split-KV: the key range of every query is cut into splits of SPLIT_BLOCKS key blocks (SPLIT_BLOCKS *
BLOCK_N = 512 keys, vLLM's paged-attention v2 partition size) at positions that are multiples of 512,
whatever the batch. Within a split the keys are walked in BLOCK_N blocks with an online softmax (fp32)
from a fresh state (m = -inf, l = 0, acc = 0), by one helper (`_split_partial`); the splits' partial
(m, l, acc) are folded in split order 0, 1, 2, ... from that fresh state by one helper (`_combine`),
and the output and log2-sum-exp come from one helper (`_finish`). Prefill, chunked prefill and the
trainer's packed forward run the splits one after the other inside one program per (tile, kv head);
a decode step (the plan built with ``decode_positions``) runs one program per (token, kv head, split),
writing the partials to a scratch buffer, then a combine kernel folds them with the same helper, in
the same order. The same helpers on the same inputs in the same order: decode = prefill = chunked =
training, bit for bit, by construction. The decode grid's split count is an upper bound the host
knows (the highest position: the engine passes it, the CUDA-graph step passes its capacity); programs
past their token's last split exit at once, so the plan reads nothing back and stays capturable.
Blocks past a row's own position are fully masked for that row and leave its state exactly unchanged
(factor exp2(0) = 1, additions of exact zeros); a split fully masked for a row likewise.
Why 512 keys: at Qwen3-4B decode (8 kv heads) batch 4 at 2K context runs 4 x 8 x 4 = 128 programs on
132 SMs (32 without splits); each split reads 512 keys of K and V (256 KiB at D = 128, bf16) against a
2 KiB fp32 partial, so the scratch traffic is under 1%; smaller splits add partials and combine steps
for every mode, larger ones leave the SMs idle at the batch sizes where decode is latency-bound.

Backward: FlashAttention-2 style recompute from the saved (combined) log-sum-exp, which needs no
split: one kernel for dQ (per tile), one for dK/dV (per key block, walking the tiles of its sequence).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rz_kernels.triton_ops.gemm import precision_for

MIN_BLOCK_M = 16  # rows per tile: max(16, G2) in every mode (tl.dot's minimum M)
BLOCK_N = 64  # keys per block (= one page of the paged KV cache)
SPLIT_BLOCKS = 8  # key blocks per split: splits start at multiples of 512 positions
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
    block_m: int = MIN_BLOCK_M  # rows per tile, the same in every mode
    decode_splits: int = 0  # > 0: a decode step, one program per (token, kv head, split) up to this bound

    @property
    def num_tiles(self) -> int:
        return self.tile_seq.numel()


def split_count(max_position: int) -> int:
    """Splits of the key range of a query at ``max_position`` (an upper bound for a decode grid)."""
    return max_position // (SPLIT_BLOCKS * BLOCK_N) + 1


def tile_rows(num_heads: int, num_kv_heads: int) -> int:
    """Rows of every attention tile for this head layout (max(16, G2)), in every mode."""
    return max(MIN_BLOCK_M, triton.next_power_of_2(num_heads // num_kv_heads))


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
    a graph replays with other positions; only ``max_position``, or without it the highest of them,
    bounds the split grid). The tiles are the general plan's, in query order; the step runs split-KV.

    Without ``decode_positions`` (prefill, chunked prefill, the trainer's packed forward) the tiles are the
    distinct (sequence, tile) keys: ``torch.unique`` reads their count back to the host, one host sync per
    forward (the plan serves every layer and the backward). It is the one data-dependent host read left in
    a learner micro-batch (tests/kernels/triton_ops/test_learner_micro_batch_host_reads.py)."""
    group = num_heads // num_kv_heads
    g2 = triton.next_power_of_2(group)
    if g2 > 64:
        raise ValueError(f"{group} query heads per kv head exceed the attention tile (64 rows)")
    block_m = tile_rows(num_heads, num_kv_heads)
    tile_pos = block_m // g2
    t = q_seq.numel()
    device = q_seq.device

    def plan(n, tile_tokens, tile_seq, tile_start, tile_last, splits=0) -> TritonAttentionPlan:
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
            block_m,
            splits,
        )

    if t == 0:
        empty = torch.zeros(0, dtype=torch.int32, device=device)
        return plan(0, empty.view(0, tile_pos), empty, empty, empty)
    q_seq = q_seq.long()
    q_pos = q_pos.long()
    if page_table is not None:
        page_table = page_table.to(torch.int32).contiguous()  # once per forward, not per layer
    if decode_positions is not None:  # one token per tile: every tile is its token's own
        top = max_position if max_position is not None else max(int(p) for p in decode_positions)
        slot = torch.arange(tile_pos, device=device).view(1, tile_pos)
        token = torch.arange(t, dtype=torch.int32, device=device).view(t, 1)
        tile_tokens = torch.where(slot == (q_pos % tile_pos).view(t, 1), token, -1)
        return plan(t, tile_tokens, q_seq, q_pos // tile_pos * tile_pos, q_pos, split_count(top))
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


@triton.jit
def _tile_queries(
    q_ptr, tile_tokens, tile_seq, tile_start, tile, kvh, stride_qt, stride_qh, G,
    G2: tl.constexpr, TILE_POS: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """A forward tile's rows (``_tile_rows``), its sequence, each row's position and its queries (zeros on
    absent rows): what the prefill and the decode-split kernels both start from."""
    tok, head, present, p_off = _tile_rows(tile_tokens, tile, kvh, G, G2, TILE_POS, BLOCK_M)
    seq = tl.load(tile_seq + tile).to(tl.int64)
    row_pos = tl.load(tile_start + tile) + p_off
    d = tl.arange(0, HEAD_D)
    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=present[:, None],
        other=0.0,
    )
    return tok, head, present, seq, row_pos, q


@triton.jit
def _split_partial(
    q,
    k_ptr,
    v_ptr,
    page_ptr,
    seq,
    kvh,
    row_pos,
    j_lo,
    j_hi,
    stride_pt,
    stride_ks,
    stride_kh,
    stride_kl,
    stride_vs,
    stride_vh,
    stride_vl,
    L,
    scale_log2,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    PAGED: tl.constexpr,
):
    """Online softmax of one split (key blocks j_lo .. j_hi - 1) from a fresh state: its (m, l, acc)."""
    d = tl.arange(0, HEAD_D)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_D), tl.float32)
    for j in range(j_lo, j_hi):
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
    return m_i, l_i, acc


@triton.jit
def _combine(m, l_i, acc, m_s, l_s, acc_s):
    """Fold one split's partial (m_s, l_s, acc_s) into the running (m, l, acc); explicit fma, so no
    compiler contracts it differently in the two kernels that call it."""
    m_new = tl.maximum(m, m_s)
    ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row no split has reached stays (-inf, 0, 0)
    a = tl.math.exp2(m - ref)
    b = tl.math.exp2(m_s - ref)
    l_new = tl.math.fma(l_i, a, l_s * b)
    a2 = tl.broadcast_to(a[:, None], acc.shape)
    acc_new = tl.math.fma(acc, a2, acc_s * b[:, None])
    return m_new, l_new, acc_new


@triton.jit
def _finish(o_ptr, lse_ptr, tok, head, present, stride_ot, stride_oh, H, m, l_i, acc, HEAD_D: tl.constexpr):
    """Store a tile's output rows and their log2-sum-exp."""
    d = tl.arange(0, HEAD_D)
    out = acc / l_i[:, None]
    tl.store(
        o_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=present[:, None],
    )
    tl.store(lse_ptr + tok * H + head, m + tl.math.log2(l_i), mask=present)


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
    SPLIT_BLOCKS: tl.constexpr,
    PRECISION: tl.constexpr,
    PAGED: tl.constexpr,
):
    """One program per (tile, kv head): the tile's splits one after the other, folded in order."""
    tile = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    tok, head, present, seq, row_pos, q = _tile_queries(
        q_ptr,
        tile_tokens,
        tile_seq,
        tile_start,
        tile,
        kvh,
        stride_qt,
        stride_qh,
        G,
        G2,
        TILE_POS,
        HEAD_D,
        BLOCK_M,
    )
    n_blocks = tl.load(tile_blocks + tile)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_D), tl.float32)
    for s in range(0, tl.cdiv(n_blocks, SPLIT_BLOCKS)):
        j_lo = s * SPLIT_BLOCKS
        m_s, l_s, acc_s = _split_partial(
            q, k_ptr, v_ptr, page_ptr, seq, kvh, row_pos, j_lo, tl.minimum(j_lo + SPLIT_BLOCKS, n_blocks),
            stride_pt, stride_ks, stride_kh, stride_kl, stride_vs, stride_vh, stride_vl, L, scale_log2,
            HEAD_D, BLOCK_M, BLOCK_N, PRECISION, PAGED,
        )  # fmt: skip
        m, l_i, acc = _combine(m, l_i, acc, m_s, l_s, acc_s)
    _finish(o_ptr, lse_ptr, tok, head, present, stride_ot, stride_oh, H, m, l_i, acc, HEAD_D)


@triton.jit(do_not_specialize=["L", "NUM_SPLITS"])
def _attn_decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    part_m,
    part_l,
    part_acc,
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
    H,
    L,
    G,
    NUM_SPLITS,
    scale_log2,
    G2: tl.constexpr,
    TILE_POS: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT_BLOCKS: tl.constexpr,
    PRECISION: tl.constexpr,
    PAGED: tl.constexpr,
):
    """One program per (token's tile, kv head, split): the split's partial (m, l, acc) to the scratch.
    Splits past the token's last key block do nothing (the grid is an upper bound)."""
    tile = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    s = tl.program_id(2)
    n_blocks = tl.load(tile_blocks + tile)
    j_lo = s * SPLIT_BLOCKS
    if j_lo < n_blocks:
        tok, head, present, seq, row_pos, q = _tile_queries(
            q_ptr, tile_tokens, tile_seq, tile_start, tile, kvh, stride_qt, stride_qh, G, G2, TILE_POS,
            HEAD_D, BLOCK_M,
        )  # fmt: skip
        d = tl.arange(0, HEAD_D)
        m_s, l_s, acc_s = _split_partial(
            q, k_ptr, v_ptr, page_ptr, seq, kvh, row_pos, j_lo, tl.minimum(j_lo + SPLIT_BLOCKS, n_blocks),
            stride_pt, stride_ks, stride_kh, stride_kl, stride_vs, stride_vh, stride_vl, L, scale_log2,
            HEAD_D, BLOCK_M, BLOCK_N, PRECISION, PAGED,
        )  # fmt: skip
        row = (tok * H + head) * NUM_SPLITS + s
        tl.store(part_m + row, m_s, mask=present)
        tl.store(part_l + row, l_s, mask=present)
        tl.store(part_acc + row[:, None] * HEAD_D + d[None, :], acc_s, mask=present[:, None])


@triton.jit(do_not_specialize=["NUM_SPLITS"])
def _attn_decode_combine_kernel(
    part_m,
    part_l,
    part_acc,
    o_ptr,
    lse_ptr,
    tile_tokens,
    tile_blocks,
    stride_ot,
    stride_oh,
    H,
    G,
    NUM_SPLITS,
    G2: tl.constexpr,
    TILE_POS: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SPLIT_BLOCKS: tl.constexpr,
):
    """One program per (token's tile, kv head): fold the token's splits in order 0, 1, ... (the prefill
    kernel's fold, on the same tile rows), then store as the prefill kernel does."""
    tile = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    tok, head, present, p_off = _tile_rows(tile_tokens, tile, kvh, G, G2, TILE_POS, BLOCK_M)
    n_blocks = tl.load(tile_blocks + tile)
    d = tl.arange(0, HEAD_D)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_D), tl.float32)
    for s in range(0, tl.cdiv(n_blocks, SPLIT_BLOCKS)):
        row = (tok * H + head) * NUM_SPLITS + s
        m_s = tl.load(part_m + row, mask=present, other=0.0)  # absent rows fold a neutral (0, 1, 0)
        l_s = tl.load(part_l + row, mask=present, other=1.0)
        acc_s = tl.load(part_acc + row[:, None] * HEAD_D + d[None, :], mask=present[:, None], other=0.0)
        m, l_i, acc = _combine(m, l_i, acc, m_s, l_s, acc_s)
    _finish(o_ptr, lse_ptr, tok, head, present, stride_ot, stride_oh, H, m, l_i, acc, HEAD_D)


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


def _check_inputs(q, k, v, plan: TritonAttentionPlan):
    """The head dim, layouts and pages the kernels need; returns q contiguous and the page table."""
    d = q.shape[-1]
    if triton.next_power_of_2(d) != d or d < 16:
        raise ValueError(f"Triton attention needs a power-of-two head_dim >= 16, got {d}")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("Triton attention needs contiguous head_dim in the key/value buffers")
    pages = plan.page_table
    if pages is not None:
        if k.shape[2] != BLOCK_N:
            raise ValueError(f"paged attention needs pages of {BLOCK_N} positions, got {k.shape[2]}")
        pages = pages.to(torch.int32).contiguous()
    return q.contiguous(), pages


def _kv_args(k, v, pages):
    """The page-table pointer and stride, then the K/V strides, as every forward kernel takes them."""
    return (
        pages if pages is not None else k,
        pages.stride(0) if pages is not None else 0,
    ), (k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2))


def _constexprs(plan: TritonAttentionPlan, q) -> dict:
    return dict(
        G2=plan.group_pow2,
        TILE_POS=plan.tile_pos,
        HEAD_D=q.shape[-1],
        BLOCK_M=plan.block_m,
        BLOCK_N=BLOCK_N,
        PRECISION=precision_for(q.dtype),
        num_warps=_warps(q.shape[-1]),
        num_stages=2,
    )


def decode_partials(q, k, v, plan: TritonAttentionPlan, scale: float):
    """A decode plan's per-split partials: m, l [T, H, splits] and acc [T, H, splits, D] (fp32), the
    scratch the combine kernel folds; entries past a token's last split are left unwritten."""
    t, h, d = q.shape
    q, pages = _check_inputs(q, k, v, plan)
    n = plan.decode_splits
    part_m = torch.empty(t, h, n, dtype=torch.float32, device=q.device)
    part_l = torch.empty(t, h, n, dtype=torch.float32, device=q.device)
    part_acc = torch.empty(t, h, n, d, dtype=torch.float32, device=q.device)
    page_args, kv_strides = _kv_args(k, v, pages)
    _attn_decode_split_kernel[(plan.num_tiles, plan.num_kv_heads, n)](
        q, k, v, part_m, part_l, part_acc,
        plan.tile_tokens, plan.tile_seq, plan.tile_start, plan.tile_blocks, *page_args,
        q.stride(0), q.stride(1), *kv_strides, h, k.shape[2], plan.group, n, scale * LOG2E,
        SPLIT_BLOCKS=SPLIT_BLOCKS, PAGED=pages is not None, **_constexprs(plan, q),
    )  # fmt: skip
    return part_m, part_l, part_acc


def _forward(q, k, v, plan: TritonAttentionPlan, scale: float):
    t, h, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(t, h, dtype=torch.float32, device=q.device)
    if t == 0 or plan.num_tiles == 0:
        return out, lse
    if plan.decode_splits:
        part_m, part_l, part_acc = decode_partials(q, k, v, plan, scale)
        _attn_decode_combine_kernel[(plan.num_tiles, plan.num_kv_heads)](
            part_m, part_l, part_acc, out, lse, plan.tile_tokens, plan.tile_blocks,
            out.stride(0), out.stride(1), h, plan.group, plan.decode_splits,
            G2=plan.group_pow2, TILE_POS=plan.tile_pos, HEAD_D=d, BLOCK_M=plan.block_m,
            SPLIT_BLOCKS=SPLIT_BLOCKS, num_warps=_warps(d),
        )  # fmt: skip
        return out, lse
    q, pages = _check_inputs(q, k, v, plan)
    page_args, kv_strides = _kv_args(k, v, pages)
    _attn_fwd_kernel[(plan.num_tiles, plan.num_kv_heads)](
        q, k, v, out, lse, plan.tile_tokens, plan.tile_seq, plan.tile_start, plan.tile_blocks, *page_args,
        q.stride(0), q.stride(1), *kv_strides, out.stride(0), out.stride(1), h, k.shape[2], plan.group,
        scale * LOG2E, SPLIT_BLOCKS=SPLIT_BLOCKS, PAGED=pages is not None, **_constexprs(plan, q),
    )  # fmt: skip
    return out, lse


def _backward(q, k, v, out, lse, grad_out, plan: TritonAttentionPlan, scale: float):
    t, h, d = q.shape
    s, hkv, length, _ = k.shape
    grad_out = grad_out.contiguous()
    delta = (grad_out.float() * out.float()).sum(-1).contiguous()  # [T, H]
    dq = torch.empty_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    common = _constexprs(plan, q)
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
        if plan.decode_splits:
            raise ValueError("a decode plan (decode_positions) is inference-only (no backward)")
        return _Attention.apply(q, k.contiguous(), v.contiguous(), plan, scale)
    return _forward(q, k, v, plan, scale)[0]


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
