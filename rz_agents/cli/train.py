"""`rz train CONFIG [key=value ...]`: warm start (optional), then async REINFORCE Zero, with a report."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rz_agents.cli import resume
from rz_agents.cli.configs import describe_packaged_configs, resolve_config
from rz_agents.cli.episode_summary import episode_counts, episode_line, failed_note
from rz_agents.cli.failure import attach_run_log
from rz_agents.cli.launches import account_launches, finished_at, previous_summary
from rz_agents.cli.run_dir import anchor_paths
from rz_agents.cli.warm_start import WarmStartMismatch, check_demos_fit, run_warm_start
from rz_agents.config_io import ConfigError, load_config, to_dict
from rz_agents.eval.in_loop import EVERY_PREFIX, START_PREFIX
from rz_agents.runtime import RunPlan, TrainConfig, build_run
from rz_agents.runtime.loop import RunHandle
from rz_agents.runtime.stop import RunStopped, StopRequest, StopSignals, signal_name, stop_exit_status
from rz_agents.trainer.health import health_summary
from rz_agents.warmstart import WarmStartConfig
from rz_agents.warmstart.episodes import EpisodeFileError


@dataclass
class RunConfig(TrainConfig):
    """A `rz train` YAML file: the training run (TrainConfig fields) plus warm start and report."""

    description: str = ""  # one line shown by rz train --list-configs
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    report: bool = True  # write report.html and inspector.html at the end of the run
    summary_window: int = 5  # steps averaged for reward_start / reward_end
    # Write the trained policy as an HF directory, run_dir/final_model (`rz eval --checkpoint` reads it).
    export_final_model: bool = True

    def validate(self) -> RunPlan:
        """The run's checks (``TrainConfig.validate``, which returns the plan) plus warm start and report."""
        plan = super().validate()
        self.warm_start.validate()
        if self.summary_window < 1:
            raise ValueError(f"summary_window must be >= 1, got {self.summary_window}")
        if self.warm_start.enabled and self.learner_process:
            raise ValueError(
                "warm_start with learner_process: true is not supported (the warm start trains this "
                "process's model; the learner process holds its own copy)"
            )
        if self.warm_start.demos > 0:
            from rz_agents.envs.resolve import resolve_env

            target = resolve_env(self.env.id)
            check_demos_fit(self.warm_start, self.env.id, target.cls or target.constructor())
        return plan


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a policy (warm start + async REINFORCE Zero) from a YAML config",
        description=(
            "Train a policy from a YAML config: a file, or the name of a packaged config (rz train "
            "--list-configs). Any field can be overridden on the command line as key.path=value, e.g. "
            "`rz train demo steps=20 rollout.max_lag=8`. The run directory receives config.yaml, "
            "metrics.jsonl, TensorBoard events (tb/), checkpoint.pt, summary.json, report.html and rz.log."
        ),
    )
    p.add_argument(
        "config",
        nargs="?",
        help="YAML config file, or a packaged config's name (e.g. demo); none with --resume",
    )
    p.add_argument("overrides", nargs="*", help="key.path=value overrides")
    p.add_argument("--run-dir", default=None, help="run directory (default: runs/<config name>-<time>)")
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=None,
        help="continue the run in RUN_DIR with its own config.yaml, from its checkpoint.pt (overrides may "
        "change only steps, checkpoint_every, reporting, runtime, ray and actors)",
    )
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    p.add_argument("--list-configs", action="store_true", help="list the packaged configs and exit")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the config and print a per-GPU memory estimate (weights, optimizer, activations, KV "
        "cache); trains nothing",
    )
    p.set_defaults(func=run)


class _ProgressWriter:
    """Wraps the run's MetricsWriter: every logged step also advances the progress display."""

    def __init__(self, inner, on_step) -> None:
        self.inner = inner
        self.on_step = on_step

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self.inner.write(step, metrics)
        self.on_step(step, metrics)

    def write_histograms(self, step: int, histograms: dict[str, Any]) -> None:
        self.inner.write_histograms(step, histograms)

    def close(self) -> None:
        self.inner.close()


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def build_summary(
    cfg: RunConfig,
    plan: RunPlan,
    history: list[dict],
    run_summary: dict,
    warm: dict | None,
    wall_s: float,
) -> dict:
    rewards = [m.get("reward_mean", math.nan) for m in history]
    w = cfg.summary_window
    dlogp = [
        m["lag0_abs_dlogp_max"] for m in history if isinstance(m.get("lag0_abs_dlogp_max"), (int, float))
    ]
    engine = run_summary.get("engine", {})
    generated = engine.get("generated_tokens")
    return {
        "reward_start": _mean(rewards[:w]),
        "reward_end": _mean(rewards[-w:]),
        "reward_per_step": [round(r, 4) if isinstance(r, float) else r for r in rewards],
        "steps": len(history),
        "wall_s": wall_s,
        "rl_wall_s": run_summary.get("wall_s"),
        "warm_start": warm,
        "max_lag_seen": run_summary.get("max_lag_seen"),
        "max_lag_allowed": plan.lag.bound,
        "lag0_max_abs_dlogp": max(dlogp) if dlogp else None,
        "lag0_tokens_checked": int(sum(m.get("lag0_token_count", 0) for m in history)),
        "kernels": cfg.model.kernels,
        "mode": cfg.mode,
        "generated_tokens": generated,
        # a vision-language policy's images: encoded by the engine's tower, inside a reused prefix (their K/V
        # reused), or served from its cache
        "images_encoded": engine.get("images_encoded"),
        "images_prefix_reused": engine.get("images_prefix_reused"),
        "images_reused": engine.get("images_reused"),
        "generated_tokens_per_s": (generated / run_summary["wall_s"])
        if generated and run_summary.get("wall_s")
        else None,
        "skipped_steps": run_summary.get("skipped_steps"),
        "rollout": run_summary.get("rollout"),
        "steps_per_s": run_summary.get("steps_per_s"),
        "episode_lengths": run_summary.get("episode_lengths"),
        "staleness": run_summary.get("staleness"),
        "episodes": episode_counts(run_summary),
        "eval": run_summary.get("eval"),  # the in-loop evaluations (eval.every), one entry each
        "health": health_summary(history),
        "stopped": run_summary.get("stopped"),  # a graceful stop: its signal and checkpoint (None: finished)
    }


def load_run_config(config: str, overrides: list[str] | None = None, validate: bool = True) -> RunConfig:
    """The run ``config`` names (a YAML path or a packaged config) with ``overrides`` applied and (unless
    ``validate`` is False: the caller validates it later, once) validated, as written (what it decides is
    the plan ``validate()`` returns). Raises ConfigError with one line naming the field."""
    return load_config(RunConfig, resolve_config(config), overrides, validate=validate)


def _configs(args: argparse.Namespace) -> tuple[RunConfig, RunConfig, Path, bool]:
    """(config to record in config.yaml, config to run, run directory, whether this resumes that run)."""
    if args.resume:
        overrides = ([args.config] if args.config else []) + list(args.overrides)
        if any("=" not in o for o in overrides):
            raise ConfigError(
                f"with --resume the config is {args.resume}/config.yaml; give only key=value overrides"
            )
        if args.run_dir and Path(args.run_dir).resolve() != Path(args.resume).resolve():
            raise ConfigError("--resume RUN_DIR and --run-dir name different directories")
        recorded, cfg = resume.config_for_resume(RunConfig, args.resume, overrides)
        return recorded, cfg, Path(args.resume), resume.resumes_run_dir(cfg, Path(args.resume))
    if not args.config:
        raise ConfigError(
            "name a config file or a packaged config (rz train --list-configs), or --resume RUN_DIR"
        )
    cfg = load_run_config(args.config, args.overrides, validate=False)  # validated once, in run()
    run_dir = Path(
        args.run_dir or Path("runs") / f"{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    cfg = dataclasses.replace(cfg, output_dir=str(run_dir))
    if not resume.resumes_run_dir(cfg, run_dir):
        resume.check_fresh_run_dir(run_dir)
        return cfg, cfg, run_dir, False
    original = resume.check_same_run(cfg, run_dir)
    recorded = cfg if original is None else dataclasses.replace(cfg, resume_from=original.get("resume_from"))
    return recorded, cfg, run_dir, True


def run(args: argparse.Namespace) -> int:
    """``rz train``: exit 2 for a config that cannot run, 1 when the run stops on an error, 0 when done, and
    128 + the signal (130 SIGINT, 143 SIGTERM) when a signal stopped it gracefully (runtime/stop.py)."""
    if args.list_configs:
        print(describe_packaged_configs())
        return 0
    prepared = _prepare(args)
    if isinstance(prepared, int):  # a dry run's status, or a config error
        return prepared
    recorded, cfg, plan, run_dir, resuming = prepared
    if resuming and _already_finished(run_dir, cfg):
        return 0
    previous = previous_summary(run_dir) if resuming else None
    started = time.time()
    _write_run_dir(args, run_dir, recorded)
    console, plain, log = _run_console(args)
    t0 = time.perf_counter()
    _log_start(log, cfg, run_dir, resuming)
    trained = _build_and_train(cfg, plan, run_dir, console, plain, log)
    if isinstance(trained, int):
        return trained
    runner, summary, warm, warm_s = trained
    wall = time.perf_counter() - t0
    result = build_summary(cfg, runner.plan, runner.history, summary, warm, wall)
    result["launch_warm_start_s"] = warm_s
    result = account_launches(result, previous, summary.get("steps_this_run", 0), started)
    (run_dir / "summary.json").write_text(json.dumps(result, indent=2))
    stopped = summary.get("stopped")
    if stopped:  # the run continues later: its report and final model are written when it ends
        where = "before the first learner step of this launch" if not summary["steps_this_run"] else ""
        _print_stop_line(stopped["signum"], where, stopped["checkpoint"], cfg, run_dir, summary["steps"])
        return stop_exit_status(stopped["signum"])
    report = None
    if cfg.report:
        from rz_agents.report import write_report

        report = write_report(run_dir, result)
    _print_summary(result, run_dir, report)
    return 0


def _prepare(args: argparse.Namespace) -> tuple[RunConfig, RunConfig, Any, Path, bool] | int:
    """(recorded config, run config, its plan, run directory, resuming), or the exit status of a dry run
    (nothing written) or of a config error (2, with the message printed)."""
    try:
        if args.dry_run:  # nothing is written: no run directory
            if args.resume:
                return _dry_run(resume.config_for_resume(RunConfig, args.resume, list(args.overrides))[1])
            return _dry_run(load_config(RunConfig, resolve_config(args.config), args.overrides))
        recorded, cfg, run_dir, resuming = _configs(args)
        try:
            # the run's resolve: the run is built from this plan, nothing resolves again
            plan = cfg.validate()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    except ConfigError as exc:
        print(f"rz train: config error: {exc}", file=sys.stderr)
        return 2
    return recorded, cfg, plan, run_dir, resuming


def _already_finished(run_dir: Path, cfg: RunConfig) -> bool:
    """True (and a line saying how to extend it) when the resumed run has trained ``cfg.steps`` already:
    then its files stay as they are."""
    done = finished_at(run_dir)
    if done is None or done < cfg.steps:
        return False
    print(
        f"rz train: {run_dir} finished at step {done}; pass steps=M (M > {done}) to extend it: "
        f"rz train --resume {run_dir} steps=M",
        file=sys.stderr,
    )
    return True


def _write_run_dir(args: argparse.Namespace, run_dir: Path, recorded: RunConfig) -> None:
    """The run directory with its log (rz.log: the run's messages, and the traceback if it stops on an
    error) and its config.yaml."""
    run_dir.mkdir(parents=True, exist_ok=True)
    attach_run_log(args, run_dir)
    # relative paths made absolute: the run's config.yaml then works from any directory
    recorded_data = anchor_paths(to_dict(recorded), Path.cwd())
    (run_dir / "config.yaml").write_text(yaml.safe_dump(recorded_data, sort_keys=False))


def _run_console(args: argparse.Namespace) -> tuple[Any, bool, Callable[[str], None]]:
    """(rich console on stderr, plain text?, log function)."""
    from rich.console import Console

    console = Console(stderr=True)
    # A progress bar only on a terminal: redirected (nohup, CI, a scheduler) the lines are plain text
    plain = args.no_progress or not console.is_terminal
    log = console.log if not plain else (lambda msg: print(msg, file=sys.stderr, flush=True))
    return console, plain, log


def _log_start(log: Callable[[str], None], cfg: RunConfig, run_dir: Path, resuming: bool) -> None:
    """The run's first lines: its directory, a CPU-memory warning if any, what it resumes from."""
    log(f"run directory: {run_dir}")
    from rz_agents.runtime.memory_estimate import cpu_memory_warning

    memory = cpu_memory_warning(cfg)
    if memory:
        log(f"warning: {memory}")
    if resuming:
        log(f"resuming from {cfg.resume_from}")


def _build_and_train(
    cfg: RunConfig, plan: Any, run_dir: Path, console: Any, plain: bool, log: Callable[[str], None]
) -> tuple[Any, dict[str, Any], Any, float | None] | int:
    """Build the run, warm-start it, train it and export its final model: (runner, the training summary,
    the warm start's result, its seconds), or an exit status (2: the run cannot be built or warm-started;
    128 + signal: stopped before training)."""
    # SIGINT / SIGTERM: stop at the next learner-step boundary and save there; a second one aborts
    stop = StopRequest()
    with StopSignals(stop) as signals:
        try:
            runner = build_run(cfg, plan)
        except (FileNotFoundError, ValueError) as exc:  # a missing checkpoint or tokenizer, a vocab mismatch
            print(f"rz train: cannot build the run: {exc}", file=sys.stderr)
            return 2
        signals.claim()  # runtime: ray: ray.init replaced the SIGTERM handler with its own (exit at once)
        try:
            try:
                stop.raise_if_requested("while the run was being built")
                warm_t0 = time.perf_counter()
                warm = run_warm_start(runner, cfg, log, stop)
                warm_s = time.perf_counter() - warm_t0 if warm is not None else None
            except (WarmStartMismatch, EpisodeFileError) as exc:
                print(f"rz train: warm start: {exc}", file=sys.stderr)
                return 2
            except RunStopped as exc:
                _print_stop_line(exc.signum, exc.where, None, cfg, run_dir)
                return stop_exit_status(exc.signum)
            summary = _train_with_progress(runner, cfg, console, plain, log, stop)
            # The steps are over and saved: from here a signal acts as without us (the export is atomic).
            signals.release()
            if cfg.export_final_model and not summary.get("stopped"):
                runner.export_model(run_dir / "final_model")
        finally:
            runner.close()
    return runner, summary, warm, warm_s


def _print_stop_line(
    signum: int | None, where: str, saved: str | None, cfg: RunConfig, run_dir: Path, steps: int = 0
) -> None:
    """The one line a gracefully stopped run ends with: where it saved (or that it saved nothing) and how to
    resume. Also in rz.log."""
    how = f"resume with: rz train --resume {run_dir}"
    if saved:
        line = f"rz train: stopped by {signal_name(signum)} after step {steps}/{cfg.steps}, saved {saved}"
    else:
        kept = Path(cfg.resume_from) if cfg.resume_from else None
        then = f"its checkpoint {kept} is unchanged" if kept else "no checkpoint was written"
        how = f"rz train --resume {run_dir} " + ("continues from it" if kept else "starts the run again")
        line = f"rz train: stopped by {signal_name(signum)} {where}: nothing to save ({then})"
    line = f"{line}; {how}"
    logging.getLogger(__name__).info(line)
    print(line, file=sys.stderr, flush=True)


def _dry_run(cfg: RunConfig) -> int:
    from rz_agents.runtime.memory_estimate import estimate_memory, model_config_of

    try:
        model_cfg, source = model_config_of(cfg.model)
    except (FileNotFoundError, ValueError) as exc:
        print(f"rz train: cannot size the model: {exc}", file=sys.stderr)
        return 2
    print(f"config ok: {cfg.description or 'run'}; model {source} on {cfg.model.device}")
    print(estimate_memory(cfg, model_cfg, source).format())
    return 0


def _train_with_progress(
    runner: RunHandle, cfg: RunConfig, console, plain: bool, log, stop: StopRequest | None = None
) -> dict:
    import asyncio

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    def describe(metrics: dict) -> str:
        r = metrics.get("reward_mean", float("nan"))
        lag = metrics.get("lag_max", 0)
        tps = metrics.get("trained_tokens_per_s", 0.0)
        ess = metrics.get("is_weight_ess_fraction", float("nan"))
        kl = metrics.get("kl_k3_behavior_to_learner", float("nan"))
        return (
            f"reward {r:.3f}  lag<= {lag}  ESS/n {ess:.2f}  KL {kl:.3f}  {tps:,.0f} "
            f"tok/s{failed_note(metrics)}"
        )

    steps_log = logging.getLogger("rz_agents.train")  # rz.log keeps every step line, bar or not

    def lines(step: int, metrics: dict) -> list[str]:
        """The step's line and its evaluations' in the order they ran (eval.at_start's, logged with step 0,
        first); every line goes to rz.log."""
        # `step N` is metrics.jsonl's, the report's and the inspector's step number (from 0)
        out = [f"step {step} ({step + 1}/{cfg.steps} done)  {describe(metrics)}"]
        if f"{START_PREFIX}wall_s" in metrics:
            out.insert(0, eval_line(step, metrics, START_PREFIX))
        if f"{EVERY_PREFIX}wall_s" in metrics:
            out.append(eval_line(step, metrics))
        for line in out:
            steps_log.info(line)
        return out

    if plain:

        def on_step(step, metrics):
            for line in lines(step, metrics):
                log(line)
            if "health_alarm_message" in metrics:
                log(metrics["health_alarm_message"])

        runner.writer = _ProgressWriter(runner.writer, on_step)
        return asyncio.run(runner.train(stop))

    progress = Progress(
        TextColumn("[bold]RL"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )
    with progress:
        task = progress.add_task("train", total=cfg.steps, info="waiting for the first batch")

        def on_step(step, metrics):
            progress.update(task, completed=step + 1, info=describe(metrics))
            for line in lines(step, metrics):  # the eval lines stay above the bar; the step's is the bar
                if not line.startswith("step "):
                    progress.console.print(line)
            if "health_alarm_message" in metrics:
                progress.console.print(f"[bold red]{metrics['health_alarm_message']}[/]")

        runner.writer = _ProgressWriter(runner.writer, on_step)
        return asyncio.run(runner.train(stop))


def eval_line(step: int, metrics: dict, prefix: str = EVERY_PREFIX) -> str:
    """An in-loop evaluation's line: its avg@k, pass@k and mean reward. ``prefix`` eval/ (eval.every): the
    one after ``step``; eval_at_start/ (eval.at_start): the one before step 0, logged with step 0."""
    figures = [
        f"{name} {metrics[f'{prefix}{key}']:.3f}"
        for key, name in (("avg_at_k", "avg@k"), ("pass_at_k", "pass@k"), ("mean_reward", "mean reward"))
        if isinstance(metrics.get(f"{prefix}{key}"), (int, float))
    ]
    failed = metrics.get(f"{prefix}num_failed")
    note = f"  ({failed:.0f} samples failed)" if failed else ""
    when = "before step 0 (eval.at_start)" if prefix == START_PREFIX else f"after step {step}"
    return f"eval {when}: {'  '.join(figures)}{note}"


def _eval_summary_line(evals: list[dict] | None) -> str | None:
    """Held-out before -> after over the run's in-loop evaluations (None when none ran); "before" is the
    untrained policy's when eval.at_start ran."""
    points = [e for e in evals or [] if isinstance(e.get("avg_at_k", e.get("mean_reward")), (int, float))]
    if not points:
        return None
    key = "avg_at_k" if "avg_at_k" in points[0] else "mean_reward"
    name = "avg@k" if key == "avg_at_k" else "mean reward"
    first, last = points[0], points[-1]

    def when(point: dict) -> str:
        return "before step 0" if point.get("at_start") else f"after step {point['step']}"

    return (
        f"held-out {name} (eval.every): {first[key]:.3f} ({when(first)}) -> {last[key]:.3f} "
        f"({when(last)}) over {len(points)} evaluations"
    )


def _health_line(h: dict) -> str:
    if h.get("status") == "alarm":
        a = h["alarm"]
        return f"health: ALARM from step {a['step']} ({a['reason']}); {h['advice']}"
    last = h.get("last_window") or {}
    return (
        f"health: {h.get('status', 'n/a')} (last 10 steps: KL k3 median "
        f"{last.get('kl_k3_median', math.nan):.3g}, ESS/n median "
        f"{last.get('ess_fraction_median', math.nan):.3g})"
    )


def _launches_note(rows: list[dict]) -> str:
    """How a resumed run's wall splits over its launches ("" for a run of one launch)."""
    if len(rows) < 2:
        return ""
    parts = [f"{r['wall_s']:.1f} s (steps {r['steps'][0]}-{r['steps'][1]})" for r in rows if r.get("wall_s")]
    return f" over {len(rows)} launches: " + " + ".join(parts)


def _print_summary(s: dict, run_dir: Path, report: Path | None) -> None:
    def fmt(v, spec=".3f"):
        return format(v, spec) if isinstance(v, (int, float)) and v is not None else str(v)

    lines = [
        "",
        "=== rz train: summary ===",
        f"reward (mean of first/last steps): {fmt(s['reward_start'])} -> {fmt(s['reward_end'])}",
        f"steps: {s['steps']}   wall: {fmt(s['wall_s'], '.1f')} s (RL {fmt(s['rl_wall_s'], '.1f')} s)"
        + _launches_note(s.get("launches") or []),
        f"max policy lag reached: {s['max_lag_seen']} (bound {s['max_lag_allowed']})",
        f"lag-0 max |dlogp|: {s['lag0_max_abs_dlogp']} over {s['lag0_tokens_checked']} tokens "
        f"({'bit-identical' if s['lag0_max_abs_dlogp'] == 0.0 else 'NOT bit-identical'}, "
        f"kernels={s['kernels']})"
        if s["lag0_max_abs_dlogp"] is not None
        else "lag-0 max |dlogp|: no lag-0 token was trained, none checked",
        _eval_summary_line(s.get("eval")),
        f"generated tokens/s: {fmt(s['generated_tokens_per_s'], ',.0f')}",
        episode_line(s.get("episodes")),
        _health_line(s.get("health") or {}),
        f"run directory: {run_dir}",
        f"summary: {run_dir / 'summary.json'}",
    ]
    if report:
        lines.append(f"report: {report}")
    lines = [line for line in lines if line is not None]
    print("\n".join(lines), flush=True)
    logging.getLogger(__name__).info("\n".join(lines[1:]))  # rz.log ends with the summary too
