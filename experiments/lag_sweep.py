"""Fixed-lag sweep: synchronous vs REINFORCE Zero (aligned, unclipped IS) at lag 2 / 8 / 64 / 128 vs the
standard-kernel estimators at lag 64, several seeds each, bf16.

Every arm starts from the same warm-started policy (trained once in fp32, then loaded in bf16) and
differs only in what the published comparison varies: the op set (aligned or standard), the estimator,
and the policy lag, fixed with ``rollout.fixed_lag`` so every trained token comes from weights exactly
k versions old (independent of this machine's speed; the first k steps use version 0). After training,
each final policy is evaluated on held-out tasks (k samples each at the training temperature).

    python3 experiments/lag_sweep.py --quick                      # CI: a few steps, writes its files
    python3 experiments/lag_sweep.py --task demo --seeds 0 1 2    # the documented run (hours)

The lag-tolerant estimators (m2po_lag64, dppo_lag64, snis_lag64, icepop_lag64, dual_clip_lag64: aligned op
set, fixed lag 64) are arms like the others; their results live in their own folder (``--out``).

Outputs (experiments/results/lag_sweep_<task>/): <arm>-s<seed>.csv (per-step figures),
<arm>-s<seed>.json (run summary + held-out eval), summary.json / summary.md (per arm: mean and spread
over seeds), and docs/img/<results folder name>_curves.png / _heldout.png. ``--summarize-only`` rebuilds
the summaries and figures from a results folder's files without training.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DEFAULT_RUNS,
    RESULTS,
    command_line,
    evaluate_policy,
    log,
    mean_std,
    read_metrics,
    read_step_csv,
    rz,
    save_figure,
    warm_start_checkpoint,
    window_mean,
    write_json,
    write_step_csv,
)

# 512 episodes in flight (against the demo's 64, and 80 engine slots): see the async_wide_* arms
WIDE = ["rollout.max_concurrent_episodes=512", "engine.max_running=512"]

# arm -> overrides of the run config. "std" arms run engine and learner on the standard (stock PyTorch)
# op set, whose bf16 log-probs differ between the batched engine and the packed trainer.
ARMS: dict[str, list[str]] = {
    "sync": ["mode=sync"],
    "rz_lag2": ["rollout.fixed_lag=2"],
    "rz_lag8": ["rollout.fixed_lag=8"],
    "rz_lag64": ["rollout.fixed_lag=64"],
    "rz_lag128": ["rollout.fixed_lag=128", "rollout.max_lag=128"],
    "std_is_lag64": ["rollout.fixed_lag=64", "model.kernels=standard"],
    "std_seq_gate_lag64": [
        "rollout.fixed_lag=64",
        "model.kernels=standard",
        "learner.loss.estimator=sequence_gate",
    ],
    "std_token_gate_lag64": [
        "rollout.fixed_lag=64",
        "model.kernels=standard",
        "learner.loss.estimator=token_gate",
    ],
    "std_tis_lag64": [
        "rollout.fixed_lag=64",
        "model.kernels=standard",
        "learner.loss.estimator=truncated_is",
    ],
    "std_ppo_clip_lag64": [
        "rollout.fixed_lag=64",
        "model.kernels=standard",
        "learner.loss.estimator=ppo_clip",
    ],
    # The lag-tolerant estimators (issue 25), on the aligned op set like rz_lag64.
    "m2po_lag64": ["rollout.fixed_lag=64", "learner.loss.estimator=m2po"],
    "dppo_lag64": ["rollout.fixed_lag=64", "learner.loss.estimator=decoupled_ppo"],
    "snis_lag64": ["rollout.fixed_lag=64", "learner.loss.estimator=snis"],
    "icepop_lag64": ["rollout.fixed_lag=64", "learner.loss.estimator=icepop"],
    "dual_clip_lag64": ["rollout.fixed_lag=64", "learner.loss.estimator=dual_clip"],
    # PPO-clip on the aligned op set with a wider clip (std_ppo_clip_lag64 above: standard op set, eps 0.2)
    "ppo_clip_eps03_lag64": [
        "rollout.fixed_lag=64",
        "learner.loss.estimator=ppo_clip",
        "learner.loss.ppo_clip_eps=0.3",
    ],
    "ppo_clip_eps01_lag64": [
        "rollout.fixed_lag=64",
        "learner.loss.estimator=ppo_clip",
        "learner.loss.ppo_clip_eps=0.1",
    ],
    # PPO-clip on the aligned op set, eps 0.2 (the op set alone against std_ppo_clip_lag64)
    "ppo_clip_lag64": ["rollout.fixed_lag=64", "learner.loss.estimator=ppo_clip"],
    # The restoring term beta * (log w)^2 / 2 (learner.loss.behavior_kl_coef) on PPO-clip and on unclipped IS
    "ppo_clip_kl1_lag64": [
        "rollout.fixed_lag=64",
        "learner.loss.estimator=ppo_clip",
        "learner.loss.behavior_kl_coef=1.0",
    ],
    "rz_kl1_lag64": ["rollout.fixed_lag=64", "learner.loss.behavior_kl_coef=1.0"],
    "ppo_clip_kl01_lag64": [
        "rollout.fixed_lag=64",
        "learner.loss.estimator=ppo_clip",
        "learner.loss.behavior_kl_coef=0.1",
    ],
    "rz_kl01_lag64": ["rollout.fixed_lag=64", "learner.loss.behavior_kl_coef=0.1"],
    # The KL-steered learning rate (learner.lr_control.kl_target, trainer/lr_control.py) on the recipe's own
    # unclipped IS and on PPO-clip: the step size follows the measured behavior -> learner KL k3
    "rz_klctl_lag64": ["rollout.fixed_lag=64", "learner.lr_control.kl_target=0.1"],
    "ppo_clip_klctl_lag64": [
        "rollout.fixed_lag=64",
        "learner.loss.estimator=ppo_clip",
        "learner.lr_control.kl_target=0.1",
    ],
    # lr * lag capped at 1.6e-3 (learner.lr_control.lr_lag_budget): at the demo lr untouched up to lag 8, at
    # lag 64 the demo lr / 8 (the rate at which lag 64 was stable). Seeds 0-2 of rz_lagscaled_lag64 ran with
    # this rule's first form, the rate scaled by min(1, 8 / lag) (the same scale up to the rounding of 2e-4).
    "rz_lagscaled_lag64": ["rollout.fixed_lag=64", "learner.lr_control.lr_lag_budget=1.6e-3"],
    "rz_lagbudget2x_lag64": ["rollout.fixed_lag=64", "learner.lr_control.lr_lag_budget=3.2e-3"],  # twice B
    "rz_lagscaled_lag128": [
        "rollout.fixed_lag=128",
        "rollout.max_lag=128",
        "learner.lr_control.lr_lag_budget=1.6e-3",
    ],
    "ppo_clip_lagscaled_lag64": [
        "rollout.fixed_lag=64",
        "learner.loss.estimator=ppo_clip",
        "learner.lr_control.lr_lag_budget=1.6e-3",
    ],
    "dppo_klctl_lag64": [
        "rollout.fixed_lag=64",
        "learner.loss.estimator=decoupled_ppo",
        "learner.lr_control.kl_target=0.1",
    ],
    # The lag governor (issue 25) on real async runs, not fixed lag: the rollouts may run as far ahead of
    # the learner as the bound allows (max_ahead_batches unset), so the lag is what this machine's speed
    # makes it; throughput (learner steps per wall second) and the trained tokens' lag are measured.
    "async_bound64": ["rollout.max_lag=64", "rollout.max_ahead_batches=null"],
    "async_governor64": ["rollout.max_lag=64", "rollout.max_ahead_batches=null", "rollout.lag_governor=true"],
    "async_bound8": ["rollout.max_lag=8", "rollout.max_ahead_batches=null"],
    "async_ahead2": ["rollout.max_lag=64", "rollout.max_ahead_batches=2"],  # the demo's own setting
    # The same four with 512 episodes in flight (engine.max_running and rollout.max_concurrent_episodes 512,
    # against 80 / 64): the engine's batched decode then outruns the learner, so the queue of finished groups
    # grows and the real lag reaches tens of versions, as with many rollout replicas per learner.
    "async_wide_bound64": ["rollout.max_lag=64", "rollout.max_ahead_batches=null", *WIDE],
    "async_wide_governor64": [
        "rollout.max_lag=64",
        "rollout.max_ahead_batches=null",
        "rollout.lag_governor=true",
        *WIDE,
    ],
    # The governed arm with each treatment of a finished group older than the governor's bound (issue 43):
    # drop it (the governor runs above) or train it within max_lag, pacing admission and the learner.
    "async_wide_governor64_drop": [
        "rollout.max_lag=64",
        "rollout.max_ahead_batches=null",
        "rollout.lag_governor=true",
        "rollout.stale_groups=drop",
        *WIDE,
    ],
    "async_wide_governor64_pace": [
        "rollout.max_lag=64",
        "rollout.max_ahead_batches=null",
        "rollout.lag_governor=true",
        "rollout.stale_groups=pace",
        *WIDE,
    ],
    "async_wide_bound8": ["rollout.max_lag=8", "rollout.max_ahead_batches=null", *WIDE],
    "async_wide_ahead2": ["rollout.max_lag=64", "rollout.max_ahead_batches=2", *WIDE],
}

# task -> (run config, its overrides, held-out tasks: (generator difficulty, count, seed), eval budget)
TASKS: dict[str, dict[str, Any]] = {
    # The CPU demo: tiny Qwen3 (byte vocabulary) + sandboxed Python tool, one-step arithmetic.
    "demo": {
        "config": "configs/demo.yaml",
        "overrides": [],
        "warm_start": [],
        "difficulty": 1,
        "max_tokens": 96,
        "max_turns": 3,
    },
    # Harder: the same policy, trained and evaluated on three-operand arithmetic (a*b+c), where copying
    # the expression into the call and the result into the answer is longer and rarer. Its warm start
    # shows that format (the demo's, shown only a+b, never calls the tool on a*b+c: reward 0, nothing
    # to learn from).
    "demo_d2": {
        "config": "configs/demo.yaml",
        "overrides": ["env.kwargs.difficulty=2"],
        "warm_start": ["warm_start.difficulty=2"],
        "difficulty": 2,
        "max_tokens": 96,
        "max_turns": 3,
    },
}

HELDOUT_SEED = 424_242


def heldout_file(task: str, n: int) -> Path:
    """Held-out tasks (a seed the training stream never uses) as JSONL."""
    from rz_agents.data.synthetic import generate_arithmetic_tasks

    spec = TASKS[task]
    path = RESULTS / f"heldout_arith_d{spec['difficulty']}_{n}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tasks = generate_arithmetic_tasks(n, seed=HELDOUT_SEED, difficulty=spec["difficulty"])
        path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def run_arm(args, task: str, arm: str, seed: int, warm: Path, out_dir: Path, tasks_file: Path) -> None:
    """Train one (arm, seed), reduce its metrics, evaluate its final policy. Skips if already done."""
    name = f"{arm}-s{seed}"
    summary_path = out_dir / f"{name}.json"
    if summary_path.exists():
        return
    spec = TASKS[task]
    run_dir = args.runs / f"lag_sweep_{task}" / name
    shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished attempt (interrupted sweep) starts over
    run_dir.mkdir(parents=True)
    overrides = [
        f"model.checkpoint={warm}",
        f"model.dtype={args.dtype}",
        "warm_start.demos=0",
        f"steps={args.steps}",
        f"seed={seed}",
        "report=false",
        "tensorboard=false",
        *spec["overrides"],
        *ARMS[arm],
        *args.extra,
    ]
    log(f"train {task}/{name}")
    if any(o.startswith("rollout.fixed_lag=") for o in overrides):
        overrides.append("rollout.max_ahead_batches=null")  # fixed lag generates one batch at a time
    rz(
        "train",
        spec["config"],
        "--run-dir",
        str(run_dir),
        "--no-progress",
        *overrides,
        log_file=run_dir / "log.txt",
    )
    rows = read_metrics(run_dir)
    write_step_csv(rows, out_dir / f"{name}.csv")
    log(f"eval  {task}/{name}")
    ev = evaluate_policy(
        run_dir,
        tasks_file,
        run_dir / "eval.json",
        k=args.eval_k,
        temperature=1.0,
        max_tokens=spec["max_tokens"],
        max_turns=spec["max_turns"],
    )
    run_summary = json.loads((run_dir / "summary.json").read_text())
    write_json(
        summary_path,
        {
            "task": task,
            "arm": arm,
            "seed": seed,
            "overrides": overrides,
            "heldout_accuracy": ev["avg_at_k"],
            "heldout_no_answer_rate": ev["no_answer_rate"],
            "heldout_mean_tool_turns": ev["mean_tool_turns"],
            "heldout_tasks": str(tasks_file.name),
            "eval_k": args.eval_k,
            "reward_start": run_summary["reward_start"],
            "reward_end": run_summary["reward_end"],
            "skipped_steps": run_summary["skipped_steps"],
            "max_lag_seen": run_summary["max_lag_seen"],
            "wall_s": run_summary["wall_s"],
            "steps_per_s": run_summary.get("steps_per_s"),  # of the RL loop (rl_wall_s)
            "rollout": run_summary.get("rollout"),
            # mean tokens of finished vs trained episodes (issue 43: does dropping stale groups lose long
            # ones?)
            "episode_lengths": run_summary.get("episode_lengths"),
        },
    )


def run_figures(rows: list[dict[str, float]], window: int) -> dict[str, float]:
    """Per-run figures from its per-step CSV."""
    dev = [
        r["is_weight_abs_dev_mean"] for r in rows if math.isfinite(r.get("is_weight_abs_dev_mean", math.nan))
    ]
    dev_sorted = sorted(dev)
    median = dev_sorted[len(dev_sorted) // 2] if dev_sorted else math.nan
    peak = max(dev) if dev else math.nan
    k3_first = window_mean(rows, "kl_k3_behavior_to_learner", True, window)
    k3_last = window_mean(rows, "kl_k3_behavior_to_learner", False, window)
    return {
        "train_reward_first": window_mean(rows, "reward_mean", True, window),
        "train_reward_last": window_mean(rows, "reward_mean", False, window),
        "is_dev_peak_over_median": peak / median if median and median > 0 else math.nan,
        "is_weight_max": max((r.get("is_weight_max", math.nan) for r in rows), default=math.nan),
        "kl_k3_last_over_first": k3_last / k3_first if k3_first and k3_first > 0 else math.nan,
        "kl_k3_last": k3_last,
        "skipped_nonfinite": sum(r.get("step_skipped_nonfinite", 0) or 0 for r in rows),
        # share of sampled tokens the estimator clipped / gated / masked, over the run (NaN before issue 25)
        "clipfrac_mean": mean_std(r.get("estimator_clipfrac", math.nan) for r in rows)[0],
        "lag_mean": mean_std(r.get("lag_mean", math.nan) for r in rows)[0],
        "admission_bound_min": min(
            (
                r["rollout_admission_lag"]
                for r in rows
                if math.isfinite(r.get("rollout_admission_lag", math.nan))
            ),
            default=math.nan,
        ),
    }


def summarize(task: str, out_dir: Path, window: int) -> dict[str, Any]:
    """Per arm: mean and spread over seeds of the held-out accuracy and the run figures."""
    per_arm: dict[str, Any] = {}
    for arm in ARMS:
        runs = sorted(out_dir.glob(f"{arm}-s*.json"))
        if not runs:
            continue
        summaries = [json.loads(p.read_text()) for p in runs]
        step_rows = [read_step_csv(p.with_suffix(".csv")) for p in runs]
        figs = [run_figures(rows, window) for rows in step_rows]
        entry: dict[str, Any] = {"seeds": [s["seed"] for s in summaries]}
        for key in ("heldout_accuracy", "heldout_no_answer_rate"):
            vals = [s[key] for s in summaries]
            entry[key] = dict(zip(("mean", "std"), mean_std(vals), strict=True)) | {"per_seed": vals}
        # throughput: learner steps per wall second of the whole run (warm-up and start-up included)
        vals = [len(rows) / s["wall_s"] for rows, s in zip(step_rows, summaries, strict=True)]
        entry["steps_per_s"] = dict(zip(("mean", "std"), mean_std(vals), strict=True)) | {"per_seed": vals}
        for key in figs[0]:
            vals = [f[key] for f in figs]
            entry[key] = dict(zip(("mean", "std"), mean_std(vals), strict=True)) | {"per_seed": vals}
        per_arm[arm] = entry
    return per_arm


def markdown_table(per_arm: dict[str, Any]) -> str:
    def fmt(d, spec=".3f"):
        m, s = d["mean"], d["std"]
        return "n/a" if not math.isfinite(m) else f"{m:{spec}} ± {s:{spec}}"

    lines = [
        "| arm | seeds | held-out reward (per seed) | no answer | train reward first → last window | "
        "IS dev peak/median | KL k3 last window | KL k3 last/first | max IS weight | skipped steps | "
        "clipfrac | mean lag | steps/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, e in per_arm.items():
        per_seed = " / ".join(f"{v:.3f}" for v in e["heldout_accuracy"]["per_seed"])
        lines.append(
            f"| {arm} | {len(e['seeds'])} | {fmt(e['heldout_accuracy'])} ({per_seed}) | "
            f"{fmt(e['heldout_no_answer_rate'], '.2f')} | "
            f"{fmt(e['train_reward_first'])} → {fmt(e['train_reward_last'])} | "
            f"{fmt(e['is_dev_peak_over_median'], '.2f')} | {fmt(e['kl_k3_last'], '.3g')} | "
            f"{fmt(e['kl_k3_last_over_first'], '.2f')} | "
            f"{fmt(e['is_weight_max'], '.3g')} | {fmt(e['skipped_nonfinite'], '.1f')} | "
            f"{fmt(e['clipfrac_mean'], '.3f') if 'clipfrac_mean' in e else 'n/a'} | "
            f"{fmt(e['lag_mean'], '.1f') if 'lag_mean' in e else 'n/a'} | "
            f"{fmt(e['steps_per_s'], '.3f') if 'steps_per_s' in e else 'n/a'} |"
        )
    return "\n".join(lines)


def plot(task: str, out_dir: Path, name: str, smooth: int, per_arm: dict[str, Any]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    panels = [
        ("reward_mean", "training reward (behavior samples)"),
        ("is_weight_abs_dev_mean", "IS-weight deviation mean |w-1|"),
        ("kl_k3_behavior_to_learner", "KL k3 (behavior -> learner)"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, arm in enumerate(ARMS):
        runs = sorted(out_dir.glob(f"{arm}-s*.csv"))
        if not runs:
            continue
        data = [read_step_csv(p) for p in runs]
        n = min(len(d) for d in data)
        for ax, (key, title) in zip(axes, panels, strict=True):
            series = [[d[j].get(key, math.nan) for j in range(n)] for d in data]
            mean = [mean_std(col)[0] for col in zip(*series, strict=True)]
            if smooth > 1:
                mean = [mean_std(mean[max(0, j - smooth + 1) : j + 1])[0] for j in range(n)]
            ax.plot(range(n), mean, label=arm, color=colors[i % len(colors)], lw=1.3)
            ax.set_title(title)
            ax.set_xlabel("learner step")
            if key != "reward_mean":
                ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{name}: task {task} (mean over seeds, {smooth}-step moving average)")
    paths.append(save_figure(fig, f"{name}_curves"))
    plt.close(fig)

    # The final policies on held-out tasks: mean over seeds (bar) and every seed (dots).
    fig, ax = plt.subplots(figsize=(1.0 + 0.75 * len(per_arm), 4.0))
    for x, (arm, e) in enumerate(per_arm.items()):
        acc = e["heldout_accuracy"]
        ax.bar(x, acc["mean"], color=colors[list(ARMS).index(arm) % len(colors)], alpha=0.6)
        ax.plot([x] * len(acc["per_seed"]), acc["per_seed"], "k.", ms=7)
    ax.set_xticks(range(len(per_arm)), list(per_arm), rotation=35, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out reward of the final policy")
    ax.set_title(f"{name}: held-out reward (bar: mean; dots: seeds)")
    paths.append(save_figure(fig, f"{name}_heldout"))
    plt.close(fig)
    return paths


def train_and_evaluate(args, out_dir: Path) -> list[str]:
    """Train and evaluate every (arm, seed) not already in out_dir, args.jobs at a time; the errors."""
    spec = TASKS[args.task]
    # One warm start per run config and warm-start difficulty, shared by every arm and seed.
    warm_name = f"warm_{Path(spec['config']).stem}"
    warm_name += f"_d{spec['difficulty']}" if spec["warm_start"] else ""
    warm_name += "_quick" if args.quick else ""
    warm = warm_start_checkpoint(
        args.runs, spec["config"], overrides=spec["warm_start"], name=warm_name, quick=args.quick
    )
    tasks_file = heldout_file(args.task, args.eval_tasks)
    jobs = [(arm, seed) for seed in args.seeds for arm in args.arms]
    errors = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_arm, args, args.task, a, s, warm, out_dir, tasks_file) for a, s in jobs]
        for f in futures:
            try:
                f.result()
            except Exception as e:  # one failed run does not stop the sweep; it is reported at the end
                errors.append(str(e))
                log(f"run failed: {e}")
    return errors


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=tuple(TASKS), default="demo")
    p.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--eval-tasks", type=int, default=128)
    p.add_argument("--eval-k", type=int, default=4)
    p.add_argument("--jobs", type=int, default=2, help="runs at once (each uses 1 thread)")
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="scratch folder for run directories")
    p.add_argument("--out", type=Path, default=None, help="results folder (default experiments/results/...)")
    p.add_argument("--window", type=int, default=10, help="steps in the first/last windows")
    p.add_argument("--quick", action="store_true", help="CI: 2 arms, 1 seed, 3 steps, tiny warm start")
    p.add_argument(
        "--summarize-only",
        action="store_true",
        help="rebuild summary.json / summary.md and the figures from the results folder; train nothing",
    )
    p.add_argument("extra", nargs="*", help="more key=value overrides for every run")
    args = p.parse_args()
    name = f"lag_sweep_{args.task}"
    if args.quick:
        args.arms, args.seeds, args.steps = ["sync", "std_is_lag64"], [0], 3
        args.eval_tasks, args.eval_k, args.window = 4, 1, 2
        args.extra = [*args.extra, "rollout.groups_per_batch=2", "rollout.group_size=2"]
        name += "_quick"
    out_dir = args.out or RESULTS / name
    out_dir.mkdir(parents=True, exist_ok=True)
    errors = [] if args.summarize_only else train_and_evaluate(args, out_dir)
    per_arm = summarize(args.task, out_dir, args.window)
    if not per_arm:
        print(f"no runs in {out_dir}", file=sys.stderr)
        return 1
    table = markdown_table(per_arm)
    old = json.loads((out_dir / "summary.json").read_text()) if (out_dir / "summary.json").exists() else {}
    # Every command that trained runs into this folder, in order (a sweep may be extended seed by seed;
    # older files hold a single "command").
    commands = list(old.get("commands", [old["command"]] if "command" in old else []))
    if not args.summarize_only and command_line() not in commands:
        commands.append(command_line())
    steps = old.get("steps", args.steps) if args.summarize_only else args.steps  # the trained runs' count
    write_json(out_dir / "summary.json", {"commands": commands, "steps": steps, "arms": per_arm})
    shown = "\n".join(f"    {c}" for c in commands)
    (out_dir / "summary.md").write_text(f"Commands:\n\n{shown}\n\n{table}\n")
    if not args.quick:
        plot(args.task, out_dir, out_dir.name if args.out else name, smooth=5, per_arm=per_arm)
    print(table)
    if errors:
        print(f"{len(errors)} run(s) failed; first: {errors[0][:2000]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
