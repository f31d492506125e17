"""Causal GQA attention over a key/value buffer addressed by (sequence, position).

Both op sets have the same two-step interface: `plan_*(q_seq, q_pos, H, Hkv)` once per forward
(layout and masks depend only on which sequence and position each query has), then per layer
`*_attention(q, k, v, plan, scale)` with
  q      [T, H, D]            queries, already rotated
  k, v   [S, Hkv, L, D]       keys/values of every sequence, position p at index p (zero beyond)
         or, with a page table, [P, Hkv, 64, D] pages: position p of sequence s sits in page
         page_table[s, p // 64] at offset p % 64 (the engine's paged KV cache)
  q_seq  [T]                  which sequence (index into S, or into page_table's rows) each query belongs to
  q_pos  [T]                  absolute position of each query; it attends to keys 0..q_pos
returning [T, H, D] in q's dtype. A page is exactly one key block, so walking a sequence's pages in
position order reads the same 64-key blocks, in the same order, as the contiguous buffer: the
arithmetic and therefore the bits do not depend on where the pages lie in memory.

`blocked_attention` (aligned) gives each query row the same arithmetic whatever else is in the
call. Rows of one (sequence, kv head) are cut into *tiles* (consecutive tokens x the query heads that
share the kv head: `TILE_TOKENS` tokens, halved until the tile fits `MAX_TILE_ROWS` rows). Keys are
walked in fixed `KEY_BLOCK`-sized blocks from absolute position 0; per block, the scores and the
probability-weighted values are GEMMs [rows, D] x [D, 64] and [rows, 64] x [64, D]; the softmax max
is exact (order-free); each block's sum is one fixed-size reduction; and the per-block results are
added in a fixed binary tree over the block index (adjacent pairs, level by level). Blocks past a
row's position contribute exact zeros (masked to -inf -> p = 0), and a tree over absolute block
indices gives the same bits whatever number of trailing zero blocks it is padded with. So a full
prefill, a chunked prefill, a single-token decode and the packed training forward agree bitwise.

The tile size only changes how many rows share a GEMM. That a row's result does not depend on it
is an empirical property of the BLAS (measured: identical from 4 rows up; 1-3 rows take other
kernels), so it is guarded like the linear layers: `verify_tile_rows` checks every tile size the
plan can produce against a 64-row tile before first use, and on failure every tile is padded to
`FIXED_TILE_ROWS` rows (invariant by construction), logged. A decode then pays a 4-row tile for
its `group` real rows instead of a 16-row one.

Memory stays linear in the context: tiles are processed in groups bounded by `WORK_BUDGET`
(scores of one group), long spans read K/V in place instead of gathering them, and in training
the attention is one autograd function that saves only q, K/V, the output and two numbers per row,
recomputing the probabilities tile by tile in the backward (gradients are not part of the
bit-identity contract, only the forward is).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rz_kernels import attention_grad
from rz_kernels.elementwise import aligned_unary

log = logging.getLogger(__name__)

KEY_BLOCK = 64
# Tokens per prefill tile: a power of two dividing KEY_BLOCK, so that the tiles of a sequence that starts at
# position 0 (the learner's packed forward, a first prefill chunk) each sit inside one key block and walk no
# block past it. Halved until tokens x group fits MAX_TILE_ROWS. Only the speed depends on these (bigger
# GEMMs, fewer Python-level ops per layer); every tile size is checked by the guard below.
TILE_TOKENS = KEY_BLOCK
MAX_TILE_ROWS = 192  # the guard's cost grows with this (~1 s at 192 rows, 6 s at 512, one thread)
MIN_TILE_ROWS = 4  # tiles are padded to a multiple of this (BLAS takes GEMV-like paths below 4 rows)
FIXED_TILE_ROWS = 16  # the guard's fallback: every tile exactly this many rows (times ceil(group / 16))
# Score elements (rows x keys) computed at once; bounds the temporary memory of one tile group.
WORK_BUDGET = 1 << 22
# From this many key blocks on, tiles read K/V from the buffer in place, one tile per call, instead
# of gathering the blocks of a batch of tiles into one tensor (a copy as big as the keys).
IN_PLACE_BLOCKS = 16


# -- guard ----------------------------------------------------------------------------------------
_tile_verdicts: dict[tuple[int, int, int], bool] = {}
_tile_lock = threading.Lock()


def verify_tile_rows(head_dim: int, max_rows: int) -> bool:
    """True when block GEMMs give every row the same bits at every tile size 4..max_rows (cached).

    Checks the two GEMMs of a block (scores and weighted values) in fp32 at every multiple of
    MIN_TILE_ROWS up to max_rows, and at several batch counts, against a 64-row tile: each row
    position holds a replicated probe row, so every position of every tile size is compared.
    """
    key = (head_dim, max_rows, torch.get_num_threads())
    ok = _tile_verdicts.get(key)
    if ok is not None:
        return ok
    with _tile_lock:
        ok = _tile_verdicts.get(key)
        if ok is None:
            with torch.inference_mode(False), torch.no_grad():
                ok, failed = _check_tile_rows(head_dim, max_rows)
            _tile_verdicts[key] = ok
            if not ok:
                log.warning(
                    "aligned attention guard: head_dim %d at %d threads gives different rows at tile "
                    "sizes %s; every tile is padded to %d rows",
                    head_dim,
                    key[2],
                    failed,
                    FIXED_TILE_ROWS,
                )
    return ok


def _check_tile_rows(d: int, max_rows: int) -> tuple[bool, list[int]]:
    gen = torch.Generator().manual_seed(d)
    q = torch.randn(64, d, generator=gen)
    k = torch.randn(KEY_BLOCK, d, generator=gen)
    p = torch.rand(64, KEY_BLOCK, generator=gen)
    v = torch.randn(KEY_BLOCK, d, generator=gen)
    ref_s = torch.bmm(q.unsqueeze(0), k.t().unsqueeze(0))[0]
    ref_pv = torch.bmm(p.unsqueeze(0), v.unsqueeze(0))[0]
    ref_sum = p.sum(-1)
    failed = []
    for rows in range(MIN_TILE_ROWS, max(max_rows, 64) + 1, MIN_TILE_ROWS):
        reps = -(-rows // 64)
        for batch in (1, 3, 17):
            qb = q.repeat(reps, 1)[:rows].unsqueeze(0).expand(batch, rows, d).contiguous()
            kb = k.unsqueeze(0).expand(batch, KEY_BLOCK, d).contiguous()
            pb = p.repeat(reps, 1)[:rows].unsqueeze(0).expand(batch, rows, KEY_BLOCK).contiguous()
            vb = v.unsqueeze(0).expand(batch, KEY_BLOCK, d).contiguous()
            s = torch.bmm(qb, kb.transpose(1, 2))
            # one tile's queries against many key blocks: the stride-0 (broadcast) operand
            s0 = torch.bmm(qb[:1].expand(batch, rows, d), kb.transpose(1, 2))
            pv = torch.bmm(pb, vb)
            sums = pb.sum(-1)
            if not (
                torch.equal(s, ref_s.repeat(reps, 1)[:rows].expand(batch, rows, KEY_BLOCK))
                and torch.equal(s0, s)
                and torch.equal(pv, ref_pv.repeat(reps, 1)[:rows].expand(batch, rows, d))
                and torch.equal(sums, ref_sum.repeat(reps)[:rows].expand(batch, rows))
            ):
                failed.append(rows)
                break
    return not failed, failed


def clear_tile_verdicts() -> None:
    """Forget cached guard decisions (tests)."""
    with _tile_lock:
        _tile_verdicts.clear()


# -- plan -----------------------------------------------------------------------------------------
@dataclass
class _Bucket:
    """Tiles with the same row count and key-block count."""

    rows: int  # R: rows per tile (padded)
    num_blocks: int  # nb: key blocks every tile of the bucket walks
    tile_seq: torch.Tensor  # [n] buffer sequence of each tile
    tile_head: torch.Tensor  # [n] kv head of each tile
    row_index: torch.Tensor  # [n, R] index into the flat (token, head) rows; padding -> the zero row
    row_pos: torch.Tensor  # [n, R] absolute position of each row (padding rows: 0)
    groups: list[_TileGroup] | None = None  # the forward's tile groups and masks (built on first use)


@dataclass
class _TileGroup:
    """Tiles of a bucket computed together, with the causal mask of the blocks that need one.

    Built once per plan and reused by every layer. Key blocks before `first_block` lie wholly at or
    before every real row's position, so masking them would change nothing: only blocks from
    `first_block` on are masked (padding rows, at position 0, then see more keys; they are discarded).
    """

    sel: torch.Tensor  # [n] tiles of the bucket
    first_block: int
    future: torch.Tensor  # [n, nb - first_block, R, 64] bool: the key lies past the row's position


class BlockedPlan:
    """Row layout of one call, shared by every layer of a forward (built on first use)."""

    def __init__(
        self,
        q_seq: torch.Tensor,
        q_pos: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        page_table: torch.Tensor | None = None,
        decode_positions: tuple[int, ...] | None = None,
    ) -> None:
        self.q_seq, self.q_pos = q_seq, q_pos
        self.decode_positions = decode_positions  # host positions of a decode step's rows (or None)
        self.page_table = page_table  # [S, W] page of each key block, or None for [S, Hkv, L, D] buffers
        self.num_tokens = q_seq.shape[0]
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self._buckets: dict[int, list[_Bucket]] = {}
        self._span_groups: list[attention_grad.SpanGroup] | None | bool = False  # False: not built yet

    def buckets(self, head_dim: int) -> list[_Bucket]:
        """The tiles, grouped by (rows, key blocks); the tile size depends on the guard for head_dim."""
        got = self._buckets.get(head_dim)
        if got is None:
            if self.decode_positions is not None:
                got = _decode_layout(
                    self.q_seq, self.decode_positions, self.num_heads, self.num_kv_heads, head_dim
                )
            else:
                got = _layout(self.q_seq, self.q_pos, self.num_heads, self.num_kv_heads, head_dim)
            self._buckets[head_dim] = got
        return got

    def span_groups(self) -> list[attention_grad.SpanGroup] | None:
        """The flash backward's layout of this call's queries (attention_grad.span_groups), built once."""
        if self._span_groups is False:
            self._span_groups = attention_grad.span_groups(self.q_seq, self.q_pos)
        return self._span_groups


def verify_attention(group: int, head_dim: int) -> bool:
    """Run the tile-size guard for a model with `group` query heads per kv head (see verify_tile_rows)."""
    return _tile_rows(group, head_dim)[1]


def _tile_rows(group: int, head_dim: int) -> tuple[int, bool]:
    """(rows per full tile, whether partial tiles may be smaller) for this model shape."""
    tokens = TILE_TOKENS
    while tokens > 1 and tokens * group > MAX_TILE_ROWS:
        tokens //= 2
    max_rows = -(-(tokens * group) // MIN_TILE_ROWS) * MIN_TILE_ROWS
    if verify_tile_rows(head_dim, max_rows):
        return max_rows, True
    fixed = -(-group // FIXED_TILE_ROWS) * FIXED_TILE_ROWS
    return fixed, False


def plan_blocked(
    q_seq: torch.Tensor,
    q_pos: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    page_table: torch.Tensor | None = None,
    max_position: int | None = None,
    decode_positions: tuple[int, ...] | None = None,
) -> BlockedPlan:
    """The plan of one forward: which sequence and position every query has (layout built lazily).

    With ``page_table`` [S, W] (long), k/v are pages [P, Hkv, 64, D] and block j of sequence s is
    page ``page_table[s, j]``. ``max_position`` (the highest of ``q_pos``, when the caller knows it) is
    part of the plan interface (the GPU plan reads it instead of syncing); the CPU layout needs no bound.
    ``decode_positions`` (host ints, a decode step: query i is the only token of sequence q_seq[i], at
    that position) lets the layout be grouped on the host, reading nothing back; same tiles, same bits.
    """
    return BlockedPlan(q_seq, q_pos, num_heads, num_kv_heads, page_table, decode_positions)


def _decode_layout(
    q_seq: torch.Tensor, positions: tuple[int, ...], num_heads: int, num_kv_heads: int, head_dim: int
) -> list[_Bucket]:
    """`_layout` of a decode step (one query per sequence), grouped on the host from the known positions.

    Every (query, kv head) is one tile of the `group` query heads padded as `_layout` pads a one-token
    tile; tiles are bucketed by key-block count (pos // 64 + 1) in ascending order, queries in call
    order within a bucket, heads inner. The tiles, and so the bits, are those of `_layout`.
    """
    t = q_seq.shape[0]
    if t == 0:
        return []
    device = q_seq.device
    group = num_heads // num_kv_heads
    full_rows, variable = _tile_rows(group, head_dim)
    rows = -(-group // MIN_TILE_ROWS) * MIN_TILE_ROWS if variable else full_rows
    by_blocks: dict[int, list[int]] = {}
    for i, p in enumerate(positions):
        by_blocks.setdefault(p // KEY_BLOCK + 1, []).append(i)
    h = torch.arange(num_kv_heads, device=device).view(1, num_kv_heads, 1)
    j = torch.arange(rows, device=device).view(1, 1, rows)
    real = j < group
    buckets = []
    for nb in sorted(by_blocks):
        tokens = by_blocks[nb]
        n = len(tokens)
        tok = torch.tensor(tokens, dtype=torch.long, device=device)
        pos = torch.tensor([positions[i] for i in tokens], dtype=torch.long, device=device)
        row_index = torch.where(real, tok.view(n, 1, 1) * num_heads + h * group + j, t * num_heads)
        row_pos = torch.where(real, pos.view(n, 1, 1), 0).expand(n, num_kv_heads, rows)
        buckets.append(
            _Bucket(
                rows,
                nb,
                q_seq[tok].view(n, 1).expand(n, num_kv_heads).reshape(-1),
                torch.arange(num_kv_heads, device=device).repeat(n),
                row_index.reshape(n * num_kv_heads, rows),
                row_pos.reshape(n * num_kv_heads, rows),
            )
        )
    return buckets


def _layout(
    q_seq: torch.Tensor, q_pos: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int
) -> list[_Bucket]:
    """Cut the rows into tiles and group tiles by (rows, key blocks).

    A tile holds consecutive tokens (in call order) of one sequence times the `group` query heads of
    one kv head. Its key-block count is set by its last position, so blocks wholly in the future of
    every row of a tile are skipped (about half the work of a causal prefill) without changing a bit.
    """
    t = q_seq.shape[0]
    device = q_seq.device
    group = num_heads // num_kv_heads
    full_rows, variable = _tile_rows(group, head_dim)
    tokens_per_tile = max(full_rows // group, 1)
    if t == 0:
        return []

    order = torch.sort(q_seq, stable=True).indices
    seq_sorted = q_seq[order]
    uniq, counts = torch.unique_consecutive(seq_sorted, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    seq_rank = torch.repeat_interleave(torch.arange(uniq.numel(), device=device), counts)
    local = torch.arange(t, device=device) - starts[seq_rank]  # token index within its sequence
    chunk = local // tokens_per_tile
    chunks_per_seq = -(-counts // tokens_per_tile)
    # tile id: sequence-major, then kv head, then chunk
    seq_tile_base = torch.cumsum(chunks_per_seq * num_kv_heads, 0) - chunks_per_seq * num_kv_heads
    num_tiles = int((chunks_per_seq * num_kv_heads).sum())
    token_tiles = (
        seq_tile_base[seq_rank].view(t, 1)
        + torch.arange(num_kv_heads, device=device).view(1, -1) * chunks_per_seq[seq_rank].view(t, 1)
        + chunk.view(t, 1)
    )  # [t, Hkv], in sorted token order

    # per tile: sequence, head, real rows, last position
    tile_seq = torch.repeat_interleave(uniq, chunks_per_seq * num_kv_heads)
    within = torch.arange(num_tiles, device=device) - torch.repeat_interleave(
        seq_tile_base, chunks_per_seq * num_kv_heads
    )
    per_head = torch.repeat_interleave(chunks_per_seq, chunks_per_seq * num_kv_heads)
    tile_head = within // per_head
    tile_chunk = within % per_head
    tile_count = torch.repeat_interleave(counts, chunks_per_seq * num_kv_heads)
    tile_tokens = torch.clamp(tile_count - tile_chunk * tokens_per_tile, max=tokens_per_tile)
    real_rows = tile_tokens * group
    if variable:
        tile_rows = -(-real_rows // MIN_TILE_ROWS) * MIN_TILE_ROWS
    else:
        tile_rows = torch.full_like(real_rows, full_rows)
    pos_sorted = q_pos[order]
    tile_last = torch.zeros(num_tiles, dtype=q_pos.dtype, device=device)
    tile_last.scatter_reduce_(
        0, token_tiles.reshape(-1), pos_sorted.view(t, 1).expand(t, num_kv_heads).reshape(-1), "amax"
    )
    tile_blocks = tile_last // KEY_BLOCK + 1

    # flat row slots: every tile gets tile_rows slots; real rows are filled, padding points at the
    # appended zero row (index t * num_heads) with position 0
    row_base = torch.cumsum(tile_rows, 0) - tile_rows
    total_rows = int(tile_rows.sum())
    dummy = t * num_heads
    slot_index = torch.full((total_rows,), dummy, dtype=torch.long, device=device)
    slot_pos = torch.zeros(total_rows, dtype=q_pos.dtype, device=device)
    j = torch.arange(group, device=device).view(1, 1, group)
    h = torch.arange(num_kv_heads, device=device).view(1, num_kv_heads, 1)
    local_in_tile = (local % tokens_per_tile).view(t, 1, 1)
    slots = row_base[token_tiles].view(t, num_kv_heads, 1) + local_in_tile * group + j  # [t, Hkv, g]
    token = order.view(t, 1, 1)
    slot_index[slots.reshape(-1)] = (token * num_heads + h * group + j).reshape(-1)
    slot_pos[slots.reshape(-1)] = pos_sorted.view(t, 1, 1).expand(t, num_kv_heads, group).reshape(-1)

    buckets = []
    key = tile_rows * (int(tile_blocks.max()) + 1) + tile_blocks
    for k in torch.unique(key).tolist():
        tiles = (key == k).nonzero().squeeze(1)
        rows = int(tile_rows[tiles[0]])
        idx = row_base[tiles].view(-1, 1) + torch.arange(rows, device=device).view(1, rows)
        buckets.append(
            _Bucket(
                rows,
                int(tile_blocks[tiles[0]]),
                tile_seq[tiles],
                tile_head[tiles],
                slot_index[idx],
                slot_pos[idx],
            )
        )
    return buckets


# -- forward ----------------------------------------------------------------------------------------
def _tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over dim 1 in a fixed binary tree over the absolute index (adjacent pairs, level by level).

    A missing right partner counts as an exact zero, so appending zero blocks changes no bit.
    """
    while x.shape[1] > 1:
        even, odd = x[:, 0::2], x[:, 1::2]
        if even.shape[1] == odd.shape[1]:
            x = even + odd
        else:
            x = torch.cat([even[:, :-1] + odd, even[:, -1:]], dim=1)
    return x[:, 0]


def _key_blocks(
    buf: torch.Tensor,
    seqs: torch.Tensor,
    heads: torch.Tensor,
    span: int,
    page_table: torch.Tensor | None = None,
) -> torch.Tensor:
    """[n, span // 64, 64, D] fp32 key (or value) blocks of n (sequence, head) pairs."""
    if page_table is not None:  # pages [P, Hkv, 64, D]: gather the sequence's pages in block order
        p, hkv, _, d = buf.shape
        nb = span // KEY_BLOCK
        rows = page_table[seqs, :nb] * hkv + heads.view(-1, 1)
        blocks = buf.reshape(p * hkv, KEY_BLOCK, d).index_select(0, rows.reshape(-1))
        return blocks.float().reshape(seqs.numel(), nb, KEY_BLOCK, d)
    s, hkv, length, d = buf.shape
    if seqs.numel() == 1:
        blocks = buf[int(seqs[0]), int(heads[0]), :span].unsqueeze(0)  # in place: a view
    else:  # one row copy per pair (index_select is several times faster than advanced indexing)
        blocks = buf.reshape(s * hkv, length, d)[:, :span].index_select(0, seqs * hkv + heads)
    return blocks.float().reshape(seqs.numel(), span // KEY_BLOCK, KEY_BLOCK, d)


def _tile_group(qf, k, v, b: _Bucket, group: _TileGroup, scale: float, page_table=None):
    """Attention of one tile group of bucket b: (out [n, R, D], row max [n, R], denominator [n, R])."""
    sel = group.sel
    n, rows, nb, d = sel.numel(), b.rows, b.num_blocks, qf.shape[-1]
    span = nb * KEY_BLOCK
    kb = _key_blocks(k, b.tile_seq[sel], b.tile_head[sel], span, page_table)
    vb = _key_blocks(v, b.tile_seq[sel], b.tile_head[sel], span, page_table)
    q_tiles = qf.index_select(0, b.row_index[sel].reshape(-1)).view(n, rows, d)  # (faster than qf[idx])
    if n == 1:  # one tile against its key blocks: a broadcast view, no copy (the guard checks both)
        q_blocks = q_tiles.expand(nb, rows, d)
    else:
        q_blocks = q_tiles.unsqueeze(1).expand(n, nb, rows, d).reshape(n * nb, rows, d)
    scores = torch.bmm(q_blocks, kb.reshape(n * nb, KEY_BLOCK, d).transpose(1, 2)).view(
        n, nb, rows, KEY_BLOCK
    )
    # in place: the same elementwise kernels (so the same bits) without a fresh [n, nb, R, 64] buffer each
    scores.mul_(scale)
    scores[:, group.first_block :].masked_fill_(group.future, float("-inf"))
    row_max = scores.amax(dim=(1, 3), keepdim=True)
    p = aligned_unary(torch.exp_, scores.sub_(row_max))
    block_sums = p.sum(-1)  # [n, nb, R], each a sum over one fixed-size block
    block_out = torch.bmm(p.view(n * nb, rows, KEY_BLOCK), vb.reshape(n * nb, KEY_BLOCK, d)).view(
        n, nb, rows, d
    )
    denom = _tree_sum(block_sums)
    out = _tree_sum(block_out) / denom.unsqueeze(-1)
    return out, row_max.view(n, rows), denom


def _groups(b: _Bucket):
    """Index tensors of tile groups of bucket b whose scores fit WORK_BUDGET (one tile per group for long
    spans)."""
    n = b.tile_seq.numel()
    per_tile = b.rows * b.num_blocks * KEY_BLOCK
    step = 1 if b.num_blocks >= IN_PLACE_BLOCKS else max(1, WORK_BUDGET // per_tile)
    return [torch.arange(i, min(i + step, n)) for i in range(0, n, step)]


def _tile_groups(b: _Bucket, padding_row: int, host_min_position: int | None = None) -> list[_TileGroup]:
    """The forward's tile groups of bucket b with their masks (built on first use, shared by the layers).
    ``host_min_position`` (a decode step: the lowest of its rows' host positions) bounds every group's first
    masked block without reading a position back from the device; else each group's own minimum is read."""
    if b.groups is None:
        b.groups = []
        for sel in _groups(b):
            pos = b.row_pos[sel]  # [n, R]
            if host_min_position is not None:
                first = host_min_position // KEY_BLOCK
            else:
                real_pos = pos.masked_fill(b.row_index[sel] == padding_row, torch.iinfo(pos.dtype).max)
                first = int(real_pos.min()) // KEY_BLOCK
            key_pos = torch.arange(first * KEY_BLOCK, b.num_blocks * KEY_BLOCK, device=pos.device)
            future = key_pos.view(1, -1, 1, KEY_BLOCK) > pos.view(sel.numel(), 1, b.rows, 1)
            b.groups.append(_TileGroup(sel, first, future))
    return b.groups


def _forward(q, k, v, plan: BlockedPlan, scale: float, with_stats: bool):
    t, num_heads, d = q.shape
    qf = torch.cat([q.float().reshape(-1, d), q.new_zeros(1, d, dtype=torch.float32)])
    out = torch.empty(t * num_heads + 1, d, dtype=torch.float32, device=q.device)
    stats = torch.empty(t * num_heads + 1, 2, dtype=torch.float32, device=q.device) if with_stats else None
    pages = plan.page_table
    capacity = k.shape[2] if pages is None else pages.shape[1] * KEY_BLOCK
    host_min = min(plan.decode_positions) if plan.decode_positions else None  # a decode step: no read-back
    for b in plan.buckets(d):
        if b.num_blocks * KEY_BLOCK > capacity:
            raise ValueError(
                f"key buffer holds {capacity} positions, attention needs {b.num_blocks * KEY_BLOCK}"
            )
        for group in _tile_groups(b, t * num_heads, host_min):
            o, m, den = _tile_group(qf, k, v, b, group, scale, pages)
            idx = b.row_index[group.sel].reshape(-1)
            # plain copies (index_copy_ is faster than index_put); padding rows all land on the discarded
            # last row, so which of them is written last does not matter
            out.index_copy_(0, idx, o.reshape(-1, d))
            if stats is not None:
                stats.index_copy_(0, idx, torch.stack([m.reshape(-1), den.reshape(-1)], dim=1))
    out = out[:-1].view(t, num_heads, d).to(q.dtype)
    return out, (stats[:-1] if stats is not None else None)


# -- backward (training) -----------------------------------------------------------------------------
def _backward(q, k, v, out, stats, grad_out, plan: BlockedPlan, scale: float):
    """Gradients of q, k, v by recomputing each tile's probabilities (plain fp32 arithmetic)."""
    t, num_heads, d = q.shape
    qf = torch.cat([q.float().reshape(-1, d), q.new_zeros(1, d, dtype=torch.float32)])
    go = torch.cat([grad_out.float().reshape(-1, d), grad_out.new_zeros(1, d, dtype=torch.float32)])
    of = torch.cat([out.float().reshape(-1, d), out.new_zeros(1, d, dtype=torch.float32)])
    st = torch.cat([stats, stats.new_ones(1, 2)])
    dq = torch.zeros_like(qf)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for b in plan.buckets(d):
        span = b.num_blocks * KEY_BLOCK
        for sel in _groups(b):
            n = sel.numel()
            seqs, heads = b.tile_seq[sel], b.tile_head[sel]
            kt = _key_blocks(k, seqs, heads, span).reshape(n, span, d)
            vt = _key_blocks(v, seqs, heads, span).reshape(n, span, d)
            idx = b.row_index[sel]  # [n, R]
            qt, got, ot = qf[idx], go[idx], of[idx]
            m, den = st[idx, 0].unsqueeze(-1), st[idx, 1].unsqueeze(-1)
            s = torch.bmm(qt, kt.transpose(1, 2)) * scale
            key_pos = torch.arange(span, device=q.device).view(1, 1, span)
            s = s.masked_fill(key_pos > b.row_pos[sel].unsqueeze(-1), float("-inf"))
            p = torch.exp(s - m) / den  # [n, R, span]
            real = (idx != t * num_heads).unsqueeze(-1)  # padding rows carry no gradient
            p = p * real
            dv_t = torch.bmm(p.transpose(1, 2), got)
            dp = torch.bmm(got, vt.transpose(1, 2))
            ds = p * (dp - (got * ot).sum(-1, keepdim=True)) * scale
            dq.index_add_(0, idx.reshape(-1), torch.bmm(ds, kt).reshape(-1, d))
            dk_t = torch.bmm(ds.transpose(1, 2), qt)
            dk[:, :, :span].index_put_((seqs, heads), dk_t, accumulate=True)
            dv[:, :, :span].index_put_((seqs, heads), dv_t, accumulate=True)
    return dq[:-1].view(t, num_heads, d).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _BlockedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan, scale):
        out, stats = _forward(q, k, v, plan, scale, with_stats=True)
        ctx.save_for_backward(q, k, v, out, stats)
        ctx.plan, ctx.scale = plan, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, stats = ctx.saved_tensors
        groups = ctx.plan.span_groups() if flash_backward_usable(q, ctx.plan) else None
        if groups is not None:  # any algorithm may give the gradient: the flash kernel's is the fastest here
            lse = (stats[:, 0] + stats[:, 1].log()).view(q.shape[0], q.shape[1])
            dq, dk, dv = attention_grad.flash_backward(q, k, v, out, lse, grad_out, groups, ctx.scale)
        else:
            dq, dk, dv = _backward(q, k, v, out, stats, grad_out, ctx.plan, ctx.scale)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


_flash_backward_on = True


def set_flash_backward(enabled: bool) -> None:
    """Use the flash kernel for the blocked attention's backward where it applies (default) or always the
    tile-by-tile recompute (``_backward``; tests compare the two). Gradients only: the forward's bits never
    change."""
    global _flash_backward_on
    _flash_backward_on = enabled


def flash_backward_usable(q: torch.Tensor, plan: BlockedPlan) -> bool:
    """Whether the backward of this call runs on the flash kernel: on, available, CPU, contiguous K/V."""
    return (
        _flash_backward_on
        and attention_grad.FLASH_BACKWARD is not None
        and q.device.type == "cpu"
        and plan.page_table is None
    )


def blocked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BlockedPlan, scale: float
) -> torch.Tensor:
    """Batch-invariant causal attention (see module docstring). Math in fp32."""
    if q.shape[0] == 0:
        return q.new_zeros(q.shape)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        if plan.page_table is not None:
            raise ValueError("blocked attention over a paged KV cache is inference-only (no backward)")
        return _BlockedAttention.apply(q, k, v, plan, scale)
    return _forward(q, k, v, plan, scale, with_stats=False)[0]


# -- standard (SDPA) --------------------------------------------------------------------------------
@dataclass
class SdpaPlan:
    """Where each query row goes in one padded SDPA batch: [sequences, rows per sequence, keys]."""

    seqs: torch.Tensor  # [b] sequence (cache slot) ids, ascending
    contiguous: bool  # seqs == seqs[0] + arange(b): K/V are a view of the cache, not a copy
    batch_index: torch.Tensor  # [rows] which of the b sequences each query row belongs to
    row_index: torch.Tensor  # [rows] its row within that sequence's padded queries
    mask: torch.Tensor  # [b, 1, rows per sequence, keys] bool: key j visible to the query
    rows_per_seq: int
    keys: int
    page_table: torch.Tensor | None = None  # [sequences, pages]: K/V live in 64-position pages


def plan_sdpa(
    q_seq: torch.Tensor,
    q_pos: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    page_table: torch.Tensor | None = None,
    max_position: int | None = None,
    decode_positions: tuple[int, ...] | None = None,
) -> SdpaPlan:
    """The padded SDPA batch of one call. A decode step over a page table (``decode_positions`` and
    ``max_position`` given: query i is the one token of sequence q_seq[i]) is planned by shape alone,
    with no read-back: one row per sequence, keys up to max_position."""
    if decode_positions is not None and max_position is not None and page_table is not None:
        t = q_seq.numel()
        keys = max_position + 1
        mask = torch.arange(keys, device=q_seq.device).view(1, 1, keys) <= q_pos.view(t, 1, 1)
        return SdpaPlan(
            q_seq,
            False,
            torch.arange(t, device=q_seq.device),
            torch.zeros(t, dtype=torch.long, device=q_seq.device),
            mask.unsqueeze(1),
            1,
            keys,
            page_table,
        )
    seqs, batch_index, counts = torch.unique(q_seq, return_inverse=True, return_counts=True)
    order = torch.argsort(batch_index, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    row_index = torch.empty_like(batch_index)
    row_index[order] = torch.arange(q_seq.numel(), device=q_seq.device) - starts[batch_index[order]]
    rows = int(counts.max())
    keys = (int(q_pos.max()) if max_position is None else max_position) + 1
    pos = torch.zeros(seqs.numel(), rows, dtype=q_pos.dtype, device=q_pos.device)  # padded rows see key 0
    pos[batch_index, row_index] = q_pos
    mask = (torch.arange(keys, device=q_seq.device).view(1, 1, keys) <= pos.unsqueeze(-1)).unsqueeze(1)
    first = int(seqs[0])
    contiguous = page_table is None and bool(
        torch.equal(seqs, torch.arange(first, first + seqs.numel(), device=seqs.device))
    )
    return SdpaPlan(seqs, contiguous, batch_index, row_index, mask, rows, keys, page_table)


def _batch_kv(buf: torch.Tensor, plan: SdpaPlan) -> torch.Tensor:
    """[b, Hkv, keys, D] keys (or values) of the plan's sequences, from a contiguous buffer or their pages."""
    if plan.page_table is None:
        if plan.contiguous:
            first = int(plan.seqs[0])
            return buf[first : first + plan.seqs.numel(), :, : plan.keys]
        return buf[plan.seqs, :, : plan.keys]
    pages = buf[plan.page_table[plan.seqs, : -(-plan.keys // KEY_BLOCK)]]  # [b, n, Hkv, 64, D]
    b, n, hkv, block, d = pages.shape
    return pages.transpose(1, 2).reshape(b, hkv, n * block, d)[:, :, : plan.keys]


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SdpaPlan, scale: float
) -> torch.Tensor:
    """Stock PyTorch SDPA in one batched call (the sequences padded to the longest; the unaligned
    reference/negative control, and the fair baseline a standard engine would run)."""
    b = plan.seqs.numel()
    keys, values = _batch_kv(k, plan), _batch_kv(v, plan)
    padded = q.new_zeros(b, plan.rows_per_seq, q.shape[1], q.shape[2])
    padded = padded.index_put((plan.batch_index, plan.row_index), q)
    o = F.scaled_dot_product_attention(
        padded.transpose(1, 2), keys, values, attn_mask=plan.mask, scale=scale, enable_gqa=True
    )
    return o.transpose(1, 2)[plan.batch_index, plan.row_index]
