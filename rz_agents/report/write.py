"""Turn a run directory's metrics.jsonl (one JSON object per learner step) into plots and HTML.

Each panel plots the metrics it names that the run actually logged; panels with none are left
out, so the report works for every estimator and mode.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import yaml

from rz_agents.eval.in_loop import EVERY_PREFIX, START_PREFIX
from rz_agents.report.inspector import write_inspector
from rz_agents.report.tables import fmt_number, value_html
from rz_agents.trainer.metrics import staleness_histogram

_LAG_BUCKETS = [(0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 127), (128, 255)]

PANELS: list[tuple[str, str, list[str]]] = [
    ("reward", "Reward (mean over the step's episodes)", ["reward_mean"]),
    (
        "eval",
        "Held-out evaluation during training (eval.every): avg@k, pass@k, mean reward",
        ["eval/avg_at_k", "eval/pass_at_k", "eval/mean_reward"],
    ),
    ("lag", "Policy lag of trained tokens (learner steps)", ["lag_min", "lag_mean", "lag_max"]),
    (
        "is_weight",
        "Importance weights exp(logp_learner - logp_behavior)",
        ["is_weight_mean", "is_weight_p50", "is_weight_p99", "is_weight_max"],
    ),
    (
        "dlogp",
        "|dlogp| on lag-0 tokens (0 exactly when aligned)",
        ["lag0_abs_dlogp_max", "lag0_abs_dlogp_mean"],
    ),
    ("kl", "KL estimates behavior -> learner", ["kl_k1_behavior_to_learner", "kl_k3_behavior_to_learner"]),
    (
        "deviation",
        "IS-weight deviation (per step, and run peak/median)",
        ["is_weight_abs_dev_mean", "is_weight_abs_dev_run_peak_over_median"],
    ),
    (
        "health",
        "Health: ESS/n, KL k3 (10-step medians; alarm at KL > 0.5 or ESS/n < 0.3), IS tail, estimator "
        "clipfrac",
        [
            "is_weight_ess_fraction",
            "health_ess_fraction_median",
            "health_kl_k3_median",
            "is_weight_frac_above_10",
            "estimator_clipfrac",
        ],
    ),
    (
        "ess_by_lag",
        "ESS/n of the IS weights per lag bucket",
        [f"is_weight_ess_fraction_lag_{lo}_{hi}" for lo, hi in _LAG_BUCKETS],
    ),
    (
        "staleness",
        "Staleness: mean lag per token, and of each trajectory's oldest token (per trajectory, "
        "token-weighted)",
        ["lag_mean", "lag_oldest_mean", "lag_oldest_token_mean", "lag_oldest_max"],
    ),
    ("admission", "Lag governor: admission bound", ["rollout_admission_lag"]),
    ("throughput", "Trained tokens per second", ["trained_tokens_per_s", "learner_tokens_per_s"]),
]


def read_metrics(path: Path) -> list[dict]:
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a partly written last line of a killed run
    return rows


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, r in enumerate(rows):
        v = r.get(key)
        if isinstance(v, (int, float)) and v == v:
            xs.append(float(r.get("step", i)))
            ys.append(float(v))
    return xs, ys


def with_start_eval(rows: list[dict]) -> list[dict]:
    """``rows`` with the evaluation before step 0 (eval.at_start, logged in step 0's row as
    eval_at_start/*) in front as a row of step -1 ("after step -1"), so the eval panel's curve starts
    there; the rows themselves unchanged."""
    first = rows[0] if rows else {}
    start = {EVERY_PREFIX + k[len(START_PREFIX) :]: v for k, v in first.items() if k.startswith(START_PREFIX)}
    return [{"step": -1, **start}, *rows] if start else rows


def _plot_panel(
    rows: list[dict], title: str, keys: list[str], out: Path, xlabel: str = "learner step"
) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [k for k in keys if _series(rows, k)[0]]
    if not present:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
    for k in present:
        xs, ys = _series(rows, k)
        ax.plot(xs, ys, label=k, linewidth=1.4, marker="o" if len(xs) < 25 else None, markersize=3)
    ax.set_title(title, fontsize=10 if len(title) <= 80 else 8.5)  # a long one (eval's, with its k) fits
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return True


def _plot_time_split(rows: list[dict], out: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for r in rows for k in r if k.startswith("time_") and k.endswith("_s")})
    if not keys:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
    bottom = [0.0] * len(rows)
    xs = [float(r.get("step", i)) for i, r in enumerate(rows)]
    for k in keys:
        ys = [float(r.get(k, 0.0) or 0.0) for r in rows]
        ax.bar(xs, ys, bottom=bottom, label=k[5:-2], width=0.9)
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    ax.set_title("Step time split (s)", fontsize=10)
    ax.set_xlabel("learner step")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return True


def _plot_staleness_hist(rows: list[dict], out: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = staleness_histogram(rows)
    names = list(hist["token"])
    if not names:
        return False
    n_traj = sum(hist["oldest_traj"].values()) or 1.0
    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
    xs = range(len(names))
    ax.bar([x - 0.27 for x in xs], list(hist["token"].values()), width=0.27, label="tokens (by own lag)")
    ax.bar(xs, list(hist["oldest_token"].values()), width=0.27, label="tokens (by trajectory's oldest lag)")
    ax.bar(
        [x + 0.27 for x in xs],
        [v / n_traj for v in hist["oldest_traj"].values()],
        width=0.27,
        label="trajectories (by oldest lag)",
    )
    ax.set_xticks(list(xs), names)
    ax.set_xlabel("lag (learner steps)")
    ax.set_ylabel("share of the run")
    ax.set_title("Staleness histogram over the run (trained batches)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return True


# what each panel looks like on a healthy run (one sentence each, shown under its plot)
HEALTHY: dict[str, str] = {
    "reward": "Healthy: the reward rises (noisily) over the steps; flat at 0 or at 1 leaves nothing to "
    "learn from.",
    "eval": "Healthy: the held-out avg@k rises with the training reward; a training reward rising alone is "
    "memorization.",
    "lag": "Healthy: lag_max stays at or under the run's max_lag bound (it is enforced), and lag_mean low.",
    "is_weight": "Healthy: the mean stays near 1 and p99 within a few units; a max in the hundreds is a "
    "policy far from the one that sampled.",
    "dlogp": "Healthy (aligned kernels): exactly 0 at every step: engine and trainer compute the same "
    "log-probs bit for bit.",
    "kl": "Healthy: near 0 (well under 0.1); a climbing KL means the samples are going stale.",
    "deviation": "Healthy: a flat line; spikes mark steps whose weights strayed from the rest.",
    "health": "Healthy: ESS/n near 1 (over 0.3) and KL k3 small (under 0.5); the alarm fires past either.",
    "ess_by_lag": "Healthy: ESS/n high at every lag; a drop at high lags says max_lag is too loose.",
    "staleness": "Healthy: low and steady; a rising oldest-token lag means the rollouts fall behind.",
    "admission": "Healthy: steady; the governor lowers the bound when staleness hurts.",
    "throughput": "Healthy: steady after the first steps; a fall is contention or longer episodes.",
}


def _launches_html(rows: list[dict]) -> str:
    """One row per `rz train` launch of the run (a stopped run resumed is one run)."""
    head = (
        "<tr><th>launch</th><th>started</th><th>steps</th><th>wall (s)</th><th>RL (s)</th>"
        "<th>warm start (s)</th><th>stopped by</th></tr>"
    )
    body = "".join(
        f"<tr><td>{i + 1}</td><td>{html.escape(str(r.get('started') or '—'))}</td>"
        f"<td>{r['steps'][0]} → {r['steps'][1]}</td><td>{fmt_number(r.get('wall_s'))}</td>"
        f"<td>{fmt_number(r.get('rl_wall_s'))}</td><td>{fmt_number(r.get('warm_start_s'))}</td>"
        f"<td>{html.escape(str(r.get('stopped_by') or '—'))}</td></tr>"
        for i, r in enumerate(rows)
    )
    return f"<h2>Launches</h2><table>{head}{body}</table>"


def summary_k(run: Path) -> int | None:
    """The k of the run's in-loop evaluation (its config.yaml's eval.k), for the eval panel's title."""
    try:
        doc = yaml.safe_load((run / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    section = doc.get("eval") if isinstance(doc, dict) else None
    k = section.get("k") if isinstance(section, dict) else None
    return k if isinstance(k, int) else None


def write_report(run_dir: str | Path, summary: dict | None = None) -> Path:
    """Write <run_dir>/plots/*.png, <run_dir>/report.html and, when steps were recorded for it,
    <run_dir>/inspector.html; return the report's path."""
    run = Path(run_dir)
    rows = read_metrics(run / "metrics.jsonl")
    plots = run / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    images = []
    eval_k = summary_k(run)
    for name, title, keys in PANELS:
        out = plots / f"{name}.png"
        panel_rows, xlabel, healthy = rows, "learner step", HEALTHY.get(name, "")
        if name == "eval":
            if eval_k is not None:
                title = f"{title} (k={eval_k})"
            panel_rows = with_start_eval(rows)
            if panel_rows is not rows:
                xlabel = "learner step (-1: before training, eval.at_start)"
                healthy += " The point at step -1: before training (eval.at_start), the untrained policy."
        if _plot_panel(panel_rows, title, keys, out, xlabel):
            images.append((title, out, healthy))
    if _plot_staleness_hist(rows, plots / "staleness_hist.png"):
        images.append(("Staleness histogram over the run", plots / "staleness_hist.png", ""))
    if _plot_time_split(rows, plots / "time_split.png"):
        images.append(("Step time split", plots / "time_split.png", ""))
    if summary is None and (run / "summary.json").is_file():
        summary = json.loads((run / "summary.json").read_text())
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>rz_agents run report</title>",
        "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;"
        "vertical-align:top}"
        "img{max-width:100%;margin:0.5em 0}</style></head><body>",
        f"<h1>Run report: {html.escape(run.name)}</h1>",
        f"<p>{len(rows)} learner steps logged in metrics.jsonl.</p>",
    ]
    inspector = write_inspector(run)
    if inspector is not None:
        parts.append(f"<p>Token by token: <a href='{inspector.name}'>trajectory inspector</a>.</p>")
    health = (summary or {}).get("health") or {}
    if health.get("status") == "alarm":
        a = health["alarm"]
        parts.append(
            f"<p style='color:#b00;font-weight:bold'>Health alarm from step {a['step']}: "
            f"{html.escape(a['reason'])}. {html.escape(health['advice'])}</p>"
        )
    parts.append("<h2>Plots</h2>")
    for title, path, healthy in images:
        data = base64.b64encode(path.read_bytes()).decode()
        parts.append(
            f"<h3>{html.escape(title)}</h3><img alt='{html.escape(title)}' "
            f"src='data:image/png;base64,{data}'>"
            + (f"<p><i>{html.escape(healthy)}</i></p>" if healthy else "")
        )
    if not images:
        parts.append("<p>No metrics to plot yet.</p>")
    launches = (summary or {}).get("launches") or []
    if len(launches) > 1:
        parts.append(_launches_html(launches))
    if summary:  # every figure, folded: the plots above are what a reader looks at first
        parts.append(
            "<details><summary><b>Summary</b> (summary.json)</summary>" + value_html(summary) + "</details>"
        )
    parts.append("</body></html>")
    out = run / "report.html"
    out.write_text("\n".join(parts))
    return out
