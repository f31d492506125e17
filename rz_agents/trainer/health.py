"""Run health: rolling ESS/n and behavior->learner KL, the collapse alarm, and what to do when it fires.

Per learner step the learner logs the batch's Kish ESS/n of the token IS weights (``is_weight_ess_fraction``)
and the k3 estimate of KL(behavior || learner) per token (``kl_k3_behavior_to_learner``). One step is noisy
(a single odd batch can read ESS/n 0.01), so the alarm looks at the median of the last ``window`` steps:

    alarm  when  median_window(kl_k3) > kl_k3_max (0.5 nats/token)  or  median_window(ESS/n) < ess_min (0.3)

and only once the window is full. Calibrated offline on the committed per-step figures of
experiments/results/ (docs/results.md, "Collapse alarm"): it fires on every collapsing lag-64 / lag-128 run
at the demo's learning rate between steps 9 and 34, long before their behavior reward peaks (steps 93-158),
and never on the sync, lag-2, lag-8 or lr-2.5e-5 runs (their window medians stay at KL <= 0.35 and
ESS/n >= 0.49). It does not see a collapse that happens within fewer steps than the window (lag 8, seed 2
fell in one step at the very end).

Everything here is a pure function of the metric history (a list of per-step dicts, as in metrics.jsonl or
the experiments' CSVs), so the alarm is tested on those files; ``HealthMonitor`` applies it step by step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

KL_KEY = "kl_k3_behavior_to_learner"
ESS_KEY = "is_weight_ess_fraction"

ADVICE = (
    "the policy has moved far from the one that sampled its data: lower learner.optim.lr, lower "
    "rollout.max_lag (or set rollout.lag_governor: true), or switch learner.loss.estimator to one that "
    "bounds the ratio (ppo_clip, m2po); see docs/results.md"
)


@dataclass(frozen=True)
class HealthThresholds:
    """The alarm's window (learner steps) and bounds (see the module docstring for how they were chosen)."""

    window: int = 10
    kl_k3_max: float = 0.5
    ess_fraction_min: float = 0.3


def _finite(row: Mapping[str, Any], key: str) -> float | None:
    v = row.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def window_state(rows: Sequence[Mapping[str, Any]], th: HealthThresholds = HealthThresholds()) -> dict:
    """Medians of KL k3 and ESS/n over the last ``th.window`` rows that logged them (steps with no sampled
    token, e.g. an empty batch, do not count), and whether that window is full."""
    kl = [v for v in (_finite(r, KL_KEY) for r in rows) if v is not None][-th.window :]
    ess = [v for v in (_finite(r, ESS_KEY) for r in rows) if v is not None][-th.window :]
    return {
        "kl_k3_median": statistics.median(kl) if kl else math.nan,
        "ess_fraction_median": statistics.median(ess) if ess else math.nan,
        "full": len(kl) >= th.window and len(ess) >= th.window,
    }


def alarm_reason(state: Mapping[str, Any], th: HealthThresholds = HealthThresholds()) -> str | None:
    """Why a window's state is an alarm (None when it is not, or the window is not full yet)."""
    if not state["full"]:
        return None
    reasons = []
    if state["kl_k3_median"] > th.kl_k3_max:
        reasons.append(f"KL k3 median {state['kl_k3_median']:.3g} > {th.kl_k3_max:g} nats/token")
    if state["ess_fraction_median"] < th.ess_fraction_min:
        reasons.append(f"ESS/n median {state['ess_fraction_median']:.3g} < {th.ess_fraction_min:g}")
    return " and ".join(reasons) or None


def collapse_alarm(
    history: Sequence[Mapping[str, Any]], th: HealthThresholds = HealthThresholds()
) -> dict[str, Any] | None:
    """The first step at which the alarm fires over ``history`` (None if it never does): its step (the
    row's ``step``, else its index), the reason, and the window medians then."""
    kl: list[float] = []
    ess: list[float] = []
    for i, row in enumerate(history):
        k, e = _finite(row, KL_KEY), _finite(row, ESS_KEY)
        if k is None or e is None:
            continue
        kl.append(k)
        ess.append(e)
        if len(kl) < th.window:
            continue
        state = {
            "kl_k3_median": statistics.median(kl[-th.window :]),
            "ess_fraction_median": statistics.median(ess[-th.window :]),
            "full": True,
        }
        reason = alarm_reason(state, th)
        if reason:
            step = row.get("step", i)
            return {"step": int(step) if isinstance(step, (int, float)) else i, "reason": reason, **state}
    return None


def alarm_message(alarm: Mapping[str, Any]) -> str:
    """The one console line of a fired alarm."""
    return f"HEALTH ALARM at step {alarm['step']}: {alarm['reason']}; {ADVICE}"


def health_summary(history: Sequence[Mapping[str, Any]], th: HealthThresholds = HealthThresholds()) -> dict:
    """The ``health`` field of summary.json: status ("ok", "alarm", or "no_data" when no step logged the
    figures), the first alarm, the thresholds, the last window's medians, and what to do."""
    alarm = collapse_alarm(history, th)
    state = window_state(history, th)
    has_data = not math.isnan(state["kl_k3_median"])
    return {
        "status": "alarm" if alarm else ("ok" if has_data else "no_data"),
        "alarm": alarm,
        "last_window": {k: state[k] for k in ("kl_k3_median", "ess_fraction_median")},
        "thresholds": asdict(th),
        "advice": ADVICE if alarm else None,
    }


class HealthMonitor:
    """Applies the alarm step by step during a run; ``update`` returns the step's health metrics.

    health_kl_k3_median / health_ess_fraction_median: the window medians; health_kl_k3_trend: the window's
    KL median minus the previous window's (nats/token per ``window`` steps; > 0: drifting apart);
    health_alarm: 1 while the window is in alarm; health_alarm_message: on the first step it fires only.
    """

    def __init__(self, history: Sequence[Mapping[str, Any]] = (), th: HealthThresholds = HealthThresholds()):
        self.th = th
        self.kl: list[float] = []
        self.ess: list[float] = []
        self.fired: dict[str, Any] | None = collapse_alarm(history, th)  # a resumed run's earlier alarm
        for row in history:
            self._record(row)

    def _record(self, row: Mapping[str, Any]) -> bool:
        k, e = _finite(row, KL_KEY), _finite(row, ESS_KEY)
        if k is None or e is None:
            return False
        self.kl.append(k)
        self.ess.append(e)
        keep = 2 * self.th.window
        del self.kl[:-keep], self.ess[:-keep]
        return True

    def update(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Record one step's metrics (with its ``step``); return the health metrics to log with it."""
        if not self._record(metrics):
            return {}
        w = self.th.window
        state = {
            "kl_k3_median": statistics.median(self.kl[-w:]),
            "ess_fraction_median": statistics.median(self.ess[-w:]),
            "full": len(self.kl) >= w,
        }
        out: dict[str, Any] = {
            "health_kl_k3_median": state["kl_k3_median"],
            "health_ess_fraction_median": state["ess_fraction_median"],
        }
        if len(self.kl) >= 2 * w:
            out["health_kl_k3_trend"] = state["kl_k3_median"] - statistics.median(self.kl[-2 * w : -w])
        reason = alarm_reason(state, self.th)
        out["health_alarm"] = int(reason is not None)
        if reason and self.fired is None:
            self.fired = {"step": int(metrics.get("step", 0)), "reason": reason, **state}
            out["health_alarm_message"] = alarm_message(self.fired)
        return out
