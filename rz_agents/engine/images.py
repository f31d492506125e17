"""Requests with images (a Qwen3-VL model): what a sequence keeps of its images, and what each forward chunk
takes from them.

A request carries its images' pixels and grids (`ImagePrompt`). At admission the engine works out the
prompt's 3D RoPE positions and where its image placeholders are (`SequenceImages`); the vision tower runs the
first time a chunk holds one of the sequence's placeholders, and the embeddings stay with the sequence (a
preempted sequence recomputes its K/V from them, no re-encoding). Encoded images are also kept by content
(`ImageCache`: pixels and grid), so the next turn of a multi-turn episode, whose prompt repeats the earlier
screenshots, and the other samples of a group encode only what is new. An image's encoding does not depend
on the other images of the call (model/vision.py), so one encoded here, alone or with others, equals the
learner's re-encoding inside a batch, bit for bit. A weight update drops all of them (the tower may have
changed): they are encoded again with the new weights when next needed.

Positions: prompt tokens rotate by their 3D positions; tokens after the prompt (sampled) by index + delta on
all three axes. Attention and the KV pages stay addressed by token index, as for text. Placeholders count
only in the prompt: a sampled `<|image_pad|>` is an ordinary token here.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import torch

from rz_agents.model.mrope import mrope_positions


@dataclass
class ImagePrompt:
    """A request's images, as the processor gives them (model/vl_processor.py: preprocess_images)."""

    pixel_values: torch.Tensor  # [patches, patch_dim], the images' patch rows in order
    image_grid_thw: torch.Tensor | list  # [images, 3] (t, h, w) in patches, one per placeholder run


class SequenceImages:
    """One sequence's images: 3D positions of its prompt, its placeholders, its (lazily) encoded images."""

    def __init__(self, prompt: list[int], request: ImagePrompt, vl_config) -> None:
        grids = torch.as_tensor(request.image_grid_thw, dtype=torch.long).reshape(-1, 3)
        patches = int(grids.prod(-1).sum())
        pixels = request.pixel_values
        if not isinstance(pixels, torch.Tensor) or pixels.dim() != 2 or pixels.shape[0] != patches:
            shape = tuple(pixels.shape) if isinstance(pixels, torch.Tensor) else type(pixels).__name__
            raise ValueError(
                f"images.pixel_values must be [patches, patch_dim] with {patches} patch rows "
                f"(image_grid_thw {grids.tolist()}), got {shape}"
            )
        self.grids = grids
        self.pixel_values = pixels
        sizes = grids.prod(-1).tolist()
        self.pixel_rows = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        self.keys = [
            image_key(pixels[a:b], g)
            for a, b, g in zip(self.pixel_rows[:-1], self.pixel_rows[1:], grids, strict=True)
        ]
        merge = vl_config.vision.spatial_merge_size
        self.rope, self.delta = mrope_positions(prompt, grids.tolist(), vl_config.image_token_id, merge)
        self.slots = torch.tensor([i for i, t in enumerate(prompt) if t == vl_config.image_token_id])
        self.prompt_len = len(prompt)
        self.embeds = None  # ImageEmbeddings, set by the first forward that needs them

    def rope_columns(self, start: int, end: int) -> torch.Tensor:
        """[3, end - start] 3D positions of tokens start..end-1."""
        cut = min(end, self.prompt_len)  # prompt tokens: their 3D positions; the rest: index + delta
        head = self.rope[:, start:cut] if start < cut else self.rope[:, :0]
        tail = torch.arange(max(start, cut), end) + self.delta
        return torch.cat([head, tail.view(1, -1).expand(3, -1)], dim=1)

    def placeholder_rows(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows of the sequence's image embeddings, their token indices) for placeholders in start..end-1."""
        inside = (self.slots >= start) & (self.slots < end)
        rows = inside.nonzero().squeeze(1)
        return rows, self.slots[rows]

    def forget_encodings(self) -> None:
        """Drop the encoded images (after a weight update: encoded again with the new weights when needed)."""
        self.embeds = None


def text_rope_columns(start: int, end: int) -> torch.Tensor:
    """[3, end - start] positions of a text-only sequence's tokens in a multimodal model (all axes equal)."""
    return torch.arange(start, end).view(1, -1).expand(3, -1)


def image_key(pixels: torch.Tensor, grid: torch.Tensor) -> tuple:
    """An image's identity for the cache: a digest of its pixel rows, their dtype and shape, and its grid."""
    data = pixels.detach().cpu().contiguous()
    digest = hashlib.sha1(data.view(torch.uint8).numpy().tobytes()).hexdigest()
    return digest, str(data.dtype), tuple(data.shape), tuple(int(v) for v in grid)


class ImageCache:
    """Encoded images by content (`image_key`), least recently used first out, for one weight version."""

    def __init__(self, max_images: int = 256) -> None:
        self.max_images = max_images
        self._entries: OrderedDict[tuple, object] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple):
        got = self._entries.get(key)
        if got is not None:
            self._entries.move_to_end(key)
        return got

    def put(self, key: tuple, embeddings) -> None:
        self._entries[key] = embeddings
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_images:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
