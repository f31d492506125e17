"""The forward contract's one hook for a family's extra inputs: ``extra_inputs(segments)``.

A packed forward feeds runs of tokens of many sequences (the learner's whole sequences, the engine's prefill
chunks and decode rows). What a family needs beyond tokens, positions, sequence ids and the cache (a
vision-language model: its tokens' 3D RoPE positions and the embeddings of the image placeholders) is
described per run as a ``Segment``, built by whoever holds the images (the engine's image cache, the
learner's trajectories), and the model turns the batch's segments into its forward's keyword inputs. The
engine runner and the learner's packer both ask the model through this hook, never a check of its type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rz_agents.model.vision import ImageEmbeddings


@dataclass
class Segment:
    """One run of a sequence's tokens in a packed forward, as a family's extra inputs see it."""

    start: int  # index of the run's first token in its sequence
    length: int
    rope: torch.Tensor | None = None  # [3, length] 3D RoPE positions (None: every axis the token index)
    images: ImageEmbeddings | None = None  # the embedding rows of the image placeholders it holds, in order
    slots: torch.Tensor | None = None  # those placeholders' indices within the run

    @property
    def plain(self) -> bool:
        """True for a run of text tokens rotated by their index: a text model's only kind."""
        return self.rope is None and self.images is None


def refuse_images(model_name: str, segments: list[Segment]) -> dict:
    """A text model's ``extra_inputs``: none; segments with images or 3D positions raise ValueError."""
    if not all(s.plain for s in segments):
        raise ValueError(f"{model_name} takes no images or 3D RoPE positions (it is a text model)")
    return {}
