"""Summarize the zero-variance skip runs: learner time per step, tokens trained, reward, per arm and seed.

python experiments/skip_uniform/summarize.py RUNS_DIR   # RUNS_DIR/rl-{base,skip}-s{0,1,2}/metrics.jsonl
"""

import json
import statistics
import sys
from pathlib import Path


def run_stats(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    learner = [
        r.get("time_forward_s", 0) + r.get("time_backward_s", 0) + r.get("time_optimizer_s", 0) for r in rows
    ]
    rewards = [r["reward_mean"] for r in rows]
    summary = json.loads((run / "summary.json").read_text())
    return {
        "steps": len(rows),
        "learner_s_per_step": statistics.mean(learner),
        "learner_s_total": sum(learner),
        "tokens_trained": sum(r.get("learner_tokens", 0) for r in rows),
        "uniform_groups": sum(r.get("groups_uniform", 0) for r in rows),
        "groups": sum(len(r["group_indices"]) for r in rows),
        "reward_first3": statistics.mean(rewards[:3]),
        "reward_last3": statistics.mean(rewards[-3:]),
        "reward_mean_all": statistics.mean(rewards),
        "rl_wall_s": summary["rl_wall_s"],
        "rewards": [round(x, 3) for x in rewards],
    }


def main(root: Path) -> None:
    out = {}
    for arm in ("base", "skip"):
        for run in sorted(root.glob(f"rl-{arm}-s*")):
            if (run / "summary.json").exists():
                out[run.name] = run_stats(run)
    for name, s in out.items():
        print(
            f"{name}: learner {s['learner_s_per_step']:.2f} s/step ({s['learner_s_total']:.0f} s), tokens "
            f"trained {s['tokens_trained']:,}, uniform groups {s['uniform_groups']}/{s['groups']}, reward "
            f"{s['reward_first3']:.3f} -> {s['reward_last3']:.3f} (mean {s['reward_mean_all']:.3f}), RL wall "
            f"{s['rl_wall_s']:.0f} s"
        )
    (root / "skip_summary.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
