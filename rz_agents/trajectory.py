"""The token-level record of one episode, shared by the rollout side and the learner.

Every per-token list has one entry per token of ``tokens``. Tokens the policy did not sample (the prompt,
observations, chat-template glue) have ``loss_mask`` False, ``behavior_logprobs`` 0.0 and ``versions`` -1.

``images`` holds the episode's images (screenshots, rendered pictures) as PNG bytes, one entry per image
the chat template placed in ``tokens``, in the order they appear there: a learner decodes them
(``rz_agents.images.from_png``) and re-encodes exactly the pixels the policy saw. PNG is lossless
and compact (a 1280x720 desktop is ~50-150 KB), and bytes survive every way a trajectory travels
(``to_dict``, pickle for Ray and the learner process, ``torch.save`` in checkpoints). Text-only
episodes leave it empty.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"  # the first 8 bytes of every PNG file

# Why a trajectory may not have both (its producer drops the episode with this line; the learner refuses it
# too): a segment is scored as its own sequence from position 0, and which of the episode's images belong to
# which segment is not recorded in the trajectory (an image kept across a rewrite is rendered again in the new
# segment). Where it arises: an rz serve session of a vision-language policy whose agent rewrote its history;
# the agent's episode is then dropped and counted with this reason (agents/openai_api, agents/miniswe).
SEGMENTS_WITH_IMAGES = (
    "a trajectory with both images and history segments (an agent that rewrote a history holding images) is "
    "not supported yet: each segment would need its own images; keep the history append-only"
)
NOT_SAMPLED = -1  # the version recorded for tokens the policy did not sample


class TrajectoryError(ValueError):
    """A trajectory whose fields do not fit together (lengths, mask, values)."""


@dataclass
class Trajectory:
    """One episode as tokens: the prompt, every sampled turn and every observation, never re-tokenized."""

    tokens: list[int]
    loss_mask: list[bool]
    behavior_logprobs: list[float]
    versions: list[int]
    reward: float
    group_id: int | str
    info: dict[str, Any] = field(default_factory=dict)
    images: list[bytes] = field(default_factory=list)  # PNG bytes, in order of appearance in tokens
    # Where a new token segment starts (offsets into tokens, ascending; none: the episode is one segment).
    # An agent that rewrote its history (a summary, a truncation, a sliding window) sampled each segment
    # from its own prompt: the model saw each segment from its first token at position 0, so the learner
    # scores each as a sequence of its own, and every segment's sampled tokens are trained.
    segment_starts: list[int] = field(default_factory=list)

    def segments(self) -> list[tuple[int, int]]:
        """The ``[start, end)`` token ranges of the episode's segments (one range when it has none)."""
        bounds = [0, *self.segment_starts, len(self.tokens)]
        return list(zip(bounds[:-1], bounds[1:], strict=True))

    def sampled_versions(self) -> list[int]:
        """The policy versions of the sampled tokens, in order."""
        return [v for v, m in zip(self.versions, self.loss_mask, strict=False) if m]

    def oldest_version(self) -> int | None:
        """The smallest policy version among sampled tokens (None when nothing was sampled)."""
        vs = self.sampled_versions()
        return min(vs) if vs else None

    def validate(self) -> None:
        """Raise TrajectoryError naming the first inconsistency; a valid trajectory returns None."""
        n = len(self.tokens)
        if n < 2:
            raise TrajectoryError(f"trajectory needs at least 2 tokens, got {n}")
        for name in ("loss_mask", "behavior_logprobs", "versions"):
            got = len(getattr(self, name))
            if got != n:
                raise TrajectoryError(f"{name} has {got} entries for {n} tokens")
        if self.loss_mask[0]:
            raise TrajectoryError("the first token cannot be sampled (it has no context)")
        if not any(self.loss_mask):
            raise TrajectoryError("trajectory has no sampled token")
        if not math.isfinite(float(self.reward)):
            raise TrajectoryError(f"reward is not finite: {self.reward!r}")
        for t, (m, lp, v) in enumerate(
            zip(self.loss_mask, self.behavior_logprobs, self.versions, strict=False)
        ):
            if m and (v < 0 or not (lp <= 0.0)):  # `not <=` also rejects NaN
                raise TrajectoryError(f"sampled token {t}: version {v}, behavior logprob {lp!r}")
        starts = [0, *self.segment_starts]
        for a, b in zip(starts, [*self.segment_starts, n], strict=True):
            if not isinstance(b, int) or b - a < 2:
                raise TrajectoryError(f"segment_starts {self.segment_starts}: each segment needs >= 2 tokens")
        for s in self.segment_starts:
            if self.loss_mask[s]:
                raise TrajectoryError(f"token {s} starts a segment: it cannot be sampled (it has no context)")
        if self.segment_starts and self.images:
            raise TrajectoryError(SEGMENTS_WITH_IMAGES)
        for i, img in enumerate(self.images):
            if not isinstance(img, (bytes, bytearray)) or bytes(img[:8]) != PNG_SIGNATURE:
                got = type(img).__name__ if not isinstance(img, (bytes, bytearray)) else repr(bytes(img[:8]))
                raise TrajectoryError(f"images[{i}] is not PNG bytes ({got})")

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (for checkpoints and JSON)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        """Inverse of to_dict (a dict from before ``images`` / ``segment_starts`` has none)."""
        return cls(**d)
