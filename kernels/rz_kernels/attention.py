"""Causal GQA attention over a key/value buffer addressed by (sequence, position).

Both op sets have the same two-step interface: `plan_*(q_seq, q_pos, H, Hkv)` once per forward
(layout and masks depend only on which sequence and position each query has), then per layer
`*_attention(q, k, v, plan, scale)` with
  q      [T, H, D]            queries, already rotated
  k, v   [S, Hkv, L, D]       keys/values of every sequence, position p at index p (zero beyond)
  q_seq  [T]                  which sequence (index into S) each query belongs to
  q_pos  [T]                  absolute position of each query; it attends to keys 0..q_pos
returning [T, H, D] in q's dtype.

`blocked_attention` (aligned) gives each query row the same arithmetic whatever else is in the
call: rows are grouped into tiles of QUERY_TILE rows of one (sequence, kv head); keys are walked
in fixed KEY_BLOCK-sized blocks from absolute position 0; every score and value product is a
GEMM of one fixed shape; the softmax max is exact (order-free) and the per-block sums are added
in block order. Blocks past a row's position contribute exact zeros (masked to -inf -> p = 0),
so padding to the longest row in the call changes no bit. That makes a full prefill, a chunked
prefill, a single-token decode and the packed training forward agree bitwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rz_kernels.elementwise import aligned_unary

KEY_BLOCK = 64
QUERY_TILE = 16


def _row_layout(q_seq: torch.Tensor, num_kv_heads: int, group: int, tile: int):
    """Map every (token, query head) to (tile, row-in-tile).

    Rows of one (sequence, kv head) are laid out token-major then group-member, and cut into tiles of
    `tile` rows; a tile never mixes sequences or kv heads. Returns (flat_row_index [T, Hkv, g],
    tile_seq [NT], tile_head [NT], num_tiles).
    """
    t = q_seq.shape[0]
    device = q_seq.device
    order = torch.sort(q_seq, stable=True).indices
    seq_sorted = q_seq[order]
    uniq, counts = torch.unique_consecutive(seq_sorted, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    seq_rank = torch.repeat_interleave(torch.arange(uniq.numel(), device=device), counts)
    local = torch.empty(t, dtype=torch.long, device=device)
    local[order] = torch.arange(t, device=device) - starts[seq_rank]
    rank = torch.empty(t, dtype=torch.long, device=device)
    rank[order] = seq_rank

    tiles_per_group = -(-(counts * group) // tile)  # per sequence, for each kv head
    tiles_per_seq = tiles_per_group * num_kv_heads
    seq_tile_base = torch.cumsum(tiles_per_seq, 0) - tiles_per_seq
    num_tiles = int(tiles_per_seq.sum())

    h = torch.arange(num_kv_heads, device=device).view(1, num_kv_heads, 1)
    j = torch.arange(group, device=device).view(1, 1, group)
    r = local.view(t, 1, 1) * group + j  # row index inside its (sequence, kv head) group
    tile_idx = seq_tile_base[rank].view(t, 1, 1) + h * tiles_per_group[rank].view(t, 1, 1) + r // tile
    flat = tile_idx * tile + r % tile  # [T, Hkv, g]

    tile_seq = torch.repeat_interleave(uniq, tiles_per_seq)
    within = torch.arange(num_tiles, device=device) - torch.repeat_interleave(seq_tile_base, tiles_per_seq)
    tile_head = within // torch.repeat_interleave(tiles_per_group, tiles_per_seq)
    return flat, tile_seq, tile_head, num_tiles


@dataclass
class _Bucket:
    tiles: torch.Tensor  # tile indices in this bucket
    tile_seq: torch.Tensor
    tile_head: torch.Tensor
    num_blocks: int
    hidden: torch.Tensor  # [n, num_blocks, tile, KEY_BLOCK] bool: key is in the row's future (or padding)


@dataclass
class BlockedPlan:
    """Row layout and masks of one call, shared by every layer of a forward."""

    num_tokens: int
    num_heads: int
    num_kv_heads: int
    flat: torch.Tensor  # [T * H] row of each (token, head) in tile space
    num_tiles: int
    buckets: list[_Bucket]


def plan_blocked(q_seq: torch.Tensor, q_pos: torch.Tensor, num_heads: int, num_kv_heads: int) -> BlockedPlan:
    """Lay rows out in tiles and group tiles by how many key blocks they need.

    Grouping tiles by block count skips blocks that are fully in the future of every row of a tile
    (half the work of a causal prefill); it changes no bit, because a tile's result does not depend
    on the trailing all-masked blocks it would otherwise add (exact zeros).
    """
    t = q_seq.shape[0]
    group = num_heads // num_kv_heads
    tile = QUERY_TILE
    flat, tile_seq, tile_head, num_tiles = _row_layout(q_seq, num_kv_heads, group, tile)
    rows = num_tiles * tile
    idx = flat.reshape(-1)
    # Padding rows get position 0: they attend to key 0 only (finite), and are discarded.
    pos_rows = q_pos.new_zeros(rows).index_copy(0, idx, q_pos.view(t, 1, 1).expand_as(flat).reshape(-1))
    pos_rows = pos_rows.view(num_tiles, tile)
    tile_blocks = pos_rows.amax(dim=1) // KEY_BLOCK + 1
    buckets = []
    for nb in torch.unique(tile_blocks).tolist():
        tiles = (tile_blocks == nb).nonzero().squeeze(1)
        key_pos = torch.arange(nb * KEY_BLOCK, device=q_seq.device).view(1, nb, 1, KEY_BLOCK)
        hidden = key_pos > pos_rows[tiles].view(-1, 1, tile, 1)
        buckets.append(_Bucket(tiles, tile_seq[tiles], tile_head[tiles], nb, hidden))
    return BlockedPlan(t, num_heads, num_kv_heads, idx, num_tiles, buckets)


def blocked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BlockedPlan, scale: float
) -> torch.Tensor:
    """Batch-invariant causal attention (see module docstring). Math in fp32."""
    t, num_heads, d = q.shape
    if t == 0:
        return q.new_zeros(q.shape)
    tile = QUERY_TILE
    rows = plan.num_tiles * tile
    qt = q.new_zeros(rows, d, dtype=torch.float32).index_copy(0, plan.flat, q.float().reshape(-1, d))
    qt = qt.view(plan.num_tiles, tile, d)
    out_tiles = []
    for b in plan.buckets:
        n, nb = b.tiles.numel(), b.num_blocks
        span = nb * KEY_BLOCK
        if span > k.shape[2]:
            raise ValueError(f"key buffer holds {k.shape[2]} positions, attention needs {span}")
        kt = k[b.tile_seq, b.tile_head, :span].float().reshape(n * nb, KEY_BLOCK, d)
        vt = v[b.tile_seq, b.tile_head, :span].float().reshape(n * nb, KEY_BLOCK, d)
        qb = qt[b.tiles].unsqueeze(1).expand(n, nb, tile, d).reshape(n * nb, tile, d)
        scores = torch.bmm(qb, kt.transpose(1, 2)).view(n, nb, tile, KEY_BLOCK) * scale
        scores = scores.masked_fill(b.hidden, float("-inf"))
        row_max = scores.detach().amax(dim=(1, 3), keepdim=True)
        p = aligned_unary(torch.exp, scores - row_max)
        block_sums = p.sum(-1)  # [n, nb, tile], each a sum over one fixed-size block
        block_out = torch.bmm(p.view(n * nb, tile, KEY_BLOCK), vt).view(n, nb, tile, d)
        denom = block_sums[:, 0]
        acc = block_out[:, 0]
        for j in range(1, nb):  # fixed block order
            denom = denom + block_sums[:, j]
            acc = acc + block_out[:, j]
        out_tiles.append(acc / denom.unsqueeze(-1))
    if len(plan.buckets) == 1:
        out = out_tiles[0]
    else:
        order = torch.cat([b.tiles for b in plan.buckets])
        out = torch.cat(out_tiles).index_select(0, torch.argsort(order))
    return out.reshape(rows, d).index_select(0, plan.flat).view(t, num_heads, d).to(q.dtype)


@dataclass
class SdpaPlan:
    groups: list[tuple[int, torch.Tensor, int, torch.Tensor]]  # (seq, token index, length, mask)


def plan_sdpa(q_seq: torch.Tensor, q_pos: torch.Tensor, num_heads: int, num_kv_heads: int) -> SdpaPlan:
    groups = []
    for s in torch.unique(q_seq).tolist():
        sel = (q_seq == s).nonzero().squeeze(1)
        pos = q_pos[sel]
        length = int(pos.max()) + 1
        mask = torch.arange(length, device=q_seq.device).view(1, length) <= pos.view(-1, 1)
        groups.append((s, sel, length, mask))
    return SdpaPlan(groups)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SdpaPlan, scale: float
) -> torch.Tensor:
    """Stock PyTorch SDPA, one call per sequence (the unaligned reference/negative control)."""
    out = torch.empty_like(q)
    for s, sel, length, mask in plan.groups:
        o = F.scaled_dot_product_attention(
            q[sel].transpose(0, 1).unsqueeze(0),
            k[s : s + 1, :, :length],
            v[s : s + 1, :, :length],
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )
        out[sel] = o.squeeze(0).transpose(0, 1)
    return out
