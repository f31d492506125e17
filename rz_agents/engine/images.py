"""Requests with images (a Qwen3-VL model): what a sequence keeps of its images, and what each forward chunk
takes from them.

A request carries its images' pixels and grids (`ImagePrompt`). At admission the engine works out the
prompt's 3D RoPE positions and where its image placeholders are (`SequenceImages`). Encoded images live in one
place, the engine's `ImageCache`, by content (pixels and grid): a prefill chunk takes the rows of the images
its placeholders belong to from there, encoding (in one tower call) only those missing. The next turn of a
multi-turn episode, whose prompt repeats the earlier screenshots, and the other samples of a group thus
encode only what is new. The cache has a byte budget (engine.image_cache_bytes): over it, the least recently
used encodings go first, those no live sequence still needs (its K/V already cover the image's placeholders)
before those one does; an evicted encoding a sequence needs again (a later chunk, a preemption's recompute)
is encoded again, the same bits. An image's encoding does not depend on the other images of the call
(model/vision.py), so one encoded here, alone or with others, equals the learner's re-encoding inside a
batch, bit for bit. A weight update drops all of them (the tower may have changed).

Positions: prompt tokens rotate by their 3D positions; tokens after the prompt (sampled) by index + delta on
all three axes. Attention and the KV pages stay addressed by token index, as for text. Placeholders count
only in the prompt: a sampled `<|image_pad|>` is an ordinary token here.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rz_agents.model.forward_inputs import Segment
from rz_agents.model.vision import ImageEmbeddings


@dataclass
class ImagePrompt:
    """A request's images, as the processor gives them (model/vl_processor.py: preprocess_images)."""

    pixel_values: torch.Tensor  # [patches, patch_dim], the images' patch rows in order
    image_grid_thw: torch.Tensor | list  # [images, 3] (t, h, w) in patches, one per placeholder run


class SequenceImages:
    """One sequence's images: 3D positions of its prompt, its placeholders, its (lazily) encoded images."""

    def __init__(self, prompt: list[int], request: ImagePrompt, model: torch.nn.Module) -> None:
        """``model``: the engine's (``Transformer.image_positions`` lays the prompt's images out; a model
        that takes none raises ValueError)."""
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
        layout = model.image_positions(prompt, grids)
        self.rope, self.delta, self.slots = layout.rope, layout.delta, layout.slots
        self.prompt_len = len(prompt)
        # placeholder rows of image i: token_rows[i]..token_rows[i + 1] - 1 (merged tokens per image)
        counts = layout.tokens_per_image
        self.token_rows = [sum(counts[:i]) for i in range(len(counts) + 1)]
        # the last token index of each image's placeholders: the sequence needs image i's encoding until
        # its K/V reach past it
        self.last_slot = [int(self.slots[b - 1]) for b in self.token_rows[1:]]

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

    def images_of_rows(self, rows: torch.Tensor) -> range:
        """The images whose placeholders hold ``rows`` (ascending rows of one chunk: consecutive images)."""
        first = bisect.bisect_right(self.token_rows, int(rows[0])) - 1
        last = bisect.bisect_right(self.token_rows, int(rows[-1])) - 1
        return range(first, last + 1)

    def segment(
        self, start: int, end: int, encodings: Callable[[SequenceImages, range], list[ImageEmbeddings]]
    ) -> Segment:
        """The forward segment of tokens start..end-1 (model/forward_inputs.py): their 3D positions and the
        rows of the images their placeholders belong to (``encodings(self, span)``: the encodings of images
        ``span``, from the engine's cache or encoded now)."""
        rows, index = self.placeholder_rows(start, end)
        images = slots = None
        if rows.numel():
            span = self.images_of_rows(rows)
            got = ImageEmbeddings.cat(encodings(self, span))
            images = got.rows((rows - self.token_rows[span[0]]).to(got.embeds.device))
            slots = index - start
        return Segment(start, end - start, self.rope_columns(start, end), images, slots)

    def needed_keys(self, num_cached: int) -> set[tuple]:
        """Keys of the images whose placeholders are not all in the K/V yet (``num_cached`` tokens are)."""
        return {k for k, last in zip(self.keys, self.last_slot, strict=True) if last >= num_cached}

    def text_rope_position(self, index: int) -> int | None:
        """The one RoPE position (all three axes) of the token at ``index`` when it is text, None for a
        prompt's image placeholder (its rotation differs per axis and its embedding is the image's)."""
        if index >= self.prompt_len:
            return index + self.delta
        column = self.rope[:, index]
        if bool((column != column[0]).any()) or bool((self.slots == index).any()):
            return None
        return int(column[0])


def image_key(pixels: torch.Tensor, grid: torch.Tensor) -> tuple:
    """An image's identity for the cache: a digest of its pixel rows, their dtype and shape, and its grid."""
    data = pixels.detach().cpu().contiguous()
    digest = hashlib.sha1(data.view(torch.uint8).numpy().tobytes()).hexdigest()
    return digest, str(data.dtype), tuple(data.shape), tuple(int(v) for v in grid)


def encoding_bytes(embeddings) -> int:
    """Bytes an image's ImageEmbeddings hold (its merged-token rows and their deepstack features)."""
    return sum(t.numel() * t.element_size() for t in (embeddings.embeds, *embeddings.deepstack))


class ImageCache:
    """Encoded images by content (`image_key`) within a byte budget, for one weight version.

    ``put`` stores a compact copy of each image's encoding (never a view into a larger call's output, whose
    storage would outlive an eviction) and evicts, least recently used first, encodings no live sequence
    needs, then needed ones (encoded again when needed: the same bits); never those of the running step
    (``protect``). Only a single step whose own images exceed the budget goes over it (``peak_bytes`` shows
    it). ``stats`` are the image-cache counters the engine reports.
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        if max_bytes < 1:
            raise ValueError(f"image cache max_bytes must be >= 1, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, object] = OrderedDict()
        self.bytes = 0
        self.peak_bytes = 0
        self.hits = 0  # lookups served from the cache (a later chunk of the same image counts too)
        self.misses = 0  # lookups that had to encode
        self.evictions = 0
        self.evictions_needed = 0  # of them, encodings a live sequence still needed (encoded again later)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: tuple) -> bool:
        return key in self._entries

    def get(self, key: tuple):
        """The encoding of ``key`` (most recently used now), or None; counts a hit or a miss."""
        got = self._entries.get(key)
        if got is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return got

    def put(self, key: tuple, embeddings, protect=frozenset(), needed=frozenset()):
        """Keep ``embeddings`` (a copy) for ``key``; evict until the budget holds it (see the class).
        ``needed``: a set of keys live sequences still need, or a function returning it (called only when
        something must go). Returns the stored copy."""
        from rz_agents.model.vision import ImageEmbeddings

        stored = ImageEmbeddings(
            embeddings.embeds.clone(), tuple(d.clone() for d in embeddings.deepstack), embeddings.counts
        )
        self._drop(key)
        size = encoding_bytes(stored)
        if self.bytes + size > self.max_bytes:
            keep = set(needed() if callable(needed) else needed)
            for spare_needed in (False, True):
                for old in list(self._entries):
                    if self.bytes + size <= self.max_bytes:
                        break
                    if old in protect or (old in keep and not spare_needed):
                        continue
                    self._drop(old)
                    self.evictions += 1
                    self.evictions_needed += old in keep
        self._entries[key] = stored
        self.bytes += size
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        return stored

    def _drop(self, key: tuple) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= encoding_bytes(old)

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def stats(self) -> dict[str, int]:
        """The counters, named for the engine's stats."""
        return {
            "image_cache_hits": self.hits,
            "image_cache_misses": self.misses,
            "image_cache_evictions": self.evictions,
            "image_cache_evictions_needed": self.evictions_needed,
            "image_cache_entries": len(self._entries),
            "image_cache_bytes_held": self.bytes,
            "image_cache_bytes_peak": self.peak_bytes,
            "image_cache_bytes_budget": self.max_bytes,
        }
