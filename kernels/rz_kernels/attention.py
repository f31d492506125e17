"""Causal GQA attention over a key/value buffer addressed by (sequence, position).

Both op sets take the same arguments:
  q      [T, H, D]            queries, already rotated
  k, v   [S, Hkv, L, D]       keys/values of every sequence, position p at index p (zero beyond)
  q_seq  [T]                  which sequence (index into S) each query belongs to
  q_pos  [T]                  absolute position of each query; it attends to keys 0..q_pos
and return [T, H, D] in q's dtype.

`blocked_attention` (aligned) gives each query row the same arithmetic whatever else is in the
call: rows are grouped into tiles of QUERY_TILE rows of one (sequence, kv head); keys are walked
in fixed KEY_BLOCK-sized blocks from absolute position 0; every score and value product is a
GEMM of one fixed shape; the softmax max is exact (order-free) and the per-block sums are added
in block order. Blocks past a row's position contribute exact zeros (masked to -inf -> p = 0),
so padding to the longest row in the call changes no bit. That makes a full prefill, a chunked
prefill, a single-token decode and the packed training forward agree bitwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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


def blocked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_seq: torch.Tensor,
    q_pos: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Batch-invariant causal attention (see module docstring). Math in fp32."""
    t, num_heads, d = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    tile = QUERY_TILE
    if t == 0:
        return q.new_zeros(q.shape)
    flat, tile_seq, tile_head, num_tiles = _row_layout(q_seq, num_kv_heads, group, tile)
    rows = num_tiles * tile

    idx = flat.reshape(-1)
    q_rows = q.float().reshape(t, num_kv_heads, group, d).reshape(-1, d)
    qt = q.new_zeros(rows, d, dtype=torch.float32).index_copy(0, idx, q_rows)
    # Padding rows get position 0: they attend to key 0 only (finite), and are discarded.
    pos_rows = q_pos.new_zeros(rows).index_copy(0, idx, q_pos.view(t, 1, 1).expand_as(flat).reshape(-1))
    pos_rows = pos_rows.view(num_tiles, tile)

    num_blocks = int(pos_rows.max()) // KEY_BLOCK + 1
    span = num_blocks * KEY_BLOCK
    if span > k.shape[2]:
        raise ValueError(f"key buffer holds {k.shape[2]} positions, attention needs {span}")
    kt = k[tile_seq, tile_head, :span].float().view(num_tiles * num_blocks, KEY_BLOCK, d)
    vt = v[tile_seq, tile_head, :span].float().view(num_tiles * num_blocks, KEY_BLOCK, d)
    qb = qt.view(num_tiles, 1, tile, d).expand(num_tiles, num_blocks, tile, d).reshape(-1, tile, d)

    scores = torch.bmm(qb, kt.transpose(1, 2)).view(num_tiles, num_blocks, tile, KEY_BLOCK) * scale
    key_pos = torch.arange(span, device=q.device).view(1, num_blocks, 1, KEY_BLOCK)
    visible = key_pos <= pos_rows.view(num_tiles, 1, tile, 1)
    scores = scores.masked_fill(~visible, float("-inf"))
    row_max = scores.detach().amax(dim=(1, 3), keepdim=True)
    p = torch.exp(scores - row_max)
    block_sums = p.sum(-1)  # [NT, nb, tile], each a sum over one fixed-size block
    block_out = torch.bmm(p.view(-1, tile, KEY_BLOCK), vt).view(num_tiles, num_blocks, tile, d)

    denom = block_sums[:, 0]
    out = block_out[:, 0]
    for b in range(1, num_blocks):  # fixed block order; trailing all-masked blocks add exact zeros
        denom = denom + block_sums[:, b]
        out = out + block_out[:, b]
    out = (out / denom.unsqueeze(-1)).reshape(rows, d)
    return out.index_select(0, idx).view(t, num_heads, d).to(q.dtype)


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_seq: torch.Tensor,
    q_pos: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Stock PyTorch SDPA, one call per sequence (the unaligned reference/negative control)."""
    out = torch.empty_like(q)
    for s in torch.unique(q_seq).tolist():
        sel = (q_seq == s).nonzero().squeeze(1)
        pos = q_pos[sel]
        length = int(pos.max()) + 1
        mask = torch.arange(length, device=q.device).view(1, length) <= pos.view(-1, 1)
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
