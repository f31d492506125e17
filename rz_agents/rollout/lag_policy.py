"""The lag policy of a run: how stale a trained token may be, and how far the rollouts run ahead.

Decided once from the config (``LagPolicy.decide``; ``rz_agents.runtime.plan.resolve`` calls it) and handed
to everything that follows it: the rollout controller (admission, the trajectory queue's stale drop), the
learner (its lag bound and lag histograms) and the training loop (fixed-lag publication, the governor).

- ``sync``: mode: sync, or the on_policy estimator (synchronous by definition). Only lag-0 tokens are
  trained: one batch is generated with the current weights, trained, published, then the next starts.
- ``bounded``: async; no trained token is more than ``bound`` (rollout.max_lag) versions old. The rollouts
  run up to ``bound + 1`` batches ahead (fewer with rollout.max_ahead_batches, or under the lag governor's
  moving bound, rollout.lag_governor).
- ``fixed``: async, controlled experiments (rollout.fixed_lag: k): every trained token comes from weights
  exactly ``bound`` = k versions old; batches are generated one at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rz_agents.rollout.lag_governor import LagGovernor

LagKind = Literal["sync", "bounded", "fixed"]


@dataclass(frozen=True)
class LagPolicy:
    """``kind`` (see the module docstring), ``bound`` (the oldest lag a trained token may have),
    ``max_ahead_batches`` (None: as many as the bound allows), the lag governor (bounded runs only)."""

    kind: LagKind = "bounded"
    bound: int = 64
    max_ahead_batches: int | None = None
    governor: bool = False
    governor_target_ess: float = 0.5
    governor_max_kl: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in ("sync", "bounded", "fixed"):
            raise ValueError(f"LagPolicy.kind must be sync, bounded or fixed, got {self.kind!r}")
        if self.bound < 0 or (self.kind == "sync" and self.bound != 0):
            raise ValueError(f"LagPolicy.bound must be >= 0 (0 when sync), got {self.bound} ({self.kind})")
        if self.governor and self.kind != "bounded":
            raise ValueError(f"the lag governor moves a bounded lag; this run's lag is {self.kind}")

    @classmethod
    def decide(
        cls,
        *,
        mode: str,
        estimator: str,
        max_lag: int,
        fixed_lag: int | None,
        max_ahead_batches: int | None,
        lag_governor: bool,
        lag_governor_target_ess: float,
        lag_governor_max_kl: float = 0.1,
    ) -> LagPolicy:
        """The policy the config's fields (named in errors as written: ``rollout.max_lag`` ...) ask for.
        Raises ValueError naming the field on a bad value or a contradiction."""
        if max_lag < 0:
            raise ValueError(f"rollout.max_lag must be >= 0, got {max_lag}")
        if max_ahead_batches is not None and max_ahead_batches < 1:
            raise ValueError(f"rollout.max_ahead_batches must be >= 1 or None, got {max_ahead_batches}")
        if not 0.0 < lag_governor_target_ess < 1.0:
            raise ValueError(
                f"rollout.lag_governor_target_ess must be in (0, 1), got {lag_governor_target_ess}"
            )
        if not (lag_governor_max_kl > 0.0 and math.isfinite(lag_governor_max_kl)):
            raise ValueError(f"rollout.lag_governor_max_kl must be > 0, got {lag_governor_max_kl}")
        if lag_governor and fixed_lag is not None:
            raise ValueError("rollout.lag_governor moves the lag bound; rollout.fixed_lag fixes it: set one")
        synchronous = mode == "sync" or estimator == "on_policy"
        if fixed_lag is not None:
            if fixed_lag < 0:
                raise ValueError(f"rollout.fixed_lag must be >= 0 or None, got {fixed_lag}")
            if fixed_lag > max_lag:
                raise ValueError(
                    f"rollout.fixed_lag ({fixed_lag}) exceeds rollout.max_lag ({max_lag}): "
                    "raise max_lag to at least fixed_lag"
                )
            if max_ahead_batches not in (None, 1):
                raise ValueError(
                    "rollout.fixed_lag generates one batch at a time; rollout.max_ahead_batches must be "
                    f"1 or unset, got {max_ahead_batches}"
                )
            if fixed_lag and synchronous:
                raise ValueError(
                    f"rollout.fixed_lag ({fixed_lag}) needs mode: async and an off-policy estimator (mode is "
                    f"{mode!r}, learner.loss.estimator {estimator!r})"
                )
        if synchronous:
            return cls("sync", 0, max_ahead_batches)
        if fixed_lag is not None:
            return cls("fixed", fixed_lag, 1)
        return cls(
            "bounded",
            max_lag,
            max_ahead_batches,
            lag_governor and max_lag > 0,
            lag_governor_target_ess,
            lag_governor_max_kl,
        )

    @property
    def fixed_lag(self) -> int | None:
        """k of a fixed-lag run (the engines sample with version v - k), None otherwise."""
        return self.bound if self.kind == "fixed" else None

    def ahead_batches(self, admission_lag: int | None = None) -> int:
        """How many batches past the learner's the rollouts may be admitted into; ``admission_lag`` is the
        lag governor's current bound (<= ``bound``), None without one."""
        if self.kind == "fixed":
            return 1  # each batch is generated with the weights the runtime published for it
        ahead = (self.bound if admission_lag is None else admission_lag) + 1
        return ahead if self.max_ahead_batches is None else min(ahead, self.max_ahead_batches)

    def governor_for(self, history: Sequence[Mapping[str, Any]]) -> LagGovernor | None:
        """The lag governor continuing ``history`` (a resumed run's steps), or None without one."""
        if not self.governor:
            return None
        return LagGovernor.resumed(
            history, max_lag=self.bound, target_ess=self.governor_target_ess, max_kl=self.governor_max_kl
        )
