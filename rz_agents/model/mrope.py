"""Rotary angles from several position axes: the language model's interleaved multimodal RoPE (M-RoPE) and
the vision tower's 2D (row, column) RoPE, both as per-token rows gathered from fixed tables.

Qwen3-VL gives every token three positions (temporal, height, width). Text tokens have all three equal (their
rotation is then plain RoPE's); an image's tokens have the image's start position plus their (t, h, w) index
in the merged grid, and the text after the image continues at start + max(h, w) (so positions run behind token
indices: `mrope_positions` returns that offset too, for the tokens a sequence appends later). Each rotary
frequency i reads one axis: height when i % 3 == 1 and i < 3 * section[1], width when i % 3 == 2 and
i < 3 * section[2], else temporal (HF's "interleaved" layout).

The angles are never recomputed per token: cos and sin come from tables built once per model (over every
position, as `RopeTable` builds them) and are *gathered* column by column, so a token's angles are the same
bits whatever else is in the call, and a text token's equal plain RoPE's exactly. The rotation itself is
the op set's `rope` over a `RopeTable.from_rows` table of these rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rz_kernels import RopeTable


def mrope_axes(head_dim: int, section: Sequence[int]) -> torch.Tensor:
    """[head_dim] long: which axis (0 = t, 1 = h, 2 = w) each rotary column reads (both halves alike)."""
    half = head_dim // 2
    i = torch.arange(half)
    axis = torch.zeros(half, dtype=torch.long)
    axis[(i % 3 == 1) & (i < 3 * section[1])] = 1
    axis[(i % 3 == 2) & (i < 3 * section[2])] = 2
    return torch.cat([axis, axis])


def gather_rows(table: RopeTable, positions: torch.Tensor, axes: torch.Tensor, freq_cols: torch.Tensor):
    """cos/sin rows [T, D]: column j of token t is table[positions[axes[j], t], freq_cols[j]].

    positions: [A, T] long (one row per axis); axes, freq_cols: [D] long.
    """
    cos, sin = table.tables(positions.device)
    if positions.numel():
        top = int(positions.max())
        if top >= table.max_positions:
            raise ValueError(f"rotary position {top} exceeds the table's {table.max_positions} positions")
    rows = positions[axes.to(positions.device)].t()  # [T, D]
    cols = freq_cols.to(positions.device).view(1, -1)
    # contiguous rows (the gather comes out column-major; the Triton rope kernel reads row-major tables)
    return cos[rows, cols].contiguous(), sin[rows, cols].contiguous()


def mrope_table(base: RopeTable, positions: torch.Tensor, section: Sequence[int]) -> RopeTable:
    """The per-token rotation rows of 3D positions [3, T] (apply with positions arange(T))."""
    d = base.cos.shape[1]
    cos, sin = gather_rows(base, positions, mrope_axes(d, section), torch.arange(d))
    return RopeTable.from_rows(cos, sin)


def vision_table(base: RopeTable, positions: torch.Tensor, head_dim: int) -> RopeTable:
    """The vision tower's 2D rotation rows of (row, col) positions [2, N], for a head of `head_dim`.

    `base` is a RopeTable of dim head_dim // 2 (frequencies over head_dim // 4): columns [0, head_dim / 4) of
    each half rotate by the row, the next head_dim / 4 by the column, each with frequency j mod head_dim / 4.
    """
    quarter = head_dim // 4
    j = torch.arange(head_dim) % (head_dim // 2)
    axes = (j >= quarter).long()
    cos, sin = gather_rows(base, positions, axes, j % quarter)
    return RopeTable.from_rows(cos, sin)


@dataclass
class ImagePositions:
    """A prompt's image layout, as a model that takes images gives it (``Transformer.image_positions``):
    the 3D positions of its tokens ``rope`` [3, T] and ``delta`` (see ``mrope_positions``), the token indices
    of its image placeholders ``slots``, and ``tokens_per_image`` (placeholders per image, in order)."""

    rope: torch.Tensor
    delta: int
    slots: torch.Tensor
    tokens_per_image: list[int]


def mrope_positions(
    tokens: Sequence[int] | torch.Tensor,
    image_grids: Sequence[Sequence[int]],
    image_token_id: int,
    spatial_merge_size: int,
    start: int = 0,
    placeholders: Sequence[bool] | torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """(positions [3, T] long, delta) of a sequence's tokens; image i's placeholders (t*h*w / merge^2
    consecutive `image_token_id` tokens, in order) take image_grids[i] = (t, h, w) in patches.

    `start` is the 3D position of tokens[0] for a continuation (a turn appended to a sequence whose positions
    so far ended before `start`); delta = (next text position) - (next token index), so a text token appended
    at index p later has position p + delta on all three axes.
    `placeholders` ([T] bool): which tokens are image placeholders (None: every `image_token_id`); a
    trajectory marks the template's only, a sampled `<|image_pad|>` being an ordinary (text) token.
    """
    ids = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    n = ids.numel()
    out = torch.empty(3, n, dtype=torch.long)
    if placeholders is None:
        is_image = (ids == image_token_id).tolist()
    else:
        is_image = torch.as_tensor(placeholders, dtype=torch.bool).reshape(-1).tolist()
        if len(is_image) != n:
            raise ValueError(f"placeholders has {len(is_image)} entries for {n} tokens")
    grids = list(image_grids)
    cur, i, g = start, 0, 0
    while i < n:
        if not is_image[i]:
            j = i
            while j < n and not is_image[j]:
                j += 1
            out[:, i:j] = torch.arange(cur, cur + j - i)
            cur += j - i
            i = j
            continue
        if g >= len(grids):
            raise ValueError(f"image placeholder at token {i} but only {len(grids)} image grids given")
        t, h, w = (int(v) for v in grids[g])
        if h % spatial_merge_size or w % spatial_merge_size:
            raise ValueError(
                f"image grid {(t, h, w)} is not a multiple of spatial_merge_size {spatial_merge_size}"
            )
        gh, gw = h // spatial_merge_size, w // spatial_merge_size
        count = t * gh * gw
        if i + count > n or not all(is_image[i : i + count]):
            raise ValueError(
                f"image {g} (grid {(t, h, w)}) needs {count} consecutive image tokens from token {i}"
            )
        tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij")
        out[:, i : i + count] = torch.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]) + cur
        cur += max(gh, gw)
        i += count
        g += 1
    if g != len(grids):
        raise ValueError(f"{len(grids)} image grids given but the tokens hold placeholders for {g}")
    return out, cur - n
