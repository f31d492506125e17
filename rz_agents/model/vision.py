"""Qwen3-VL's vision tower on the op set: patch embedding, learned position grid, 2D RoPE, ViT blocks, the
patch merger and the deepstack mergers.

Images travel packed: pixel_values [patches, C * T * P * P] (the processor's rows, each image's patches in
merge-window order: every spatial_merge_size^2 consecutive rows are one merged token) with image_grid_thw
[images, 3]. Every op is per row (the op set's linear, layer norm, GELU), elementwise, or attention, and
attention runs per image: each image is its own sequence of the op set's attention, all of its queries at
the image's last position, so each attends to every patch of its own image and to nothing else
(bidirectional, HF's cu_seqlens segmentation). An image's encoding is therefore the same bits whichever
other images share the call (`tests/model/test_qwen3_vl_vision.py` checks it with torch.equal), which is
what lets the engine encode an image once, alone, and the learner re-encode it inside a batch.

Parameter names are HF's (model.visual.*); the Conv3d patch embedding keeps its 5D weight and runs as a
linear over the flattened patch (the same products: kernel = stride = the patch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from rz_agents.model.mrope import vision_table
from rz_agents.model.qwen3_vl_config import VisionConfig
from rz_kernels import OpSet, RopeTable
from rz_kernels.attention import KEY_BLOCK

# 2D RoPE table size: grids up to this many patches per side (a 16-pixel patch: 65,536 pixels).
MAX_GRID_SIDE = 4096


class LayerNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, ops: OpSet) -> torch.Tensor:
        return ops.layer_norm(x, self.weight, self.bias, self.eps)


class PatchEmbed(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        p, t = cfg.patch_size, cfg.temporal_patch_size
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, (t, p, p), (t, p, p), bias=True)

    def forward(self, pixels: torch.Tensor, ops: OpSet) -> torch.Tensor:
        w = self.proj.weight
        return ops.linear(pixels.to(w.dtype), w.reshape(w.shape[0], -1), self.proj.bias)


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=True)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor, seg: _Segments, ops: OpSet) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = ops.linear(x, self.qkv.weight, self.qkv.bias).view(n, 3, self.num_heads, -1).unbind(1)
        q = ops.rope(seg.rope, q, seg.rows)
        k = ops.rope(seg.rope, k, seg.rows)
        scale = 1.0 / math.sqrt(self.head_dim)
        if ops.name == "triton":
            # The Triton attention places each query by its position (a causal kernel): it cannot hold a
            # whole image at one position. One SDPA call per image instead: each call sees only its own
            # image's q/k/v, at a shape set by that image, so its result cannot depend on the batch either.
            out = _per_image_attention(q, k, v, seg.sizes, scale)
        else:
            # keys/values by (image, patch): each image's patches at positions 0..size-1, zeros beyond
            k_buf = x.new_zeros(seg.buf_shape(self.num_heads, self.head_dim))
            v_buf = x.new_zeros(seg.buf_shape(self.num_heads, self.head_dim))
            k_buf[seg.image, :, seg.local] = k
            v_buf[seg.image, :, seg.local] = v
            out = ops.attention(q, k_buf, v_buf, seg.plan(ops, self.num_heads), scale)
        return ops.linear(out.reshape(n, -1), self.proj.weight, self.proj.bias)


def _per_image_attention(q, k, v, sizes: list[int], scale: float) -> torch.Tensor:
    """Bidirectional attention within each image: [N, H, D] split by image, one SDPA call each."""
    out = []
    for qi, ki, vi in zip(q.split(sizes), k.split(sizes), v.split(sizes), strict=True):
        qi, ki, vi = (t.transpose(0, 1).unsqueeze(0) for t in (qi, ki, vi))
        out.append(F.scaled_dot_product_attention(qi, ki, vi, scale=scale)[0].transpose(0, 1))
    return torch.cat(out)


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)
        self.approximate = cfg.gelu_approximate

    def forward(self, x: torch.Tensor, ops: OpSet) -> torch.Tensor:
        h = ops.gelu(ops.linear(x, self.linear_fc1.weight, self.linear_fc1.bias), self.approximate)
        return ops.linear(h, self.linear_fc2.weight, self.linear_fc2.bias)


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.norm1 = LayerNorm(cfg.hidden_size)
        self.norm2 = LayerNorm(cfg.hidden_size)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: torch.Tensor, seg: _Segments, ops: OpSet) -> torch.Tensor:
        x = x + self.attn(self.norm1(x, ops), seg, ops)
        return x + self.mlp(self.norm2(x, ops), ops)


class PatchMerger(nn.Module):
    """spatial_merge_size^2 neighbouring patches -> one language-model token: norm, concat, MLP (exact GELU).

    The final merger normalises each patch before concatenating; the deepstack mergers normalise the
    concatenation (HF's use_postshuffle_norm)."""

    def __init__(self, cfg: VisionConfig, postshuffle_norm: bool) -> None:
        super().__init__()
        self.merged = cfg.hidden_size * cfg.spatial_merge_size**2
        self.postshuffle_norm = postshuffle_norm
        self.norm = LayerNorm(self.merged if postshuffle_norm else cfg.hidden_size)
        self.linear_fc1 = nn.Linear(self.merged, self.merged, bias=True)
        self.linear_fc2 = nn.Linear(self.merged, cfg.out_hidden_size, bias=True)

    def forward(self, x: torch.Tensor, ops: OpSet) -> torch.Tensor:
        if self.postshuffle_norm:
            x = self.norm(x.reshape(-1, self.merged), ops)
        else:
            x = self.norm(x, ops).reshape(-1, self.merged)
        h = ops.gelu(ops.linear(x, self.linear_fc1.weight, self.linear_fc1.bias), "none")
        return ops.linear(h, self.linear_fc2.weight, self.linear_fc2.bias)


@dataclass
class ImageEmbeddings:
    """The vision tower's output for the images of one call, rows in image order (each image's merged tokens
    in its placeholder order): `embeds` [tokens, text hidden] replace the placeholders' embeddings; each of
    `deepstack` [tokens, text hidden] is added to the placeholders' hidden states after LM layer i."""

    embeds: torch.Tensor
    deepstack: tuple[torch.Tensor, ...]
    counts: tuple[int, ...]  # merged tokens per image

    def split(self) -> list[ImageEmbeddings]:
        """One ImageEmbeddings per image (views): what an engine caches with each sequence."""
        parts = zip(
            self.embeds.split(self.counts), *(d.split(self.counts) for d in self.deepstack), strict=True
        )
        return [ImageEmbeddings(p[0], tuple(p[1:]), (n,)) for p, n in zip(parts, self.counts, strict=True)]

    @staticmethod
    def cat(items: list[ImageEmbeddings]) -> ImageEmbeddings:
        """The rows of several images' embeddings in order (e.g. cached per image, for one forward)."""
        if not items:
            raise ValueError("ImageEmbeddings.cat needs at least one item")
        depth = len(items[0].deepstack)
        return ImageEmbeddings(
            torch.cat([i.embeds for i in items]),
            tuple(torch.cat([i.deepstack[d] for i in items]) for d in range(depth)),
            tuple(c for i in items for c in i.counts),
        )

    def rows(self, index: torch.Tensor) -> ImageEmbeddings:
        """The rows `index` (e.g. the placeholders one prefill chunk covers)."""
        return ImageEmbeddings(
            self.embeds[index], tuple(d[index] for d in self.deepstack), (int(index.numel()),)
        )


class _Segments:
    """Per-call layout of packed images: each image is one attention sequence of its patches."""

    def __init__(self, grids: list[tuple[int, int, int]], merge: int, rope_base: RopeTable, head_dim: int,
                 device: torch.device) -> None:  # fmt: skip
        sizes = [t * h * w for t, h, w in grids]
        self.sizes = sizes
        self.n = sum(sizes)
        self.image = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)).to(device)
        self.local = torch.cat([torch.arange(s) for s in sizes]).to(device)
        # every query sits at its image's last position: it sees all of its image's keys (0..size-1)
        self.last = torch.repeat_interleave(torch.tensor(sizes) - 1, torch.tensor(sizes)).to(device)
        self.count, self.span = len(sizes), -(-max(sizes) // KEY_BLOCK) * KEY_BLOCK
        self.max_position = max(sizes) - 1
        self.rows = torch.arange(self.n, device=device)
        self.rope = vision_table(rope_base, _patch_positions(grids, merge).to(device), head_dim)
        self._plans: dict[str, object] = {}

    def buf_shape(self, heads: int, head_dim: int) -> tuple[int, int, int, int]:
        return (self.count, heads, self.span, head_dim)

    def plan(self, ops: OpSet, heads: int):
        got = self._plans.get(ops.name)
        if got is None:
            got = ops.plan_attention(self.image, self.last, heads, heads, max_position=self.max_position)
            self._plans[ops.name] = got
        return got


def _patch_positions(grids: list[tuple[int, int, int]], merge: int) -> torch.Tensor:
    """[2, patches] (row, col) of every patch, in merge-window order (the processor's row order)."""
    out = []
    for t, h, w in grids:
        rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge, merge)
        cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, w // merge, merge)
        rows, cols = rows.transpose(1, 2).reshape(-1), cols.transpose(1, 2).reshape(-1)
        out.append(torch.stack([rows, cols]).repeat(1, t))
    return torch.cat(out, dim=1)


def _interpolation(
    grids: list[tuple[int, int, int]], merge: int, side: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear (align-corners) taps [patches, 4] into the side x side learned grid and their fp32 weights,
    resampling it to each image's grid, in merge-window order."""
    pos = _patch_positions(grids, merge)
    sizes = torch.cat([torch.tensor([[h], [w]]).expand(2, t * h * w) for t, h, w in grids], dim=1)
    src = pos.float() * (side - 1) / torch.clamp(sizes - 1, min=1).float()  # [2, N]
    floor = torch.floor(src)
    taps = (floor.long().unsqueeze(-1) + torch.arange(2)).clamp(0, side - 1)  # [2, N, 2]
    weights = (1 - (src.unsqueeze(-1) - floor.unsqueeze(-1) - torch.arange(2)).abs()).clamp(min=0)
    index = (taps[0].unsqueeze(-1) * side + taps[1].unsqueeze(1)).reshape(-1, 4)
    weight = (weights[0].unsqueeze(-1) * weights[1].unsqueeze(1)).reshape(-1, 4)
    return index, weight


class VisionTower(nn.Module):
    """HF's Qwen3VLVisionModel (the `model.visual.` prefix)."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.config = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, postshuffle_norm=False)
        self.deepstack_merger_list = nn.ModuleList(
            PatchMerger(cfg, postshuffle_norm=True) for _ in cfg.deepstack_visual_indexes
        )
        self.side = int(round(cfg.num_position_embeddings**0.5))
        self.rope_base = RopeTable(cfg.head_dim // 2, cfg.rope_theta, MAX_GRID_SIDE)

    def _grids(self, image_grid_thw: torch.Tensor | list, patches: int) -> list[tuple[int, int, int]]:
        grids = [tuple(int(v) for v in g) for g in torch.as_tensor(image_grid_thw).reshape(-1, 3).tolist()]
        m = self.config.spatial_merge_size
        for g in grids:
            if min(g) < 1 or g[1] % m or g[2] % m:
                raise ValueError(
                    f"image_grid_thw {g}: needs t, h, w >= 1 and h, w multiples of merge size {m}"
                )
            if max(g[1], g[2]) > MAX_GRID_SIDE:
                raise ValueError(f"image_grid_thw {g}: sides over {MAX_GRID_SIDE} patches are not supported")
        if sum(t * h * w for t, h, w in grids) != patches:
            raise ValueError(
                f"pixel_values has {patches} patch rows but image_grid_thw {grids} describes "
                f"{sum(t * h * w for t, h, w in grids)}"
            )
        return grids

    def forward(
        self,
        pixel_values: torch.Tensor,
        image_grid_thw: torch.Tensor | list,
        ops: OpSet,
        recompute: bool = False,
    ) -> ImageEmbeddings:
        """Encode packed images: pixel_values [patches, patch_dim], image_grid_thw [images, 3].

        ``recompute``: checkpoint each block (keep its input, run it again in the backward), as the decoder
        does under ``activation_checkpointing``; the same ops run again, so the same bits."""
        cfg = self.config
        if pixel_values.dim() != 2 or pixel_values.shape[1] != cfg.patch_dim:
            raise ValueError(
                f"pixel_values must be [patches, {cfg.patch_dim}] (channels x temporal x patch x patch), "
                f"got {tuple(pixel_values.shape)}"
            )
        grids = self._grids(image_grid_thw, pixel_values.shape[0])
        device = pixel_values.device
        x = self.patch_embed(pixel_values, ops)
        index, weight = _interpolation(grids, cfg.spatial_merge_size, self.side)
        index, weight = index.to(device), weight.to(device)
        taps = self.pos_embed.weight[index]  # [N, 4, hidden]
        w = weight.to(taps.dtype).unsqueeze(-1)
        pos = ((taps[:, 0] * w[:, 0] + taps[:, 1] * w[:, 1]) + taps[:, 2] * w[:, 2]) + taps[:, 3] * w[:, 3]
        x = x + pos.to(x.dtype)
        seg = _Segments(grids, cfg.spatial_merge_size, self.rope_base, cfg.head_dim, device)
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = checkpoint(block, x, seg, ops, use_reentrant=False) if recompute else block(x, seg, ops)
            if i in cfg.deepstack_visual_indexes:
                deepstack.append(self.deepstack_merger_list[cfg.deepstack_visual_indexes.index(i)](x, ops))
        merged = cfg.spatial_merge_size**2
        counts = tuple(t * h * w // merged for t, h, w in grids)
        return ImageEmbeddings(self.merger(x, ops), tuple(deepstack), counts)


@dataclass
class VLSequence:
    """One sequence of a packed forward (``packed_token_logprobs``) with images: its tokens and its images'
    grids, as pixels or already encoded (a model that ``takes_images`` packs them: ``packed_inputs``)."""

    tokens: Sequence[int] | torch.Tensor
    image_grid_thw: list[tuple[int, int, int]] | torch.Tensor | None = None
    pixel_values: torch.Tensor | None = None  # [patches, patch_dim] of this sequence's images, in order
    images: ImageEmbeddings | None = None  # or their embeddings (e.g. an engine's cache)
    # [len] bool: which tokens are image placeholders (None: every image_token_id); a trajectory marks the
    # template's only, since a sampled <|image_pad|> is an ordinary token to the engine
    placeholders: torch.Tensor | None = None
