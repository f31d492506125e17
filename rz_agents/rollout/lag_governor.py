"""The lag governor: an admission bound for async runs that follows the measured effective sample size.

``rollout.max_lag`` is a hard bound (no trained token is older). With ``rollout.lag_governor: true`` the
rollouts are admitted under a smaller, moving bound b (``RolloutController.admission_lag``): after every
learner step, with e the median ESS/n (``is_weight_ess_fraction``) of the last ``window`` steps,

    e <  target            ->  b = max(min_lag, b // 2)            (the data got too stale: halve)
    e >= (1 + target) / 2  ->  b = min(max_lag, b + max(1, b // 4))  (healthy again: grow back, +25%)
    otherwise              ->  b unchanged

starting at max_lag. Halving answers a collapse within a few steps; growing by a quarter returns from 1 to
64 in about 17 healthy steps. The bound is logged per step (``rollout_admission_lag``). It bounds what is
trained as well as what is admitted: a finished group with a token older than b is dropped
(``rollout_groups_dropped_stale``), since with many episodes in flight the groups admitted under the old,
larger bound fill many batches (measured on the demo with 512 in flight: admission alone kept training on
lag 10-25 data for 20-25 steps after b reached 1, and the run collapsed). What it costs: a
smaller b lets the rollouts run fewer batches ahead of the learner, so the engine idles while the learner
trains once the queue is drained (at b = 1 generation overlaps training by one batch, as with
max_ahead_batches: 2).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

ESS_KEY = "is_weight_ess_fraction"
BOUND_KEY = "rollout_admission_lag"


class LagGovernor:
    """AIMD control of the admission bound on the rolling ESS/n (see the module docstring)."""

    def __init__(self, max_lag: int, target_ess: float = 0.5, min_lag: int = 1, window: int = 3) -> None:
        if not 0.0 < target_ess < 1.0:
            raise ValueError(f"rollout.lag_governor_target_ess must be in (0, 1), got {target_ess}")
        self.max_lag = max_lag
        self.min_lag = min(min_lag, max_lag)
        self.target = target_ess
        self.recover = (1.0 + target_ess) / 2
        self.window = window
        self.bound = max_lag
        self._ess: list[float] = []

    @classmethod
    def resumed(cls, history: Sequence[Mapping[str, Any]], **kwargs: Any) -> LagGovernor:
        """A governor that continues a run: its last logged bound and ESS window."""
        gov = cls(**kwargs)
        for row in history:
            if isinstance(row.get(BOUND_KEY), int):
                gov.bound = min(max(row[BOUND_KEY], gov.min_lag), gov.max_lag)
            gov._record(row.get(ESS_KEY))
        return gov

    def _record(self, ess: Any) -> bool:
        if isinstance(ess, (int, float)) and math.isfinite(ess):
            self._ess = [*self._ess, float(ess)][-self.window :]
            return True
        return False

    def update(self, ess_fraction: float | None) -> int:
        """Record one step's ESS/n (None or non-finite: a step without stale tokens, bound kept) and return
        the bound for admitting the next groups."""
        if not self._record(ess_fraction):
            return self.bound
        e = statistics.median(self._ess)
        if e < self.target:
            self.bound = max(self.min_lag, self.bound // 2)
        elif e >= self.recover:
            self.bound = min(self.max_lag, self.bound + max(1, self.bound // 4))
        return self.bound
