"""The sampling distribution of a run: what the engine samples from and the learner scores under.

A run decides it once (``rollout.temperature``, ``rollout.top_k``, ``rollout.top_p``; see
``rz_agents.runtime.plan.resolve``) and hands the same ``SamplingSpec`` to the rollout controller (its
engine requests) and to the learner (``packed_token_logprobs`` of the trained tokens): a token's behavior
log-prob and its learner log-prob are then log-probs of one distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplingSpec:
    """temperature (0: greedy, scored at temperature 1), top_k (0: off), top_p (1: off)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)):
            raise ValueError(f"rollout.temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"rollout.temperature must be >= 0, got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"rollout.top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")

    def scoring(self) -> dict[str, Any]:
        """Keyword arguments of ``packed_token_logprobs`` that score tokens under this distribution."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
