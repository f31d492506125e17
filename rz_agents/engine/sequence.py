"""The state of one request as it moves through the engine: waiting -> running -> finished."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from rz_agents.engine.params import Completion, FinishReason, SamplingParams

if TYPE_CHECKING:
    from rz_agents.engine.images import SequenceImages

_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued (new, or preempted), holds no KV pages
    RUNNING = "running"  # holds a page table; prefilling or decoding
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request: its tokens, how many of them have K/V in the cache, and what it generated.

    ``pages`` is its page table (page of positions 64j..64j+63 at index j). ``num_cached`` counts
    the leading tokens whose K/V are written in those pages; the next forward
    feeds ``tokens[num_cached:]`` (a prefill chunk) or, once only the newest token is missing, that
    token alone (a decode step). The last sampled token never has K/V until it is fed.
    """

    prompt: list[int]
    params: SamplingParams
    seq_id: int = field(default_factory=lambda: next(_ids))
    status: SequenceStatus = SequenceStatus.WAITING
    pages: list[int] = field(default_factory=list)
    num_cached: int = 0
    num_cached_prompt_tokens: int = 0  # prompt tokens reused from the prefix cache at admission
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # python floats hold fp32 values exactly
    versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    cancelled: bool = False
    # True once a weight update kept this sequence's K/V ("keep" policy): its pages then mix
    # versions and must not become a prefix entry, whose reuse has to equal a cold prefill.
    kv_from_old_weights: bool = False
    admitted: bool = False  # set at its first admission (num_cached_prompt_tokens is from then)
    num_preemptions: int = 0  # times its pages were taken back (it then recomputes its K/V)
    indexed_pages: int = 0  # leading pages of ``pages`` the page pool's prefix index is done with
    # the index node of the last of them (pages.ROOT = 0 before any): the parent of the next page it indexes,
    # kept here because that page may already be given back behind a window (its column then names another)
    index_parent: int = 0
    # leading columns of ``pages`` given back behind a sliding window (each now an archive page's id:
    # engine/window_release.py)
    pages_released: int = 0
    generator: torch.Generator | None = None
    images: SequenceImages | None = None  # a vision-language request's images (engine/images.py)
    _index: list[int | str] | None = field(default=None, init=False, repr=False)

    def new_table(self, pages: list[int]) -> None:
        """Take ``pages`` as the page table (admission; [] when preempted or removed): none of it is indexed
        by the prefix index yet or given back behind a window."""
        self.pages, self.indexed_pages, self.index_parent, self.pages_released = pages, 0, 0, 0

    def __post_init__(self) -> None:
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)
        self._tokens = list(self.prompt) + list(self.output)

    @property
    def tokens(self) -> list[int]:
        """Prompt followed by every generated token (one list kept up to date; do not mutate)."""
        return self._tokens

    def index_tokens(self) -> list[int | str]:
        """The tokens as the prefix index keys them (engine/pages.py): ``tokens`` itself for text; with
        images, each prompt placeholder replaced by its image's label (``image_label``), because its K/V
        depend on its image's pixels, not only on its id. Kept up to date as tokens are sampled (those are
        ordinary tokens, placeholders included: engine/images.py)."""
        if self.images is None:
            return self._tokens
        if self._index is None:
            self._index = placeholder_labels(self.prompt, self.images)
        if len(self._index) < len(self._tokens):
            self._index.extend(self._tokens[len(self._index) :])
        return self._index

    @property
    def last_token(self) -> int:
        return self._tokens[-1]

    @property
    def num_tokens(self) -> int:
        return len(self._tokens)

    @property
    def num_pending(self) -> int:
        """Tokens still to feed through the model before the next token can be sampled."""
        return self.num_tokens - self.num_cached

    def append(self, token: int, logprob: float, version: int) -> None:
        self._tokens.append(int(token))
        self.output.append(int(token))
        self.logprobs.append(float(logprob))
        self.versions.append(int(version))

    def finish(self, reason: FinishReason, stop_reason: int | str | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason

    def to_completion(self) -> Completion:
        return Completion(
            prompt=list(self.prompt),
            tokens=list(self.output),
            logprobs=torch.tensor(self.logprobs, dtype=torch.float32),
            versions=list(self.versions),
            finish_reason=self.finish_reason or "error",
            num_cached_prompt_tokens=self.num_cached_prompt_tokens,
            error=self.error,
            stop_reason=self.stop_reason,
        )


def image_label(key: tuple) -> str:
    """One image's label in the prefix index: a string (never equal to a token id; its hash is computed
    once) naming the image's content key (engine/images.py: ``image_key``, a digest of the tower's input
    pixels, their dtype and shape, and the grid)."""
    digest, dtype, shape, grid = key
    return f"<image {digest} {dtype} {list(shape)} {list(grid)}>"


def placeholder_labels(prompt: list[int], images: SequenceImages) -> list[int | str]:
    """``prompt`` with the placeholders of image i replaced by image i's label.

    A page of these items, under the hash chain of the pages before it, names everything its K/V depend on:
    the tokens, which image each placeholder belongs to (and, through the grid, the 3D RoPE positions), and
    the images' pixels. Two prompts with equal ids but other pixels thus part at their first placeholder.
    """
    items: list[int | str] = list(prompt)
    slots = images.slots.tolist()
    for i, key in enumerate(images.keys):
        label = image_label(key)
        for slot in slots[images.token_rows[i] : images.token_rows[i + 1]]:
            items[slot] = label
    return items
