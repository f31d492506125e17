"""The learner's log-probs of trajectories: the packed training forward of a text model, or of a
vision-language model with each trajectory's images (re-encoded in one vision call per micro-batch, which
gives every image the bits the engine's encoding gave it: model/vision.py).

A trajectory keeps its images as PNG bytes (``Trajectory.images``); they are preprocessed here with the
same deterministic ``png_image_inputs`` the rollout's chat template uses for the engine's request, so the
tower sees the same pixel_values on both sides. Image placeholders are the template's (not sampled) ones: a
sampled ``<|image_pad|>`` is an ordinary token to the engine, and so to the learner."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.trajectory import SEGMENTS_WITH_IMAGES, Trajectory


def trajectory_logprobs(
    model: torch.nn.Module,
    trajs: Sequence[Trajectory],
    scoring: Mapping[str, Any],
    sampled_only: bool = False,
) -> list[torch.Tensor]:
    """fp32 [len-1] log-probs of tokens[1:] of each trajectory under ``scoring`` (the sampling distribution's
    temperature / top_k / top_p), from one packed forward.

    A trajectory of several segments (``Trajectory.segment_starts``: an agent that compacted its history) is
    scored as one packed sequence per segment, each from position 0 as the engine sampled it; the entry that
    would predict a segment's first token from the previous segment is 0.0 (that token is never sampled).

    ``sampled_only``: compute only the sampled tokens' log-probs (``loss_mask``; the same bits), the other
    entries are 0.0: the learner's loss reads no other, and the LM head then skips every prompt and
    observation row."""
    # (warm-start demonstrations and other trajectory-shaped records have no segments)
    if any(getattr(t, "segment_starts", None) for t in trajs):
        return _segmented_logprobs(model, trajs, scoring, sampled_only)
    # the model turns each trajectory into what the packer takes (its images too, for a model that takes
    # them; a text model refuses images): the forward contract, model/transformer.py
    seqs = [model.scored_sequence(t.tokens, t.images, t.loss_mask) for t in trajs]
    scored = [t.loss_mask[1:] for t in trajs] if sampled_only else None
    return packed_token_logprobs(model, seqs, **scoring, scored=scored)


def _segmented_logprobs(
    model: torch.nn.Module, trajs: Sequence[Trajectory], scoring: Mapping[str, Any], sampled_only: bool
) -> list[torch.Tensor]:
    if any(t.segment_starts and t.images for t in trajs):
        raise ValueError(SEGMENTS_WITH_IMAGES)  # Trajectory.validate drops these at their producer
    pieces, owners = [], []
    for i, t in enumerate(trajs):
        for a, b in t.segments():
            pieces.append(Trajectory(t.tokens[a:b], t.loss_mask[a:b], t.behavior_logprobs[a:b],
                                     t.versions[a:b], t.reward, t.group_id))  # fmt: skip
            owners.append(i)
    scored = trajectory_logprobs(model, pieces, scoring, sampled_only)
    out: list[list[torch.Tensor]] = [[] for _ in trajs]
    for i, lp in zip(owners, scored, strict=True):
        if out[i]:  # the row predicting this segment's first token across the boundary: never sampled
            out[i].append(lp.new_zeros(1))
        out[i].append(lp)
    return [torch.cat(parts) for parts in out]
