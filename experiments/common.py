"""Shared plumbing of the experiments: run `rz train` / evaluate a policy, reduce metrics, plot.

Every experiment writes its raw run directories under a scratch folder (``--runs``, default
``/tmp/rz-experiments``) and commits only reduced outputs (per-step CSVs of the figures it reports,
JSON summaries, PNG plots) under ``experiments/results/``. A run whose reduced output already exists
is not run again, so an interrupted sweep continues where it stopped.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Where reduced outputs go (tests point this at a temporary folder).
RESULTS = Path(os.environ.get("RZ_EXPERIMENT_RESULTS", REPO / "experiments" / "results"))
DEFAULT_RUNS = Path(os.environ.get("RZ_EXPERIMENT_RUNS", "/tmp/rz-experiments"))

# The per-step figures kept from metrics.jsonl (what the plots and tables use).
STEP_KEYS = (
    "step",
    "version",
    "engine_version",
    "reward_mean",
    "lag_min",
    "lag_max",
    "lag_mean",
    "rollout_admission_lag",
    "lag0_abs_dlogp_max",
    "is_weight_abs_dev_mean",
    "is_weight_max",
    "is_weight_min",
    "is_weight_ess_fraction",
    "is_weight_p99",
    "is_weight_frac_above_10",
    "estimator_clipfrac",
    "kl_k1_behavior_to_learner",
    "kl_k3_behavior_to_learner",
    "loss",
    "grad_norm",
    "step_skipped_nonfinite",
    "num_sampled_tokens",
    "time_step_s",
    "lr",
    "lr_scale",
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rz(*args: str, log_file: Path | None = None, env: dict[str, str] | None = None) -> None:
    """Run the `rz` CLI of this checkout (python -m rz_agents.cli) and raise if it fails."""
    cmd = [sys.executable, "-m", "rz_agents.cli", *args]
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "kernels"), full_env.get("PYTHONPATH", "")]
    )
    out = open(log_file, "w") if log_file else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
    finally:
        if log_file:
            out.close()
    if proc.returncode != 0:
        tail = log_file.read_text()[-3000:] if log_file and log_file.exists() else ""
        raise RuntimeError(f"failed ({proc.returncode}): {shlex.join(cmd)}\n{tail}")


def command_line() -> str:
    """How this script was invoked (printed beside every number it produces)."""
    return shlex.join(["python3", *sys.argv])


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl of a run (one dict per learner step)."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_step_csv(rows: Sequence[dict[str, Any]], path: Path, keys: Sequence[str] = STEP_KEYS) -> None:
    """The chosen per-step figures as CSV (empty cell where a step has no value)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for m in rows:
            w.writerow(["" if m.get(k) is None else _short(m.get(k)) for k in keys])


def read_step_csv(path: Path) -> list[dict[str, float]]:
    """Rows of a CSV written by ``write_step_csv`` (numbers as floats, empty cells as NaN)."""
    with open(path) as f:
        return [{k: float(v) if v != "" else math.nan for k, v in row.items()} for row in csv.DictReader(f)]


def _short(v: Any) -> Any:
    return float(f"{v:.6g}") if isinstance(v, float) and math.isfinite(v) else v


def mean_std(xs: Iterable[float]) -> tuple[float, float]:
    """Mean and (population) standard deviation of the finite values; NaN when there are none."""
    vals = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), statistics.pstdev(vals) if len(vals) > 1 else 0.0


def window_mean(rows: Sequence[dict[str, float]], key: str, first: bool, n: int) -> float:
    """Mean of ``key`` over the first or last ``n`` steps."""
    part = rows[:n] if first else rows[-n:]
    return mean_std(r.get(key, math.nan) for r in part)[0]


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def warm_start_checkpoint(
    runs: Path, config: str, overrides: Sequence[str] = (), name: str = "warm", quick: bool = False
) -> Path:
    """The warm-started policy every run of a sweep starts from (trained once, fp32, then reused).

    Starting all arms from one checkpoint makes them differ only in what the experiment varies.
    """
    run_dir = runs / name
    model = run_dir / "warm_start_model"
    if (model / "config.json").is_file():
        return model
    extra = ["warm_start.demos=64", "warm_start.epochs=1", "warm_start.prior_demos=32"] if quick else []
    log(f"warm start -> {run_dir}")
    run_dir.mkdir(parents=True, exist_ok=True)
    rz(
        "train",
        config,
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "steps=0",
        "report=false",
        "export_final_model=false",
        "tensorboard=false",
        *extra,
        *overrides,
        log_file=run_dir / "log.txt",
    )
    return model


def evaluate_policy(
    run_dir: Path,
    tasks_file: Path,
    out: Path,
    k: int,
    temperature: float,
    max_tokens: int,
    max_turns: int,
    num_threads: int = 1,
) -> dict[str, Any]:
    """Evaluate run_dir/final_model on a task file with the tool (compact prompt, the run's tokenizer and
    dtype; experiments/eval_policy.py); returns the results dict (avg_at_k = mean reward over k samples)."""
    cmd = [
        sys.executable,
        str(REPO / "experiments" / "eval_policy.py"),
        str(run_dir),
        "--tasks",
        str(tasks_file),
        "--k",
        str(k),
        "--temperature",
        str(temperature),
        "--max-tokens",
        str(max_tokens),
        "--max-turns",
        str(max_turns),
        "--num-threads",
        str(num_threads),
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "kernels")])}
    with open(out.with_suffix(".log"), "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(
            f"eval failed ({proc.returncode}): {shlex.join(cmd)}\n"
            f"{out.with_suffix('.log').read_text()[-3000:]}"
        )
    return json.loads(out.read_text())


def save_figure(fig, name: str) -> Path:
    """Save a matplotlib figure as docs/img/<name>.png."""
    path = REPO / "docs" / "img" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
