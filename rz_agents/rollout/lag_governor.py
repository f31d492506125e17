"""The lag governor: an admission bound for async runs that follows the measured effective sample size and
the behavior -> learner KL.

``rollout.max_lag`` is a hard bound (no trained token is older). With ``rollout.lag_governor: true`` the
rollouts are admitted under a smaller, moving bound b (``LagBound.admission``, lag_bound.py): after every
learner step, with e the median ESS/n (``is_weight_ess_fraction``) and k the median KL k3
(``kl_k3_behavior_to_learner``) of the last ``window`` steps,

    e <  target  or  k > max_kl              ->  b = max(min_lag, b // 2)   (the data got too stale: halve)
    e >= (1 + target) / 2  and  k <= max_kl / 2  ->  b = min(max_lag, b + 1)  (healthy: grow back by one)
    otherwise                                ->  b unchanged

starting at max_lag (AIMD, as TCP's congestion window). Halving answers a drift within a few steps; growing
by one version a step returns slowly to the lag that caused it. The KL is the earlier sensor: on the demo
with 512 episodes in flight the 3-step median KL k3 passed 0.1 some 15 steps before the ESS/n median fell
below 0.5 (lag-2 runs stay below 0.04, lag-8 ones pass 0.26); an ESS-only governor that grew back by 25% a
step returned to lag 64 within ~8 steps of each halving and collapsed (docs/results.md). The bound is logged
per step (``rollout_admission_lag``). It bounds what is trained as well as what is admitted: a finished
group with a token older than b is dropped (``rollout_groups_dropped_stale``), since with many episodes in
flight the groups admitted under the old, larger bound fill many batches (measured on that demo: admission
alone kept training on lag 10-25 data for 20-25 steps after b reached 1). What it costs: a smaller b lets
the rollouts run fewer batches ahead of the learner, so the engine idles while the learner trains once the
queue is drained (at b = 1 generation overlaps training by one batch, as with max_ahead_batches: 2), and the
dropped groups' episodes are generated for nothing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

ESS_KEY = "is_weight_ess_fraction"
KL_KEY = "kl_k3_behavior_to_learner"
BOUND_KEY = "rollout_admission_lag"


class LagGovernor:
    """AIMD control of the admission bound on the rolling ESS/n and KL k3 (see the module docstring)."""

    def __init__(
        self, max_lag: int, target_ess: float = 0.5, max_kl: float = 0.1, min_lag: int = 1, window: int = 3
    ) -> None:
        if not 0.0 < target_ess < 1.0:
            raise ValueError(f"rollout.lag_governor_target_ess must be in (0, 1), got {target_ess}")
        if not (max_kl > 0.0 and math.isfinite(max_kl)):
            raise ValueError(f"rollout.lag_governor_max_kl must be > 0, got {max_kl}")
        self.max_lag = max_lag
        self.min_lag = min(min_lag, max_lag)
        self.target = target_ess
        self.recover = (1.0 + target_ess) / 2
        self.max_kl = max_kl
        self.window = window
        self.bound = max_lag
        self._ess: list[float] = []
        self._kl: list[float] = []

    @classmethod
    def resumed(cls, history: Sequence[Mapping[str, Any]], **kwargs: Any) -> LagGovernor:
        """A governor that continues a run: its last logged bound and its ESS and KL windows."""
        gov = cls(**kwargs)
        for row in history:
            if isinstance(row.get(BOUND_KEY), int):
                gov.bound = min(max(row[BOUND_KEY], gov.min_lag), gov.max_lag)
            gov._record(row.get(ESS_KEY), row.get(KL_KEY))
        return gov

    def _record(self, ess: Any, kl: Any = None) -> bool:
        if not (isinstance(ess, (int, float)) and math.isfinite(ess)):
            return False
        self._ess = [*self._ess, float(ess)][-self.window :]
        kl_ok = isinstance(kl, (int, float)) and math.isfinite(kl)
        self._kl = [*self._kl, float(kl) if kl_ok else 0.0][-self.window :]
        return True

    def update(self, ess_fraction: float | None, kl_k3: float | None = None) -> int:
        """Record one step's ESS/n and KL k3 (ESS None or non-finite: a step without stale tokens, bound kept;
        KL missing: read as 0) and return the bound for admitting and training the next groups."""
        if not self._record(ess_fraction, kl_k3):
            return self.bound
        e, k = statistics.median(self._ess), statistics.median(self._kl)
        if e < self.target or k > self.max_kl:
            self.bound = max(self.min_lag, self.bound // 2)
        elif e >= self.recover and k <= self.max_kl / 2:
            self.bound = min(self.max_lag, self.bound + 1)
        return self.bound
