"""The collapse alarm (rz_agents.trainer.health) replayed offline on the committed per-step figures of every
lag-sweep run: the step it fired at vs the step the behavior reward peaked (10-step mean), and the run's
held-out reward.

    python3 experiments/health_alarm_check.py            # prints the markdown table docs/results.md shows
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, read_step_csv  # noqa: E402

from rz_agents.trainer.health import collapse_alarm  # noqa: E402


def reward_peak(rows: list[dict[str, float]], window: int = 10) -> tuple[int, float]:
    """(step, value) of the highest trailing ``window``-step mean of the behavior reward."""
    best = (0, -1.0)
    for i in range(len(rows)):
        w = [r["reward_mean"] for r in rows[max(0, i - window + 1) : i + 1]]
        m = sum(w) / len(w)
        if m > best[1]:
            best = (i, m)
    return best


def replay(csv_path: Path) -> dict:
    """The alarm and the reward peak of one run."""
    rows = read_step_csv(csv_path)
    alarm = collapse_alarm(rows)
    peak_step, peak = reward_peak(rows)
    summary = json.loads(csv_path.with_suffix(".json").read_text())
    return {
        "run": f"{csv_path.parent.name}/{csv_path.stem}",
        "heldout": summary["heldout_accuracy"],
        "fired": None if alarm is None else alarm["step"],
        "reason": None if alarm is None else alarm["reason"],
        "peak_step": peak_step,
        "peak": peak,
        "end": sum(r["reward_mean"] for r in rows[-10:]) / min(10, len(rows)),
    }


def main() -> int:
    print("| run | held-out | alarm fired at step | behavior reward peak (step: 10-step mean) | last 10 |")
    print("|---|---|---|---|---|")
    for folder in sorted(p for p in RESULTS.glob("lag_sweep_demo*") if p.is_dir()):
        for csv_path in sorted(folder.glob("*-s*.csv")):
            r = replay(csv_path)
            fired = "never" if r["fired"] is None else str(r["fired"])
            print(
                f"| {r['run']} | {r['heldout']:.3f} | {fired} | {r['peak_step']}: {r['peak']:.2f} | "
                f"{r['end']:.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
