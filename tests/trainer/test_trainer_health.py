"""The collapse alarm: a pure function of the metric history, checked against hand-made histories and
replayed on the committed per-step figures of the lag sweeps (experiments/results/)."""

import csv
import json
import math
from pathlib import Path

import pytest

from rz_agents.trainer.health import (
    HealthMonitor,
    HealthThresholds,
    collapse_alarm,
    health_summary,
    window_state,
)

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"


def _rows(kl, ess):
    return [
        {"step": i, "kl_k3_behavior_to_learner": k, "is_weight_ess_fraction": e}
        for i, (k, e) in enumerate(zip(kl, ess, strict=True))
    ]


def _csv(path: Path) -> list[dict[str, float]]:
    with open(path) as f:
        return [{k: float(v) if v != "" else math.nan for k, v in r.items()} for r in csv.DictReader(f)]


def test_alarm_fires_on_the_first_full_window_whose_kl_median_crosses_the_bound():
    th = HealthThresholds(window=3, kl_k3_max=0.5, ess_fraction_min=0.3)
    kl = [0.0, 0.1, 9.0, 0.1, 0.2, 0.6, 0.7]  # one spike (step 2) is not enough; steps 4-6 have median 0.6
    alarm = collapse_alarm(_rows(kl, [1.0] * 7), th)
    assert alarm["step"] == 6 and alarm["kl_k3_median"] == pytest.approx(0.6)
    assert "KL k3 median 0.6 > 0.5" in alarm["reason"]


def test_alarm_fires_on_a_low_ess_median_and_waits_for_a_full_window():
    th = HealthThresholds(window=3)
    assert collapse_alarm(_rows([0.0, 0.0], [0.01, 0.01]), th) is None  # two steps: not a full window
    alarm = collapse_alarm(_rows([0.0] * 4, [0.9, 0.2, 0.1, 0.25]), th)
    assert alarm["step"] == 2 and "ESS/n median 0.2 < 0.3" in alarm["reason"]


def test_steps_without_figures_are_skipped_not_counted_as_healthy():
    th = HealthThresholds(window=2)
    rows = _rows([1.0, 1.0], [1.0, 1.0])
    rows.insert(1, {"step": 99, "kl_k3_behavior_to_learner": "nan"})  # an empty batch: nothing logged
    assert collapse_alarm(rows, th)["step"] == 1
    assert window_state(rows, th)["kl_k3_median"] == 1.0


def test_summary_and_monitor_agree_with_the_pure_function():
    th = HealthThresholds(window=2)
    rows = _rows([0.0, 0.1, 0.8, 0.9, 0.9], [1.0] * 5)
    s = health_summary(rows, th)
    assert s["status"] == "alarm" and s["alarm"]["step"] == 3 and "lower learner.optim.lr" in s["advice"]
    assert health_summary(_rows([0.0] * 5, [1.0] * 5), th)["status"] == "ok"
    assert health_summary([], th)["status"] == "no_data"
    mon = HealthMonitor(th=th)
    out = [mon.update(r) for r in rows]
    assert [o["health_alarm"] for o in out] == [0, 0, 0, 1, 1]
    assert "health_alarm_message" in out[3] and "health_alarm_message" not in out[4]
    assert out[4]["health_kl_k3_trend"] == pytest.approx(0.9 - 0.45)
    # A resumed run (history replayed) does not announce an alarm that already fired.
    resumed = HealthMonitor(rows, th)
    assert "health_alarm_message" not in resumed.update(
        {"step": 5, **{k: v for k, v in rows[-1].items() if k != "step"}}
    )


# ---- the committed runs --------------------------------------------------------------------------------
COLLAPSING = [
    *[f"lag_sweep_demo/{a}-s{s}" for a in ("rz_lag64", "rz_lag128", "std_is_lag64") for s in range(3)],
    *[
        f"lag_sweep_demo/{a}-s{s}"
        for a in ("std_seq_gate_lag64", "std_tis_lag64", "std_token_gate_lag64")
        for s in range(3)
    ],
    *[f"lag_sweep_demo_d2/{a}-s{s}" for a in ("rz_lag64", "std_is_lag64") for s in range(3)],
]
STABLE = [
    *[
        f"{d}/sync-s{s}"
        for d in ("lag_sweep_demo", "lag_sweep_demo_d2", "lag_sweep_demo_lr2.5e-5")
        for s in range(3)
    ],
    *[f"lag_sweep_demo/rz_lag2-s{s}" for s in range(3)],
    *[
        f"lag_sweep_demo_lr2.5e-5/{a}-s{s}"
        for a in ("rz_lag64", "std_is_lag64", "rz_lag128")
        for s in range(3)
    ],
]


def _peak_step(rows, window=10):
    means = [
        sum(r["reward_mean"] for r in rows[max(0, i - window + 1) : i + 1]) / min(i + 1, window)
        for i in range(len(rows))
    ]
    return max(range(len(means)), key=means.__getitem__)


@pytest.mark.parametrize("run", COLLAPSING)
def test_alarm_fires_on_collapsing_runs_before_the_behavior_reward_peaks(run):
    rows = _csv(RESULTS / f"{run}.csv")
    assert json.loads((RESULTS / f"{run}.json").read_text())["heldout_accuracy"] < 0.3  # it did collapse
    alarm = collapse_alarm(rows)
    assert alarm is not None and alarm["step"] < _peak_step(rows)


@pytest.mark.parametrize("run", STABLE)
def test_alarm_stays_silent_on_sync_lag2_and_low_lr_runs(run):
    assert collapse_alarm(_csv(RESULTS / f"{run}.csv")) is None
