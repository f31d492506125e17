"""A learning-rate controller that keeps the learner within a KL budget of the weights that sampled its data.

At high policy lag the batch was sampled by weights many updates old, and what breaks training there is
the learner moving too far from them per stretch of lag (docs/results.md: at the demo's lr lag 64 drifts to
KL k3 1.4-2.0 per token and collapses; at 1/8 of that lr it stays near 0.2 and learns). The controller
measures that distance on every batch, the behavior -> learner KL k3 of its sampled tokens (computed
before the update, the ``kl_k3_behavior_to_learner`` metric), and scales the step's learning rate:

    kl > target * band   ->  scale = max(min_scale, scale / factor)
    kl < target / band   ->  scale = min(1, scale * factor)
    otherwise            ->  scale unchanged                      (the dead band: no chatter)

and the step runs at lr = schedule(step) * scale. The scale starts at 1 and never exceeds it, so a run whose
KL stays under target / band (synchronous, low lag, or a learning rate already small enough) trains exactly
as without the controller. The rule is the adaptive-KL rule of PPO (Schulman et al. 2017, there applied to
a penalty coefficient) applied to the step size. It changes no estimator: REINFORCE Zero's unclipped IS is
still the loss.

The KL it reads lags the updates that caused it: at policy lag k the batch was sampled k updates ago, so a
run of full-rate steps shows in the KL only up to k steps later (measured on the lag-64 demo: the scale
recovered to 1 while the KL still reflected the slow steps before, and the full-rate steps then broke the
policy). ``lr_lag_budget`` B is the open-loop part that does not wait for the sensor: lr * lag, which
bounds how far the learner moves from the weights that sampled its batch, is held at most B, lag being the
mean policy lag of the batch's trained tokens:

    lr = schedule(step) * kl_scale * min(1, B / (schedule(step) * lag))   (either factor 1 when its field
                                                                           is null)

so the rate is untouched wherever lr * lag <= B already: at low lag, or at a learning rate already small
enough for the lag (the demo: B = 1.6e-3, the demo's lr 2e-4 at lag 8, where it learns; at lag 64 that is
the demo's lr / 8 = 2.5e-5, the rate at which lag 64 was stable; at lr 2.5e-5 and lag 64 nothing changes).
B is a property of the task and model (how far a policy may move before its stale samples stop teaching
it), measured on the demo; on another task measure it as docs/results.md does.

Off by default (``kl_target: null``, ``lr_lag_budget: null``). Every rank sees the same KL (the log-probs are
reduced before the metric), so every rank takes the same scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class LrControlConfig:
    """``kl_target``: the KL k3 per sampled token the controller steers to (None: off); ``band``: the dead
    band's factor either side of it; ``factor``: how much one step scales the rate; ``min_scale``: the
    smallest scale (a floor, so the learner never stops outright); ``lr_lag_budget``: the most lr * lag may
    be, the rate scaled down to meet it (None: not scaled by lag)."""

    kl_target: float | None = None
    lr_lag_budget: float | None = None
    band: float = 2.0
    factor: float = 1.5
    min_scale: float = 0.05

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if self.kl_target is not None and not (math.isfinite(self.kl_target) and self.kl_target > 0):
            raise ValueError(f"lr_control.kl_target must be > 0 or null, got {self.kl_target}")
        if self.lr_lag_budget is not None and not (
            math.isfinite(self.lr_lag_budget) and self.lr_lag_budget > 0
        ):
            raise ValueError(f"lr_control.lr_lag_budget must be > 0 or null, got {self.lr_lag_budget}")
        if not self.band > 1.0:
            raise ValueError(f"lr_control.band must be > 1, got {self.band}")
        if not self.factor > 1.0:
            raise ValueError(f"lr_control.factor must be > 1, got {self.factor}")
        if not 0.0 < self.min_scale <= 1.0:
            raise ValueError(f"lr_control.min_scale must be in (0, 1], got {self.min_scale}")


class KLLrController:
    """The scale of the learning rate, updated once per step from the batch's KL (see the module)."""

    def __init__(self, cfg: LrControlConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.scale = 1.0  # the KL part (the state carried from step to step)

    @property
    def enabled(self) -> bool:
        return self.cfg.kl_target is not None or self.cfg.lr_lag_budget is not None

    def update(self, kl: float | None, lag: float | None = None, lr: float | None = None) -> float:
        """The scale this step's update uses, after seeing its batch's KL and mean lag, at the schedule's
        rate ``lr`` (a None or non-finite measurement: that part unchanged)."""
        cfg = self.cfg
        if cfg.kl_target is not None and kl is not None and math.isfinite(kl):
            if kl > cfg.kl_target * cfg.band:
                self.scale = max(cfg.min_scale, self.scale / cfg.factor)
            elif kl < cfg.kl_target / cfg.band:
                self.scale = min(1.0, self.scale * cfg.factor)
        return self.scale * self.lag_scale(lag, lr)

    def lag_scale(self, lag: float | None, lr: float | None) -> float:
        """min(1, B / (lr * lag)); 1 without a budget, a measured lag or a rate."""
        budget = self.cfg.lr_lag_budget
        if budget is None or lag is None or lr is None or not (math.isfinite(lag) and math.isfinite(lr)):
            return 1.0
        if lr * lag <= budget:
            return 1.0
        return budget / (lr * lag)

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore ``state_dict``'s scale; None (a checkpoint from before the controller) restores 1."""
        self.scale = float(state["scale"]) if state else 1.0
