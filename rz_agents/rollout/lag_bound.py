"""The run's lag bound, held in one object that the controller, the trajectory queue, the governor and the
training loop all read (and the learner takes its hard bound from).

``LagPolicy`` (lag_policy.py) is what the config decided and never changes; ``LagBound`` adds what moves
during the run and what follows from both:

- ``hard``: no trained token is older (rollout.max_lag, or the fixed lag; 0 when synchronous);
- ``admission``: the bound new groups are admitted under: ``hard``, or the lag governor's moving bound when
  it is lower (rollout.lag_governor; the governor lives here, fed each step's metrics by ``observe``);
- ``train``: the oldest lag a group may have when the learner takes it: ``hard`` when stale groups are paced
  (rollout.stale_groups: pace: the learner waits rather than let a group in flight pass ``hard``),
  ``admission`` when they are dropped;
- ``ahead_batches()``: how many batches past the learner's the rollouts may be admitted into.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rz_agents.rollout.lag_governor import BOUND_KEY, ESS_KEY, KL_KEY, LagGovernor
from rz_agents.rollout.lag_policy import LagPolicy


class LagBound:
    """The lag bound of one run (see the module docstring); ``policy`` is the config's decision."""

    def __init__(self, policy: LagPolicy, stale_groups: str = "pace") -> None:
        self.policy = policy
        # sync and fixed-lag runs generate one batch at a time: nothing to pace
        self.paced = stale_groups == "pace" and policy.kind == "bounded"
        self.governor: LagGovernor | None = policy.governor_for([])

    # -- what the config decided ----------------------------------------------------------------
    @property
    def hard(self) -> int:
        """No trained token is older than this."""
        return self.policy.bound

    @property
    def fixed_lag(self) -> int | None:
        return self.policy.fixed_lag

    # -- what moves -----------------------------------------------------------------------------
    @property
    def admission(self) -> int:
        """The bound new groups are admitted under: ``hard``, or the governor's when it is lower."""
        return self.hard if self.governor is None else min(self.hard, self.governor.bound)

    @property
    def train(self) -> int:
        """The oldest lag a group may have when the learner takes it (older ones are dropped)."""
        return self.hard if self.paced else self.admission

    def ahead_batches(self) -> int:
        """How many batches past the learner's the rollouts may be admitted into."""
        return self.policy.ahead_batches(None if self.governor is None else self.governor.bound)

    def resume(self, history: Sequence[Mapping[str, Any]]) -> None:
        """Continue a run: the governor takes its last logged bound and its windows from ``history``."""
        self.governor = self.policy.governor_for(history)

    def observe(self, metrics: dict[str, Any]) -> None:
        """After a learner step: the governor reads its ESS/n and KL k3 and moves the admission bound, logged
        in ``metrics`` as rollout_admission_lag (nothing without a governor)."""
        if self.governor is not None:
            metrics[BOUND_KEY] = self.governor.update(metrics.get(ESS_KEY), metrics.get(KL_KEY))
