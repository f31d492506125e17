"""Pace vs drop on the governed async-wide arms (issue 43): one table from lag_sweep.py's results folder.

    python3 experiments/lag_sweep.py --task demo --seeds 0 1 --steps 60 --jobs 2 --runs /tmp/rz-pace/runs \
        --out experiments/results/pace_vs_drop_demo_wide rollout.groups_per_batch=4 \
        --arms async_wide_governor64_drop async_wide_governor64_pace
    python3 experiments/pace_vs_drop.py experiments/results/pace_vs_drop_demo_wide

Per run: held-out avg@4 of the final policy, learner steps per second of the RL loop, mean and max lag of
trained tokens, the governor's bound (min / mean), groups started / dropped stale, and the mean tokens of
the episodes that finished vs those the learner took (their ratio: below 1, training sees shorter episodes
than the rollouts produce). Writes pace_vs_drop.md beside the runs' files.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import read_step_csv  # noqa: E402

ARMS = ("async_wide_governor64_drop", "async_wide_governor64_pace")


def run_row(folder: Path, arm: str, seed: int) -> dict | None:
    """The figures of one (arm, seed), or None when it has not run."""
    summary = folder / f"{arm}-s{seed}.json"
    if not summary.exists():
        return None
    s = json.loads(summary.read_text())
    steps = read_step_csv(folder / f"{arm}-s{seed}.csv")
    lengths, rollout = s.get("episode_lengths") or {}, s.get("rollout") or {}
    bounds = [r["rollout_admission_lag"] for r in steps if math.isfinite(r["rollout_admission_lag"])]
    return {
        "arm": arm.rsplit("_", 1)[1],
        "seed": seed,
        "heldout": s["heldout_accuracy"],
        "steps_per_s": s.get("steps_per_s") or len(steps) / s["wall_s"],
        "lag_mean": statistics.fmean(r["lag_mean"] for r in steps),
        "lag_max": max(r["lag_max"] for r in steps),
        "bound": f"{min(bounds)} / {statistics.fmean(bounds):.1f}" if bounds else "-",
        "started": rollout.get("groups_started"),
        "dropped_stale": rollout.get("groups_dropped_stale"),
        "tokens_finished": lengths.get("episode_tokens_mean_finished"),
        "tokens_trained": lengths.get("episode_tokens_mean_trained"),
        "ratio": lengths.get("episode_tokens_trained_over_finished"),
        "reward_last10": statistics.fmean(r["reward_mean"] for r in steps[-10:]),
    }


def table(rows: list[dict]) -> str:
    """The runs as a markdown table."""
    head = (
        "| arm | seed | held-out avg@4 | steps/s | mean lag | max lag | bound min / mean | groups started | "
        "dropped stale | mean tokens finished | mean tokens trained | trained / finished | reward last 10 |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['seed']} | {r['heldout']:.3f} | {r['steps_per_s']:.3f} | {r['lag_mean']:.1f} "
            f"| {r['lag_max']:.0f} | {r['bound']} | {r['started']} | {r['dropped_stale']} | "
            f"{r['tokens_finished']:.1f} | {r['tokens_trained']:.1f} | {r['ratio']:.3f} | "
            f"{r['reward_last10']:.3f} |"
        )
    return "\n".join(lines)


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "experiments/results/pace_vs_drop_demo_wide")
    rows = [r for arm in ARMS for seed in range(4) if (r := run_row(folder, arm, seed)) is not None]
    if not rows:
        print(f"no runs in {folder}", file=sys.stderr)
        return 1
    text = table(rows)
    (folder / "pace_vs_drop.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
