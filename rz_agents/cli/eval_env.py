"""``rz eval RUN/config.yaml --checkpoint DIR``: the command-line side of rz_agents.eval.env_eval.

Exit status: 0 when the evaluation ran, 2 for a bad config, checkpoint or task list, 1 when every sample
failed (nothing was measured).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2
EXIT_ALL_FAILED = 1


def _config(args: argparse.Namespace, section: dict[str, Any]):
    from rz_agents.config_io import rename_fields
    from rz_agents.eval.env_eval import EnvEvalConfig

    names = (
        "k",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "limit",
        "max_running",
        "num_threads",
        "kernels",
        "dtype",
    )
    section = rename_fields(EnvEvalConfig, section, "eval")
    values: dict[str, Any] = {n: section[n] for n in names if section.get(n) is not None}
    values.update({n: getattr(args, n) for n in names if getattr(args, n, None) is not None})
    if section.get("success_threshold") is not None:
        values["success_threshold"] = section["success_threshold"]
    if args.threshold is not None:
        values["success_threshold"] = args.threshold
    if section.get("save_text") or getattr(args, "save_text", None):
        values["save_text"] = True
    checkpoint = args.checkpoint or section.get("checkpoint")
    # the eval: section training reads (eval.tasks / eval.num_tasks), the flags over it
    tasks = args.tasks if args.tasks is not None else section.get("tasks")
    num_tasks = args.num_tasks if args.num_tasks is not None else section.get("num_tasks")
    return EnvEvalConfig(checkpoint=checkpoint, tasks=tasks, num_tasks=num_tasks, **values)


def run_env(args: argparse.Namespace) -> int:
    """Evaluate the checkpoint on the training config's env; print the table (or JSON)."""
    from rz_agents.cli.configs import resolve_config
    from rz_agents.cli.train import load_run_config
    from rz_agents.config_io import ConfigError
    from rz_agents.eval.checkpoint_policy import load_checkpoint_policy
    from rz_agents.eval.env_eval import eval_tasks, format_env_table, run_env_eval
    from rz_agents.model.checkpoint import CheckpointError

    def fail(message: str) -> int:
        print(f"rz eval: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT

    try:
        run_cfg = load_run_config(str(resolve_config(args.config)))
        section = run_cfg.eval if isinstance(run_cfg.eval, dict) else {}
        config = _config(args, section)
        config.validate()
        tasks = eval_tasks(run_cfg, config)
    except (ConfigError, ValueError) as exc:
        hint = " (or pass --tasks FILE / --num-tasks N)" if str(exc).startswith("no eval tasks") else ""
        return fail(f"{exc}{hint}")
    if not config.checkpoint:
        return fail("no checkpoint: pass --checkpoint DIR (a run's final_model)")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        return fail(f"--out {args.out}: folder {Path(args.out).resolve().parent} does not exist")
    try:
        policy = load_checkpoint_policy(
            config.checkpoint, kernels=config.kernels, dtype=config.dtype, tokenizer=run_cfg.tokenizer,
            adapter=getattr(args, "adapter", None),
        )  # fmt: skip
    except (FileNotFoundError, CheckpointError, ValueError) as exc:
        return fail(str(exc))
    from rz_agents.runtime.config import TrainConfig
    from rz_agents.runtime.factories import run_env_factory

    plan = TrainConfig.validate(run_cfg)  # the run schema's checks, and what it decides
    evaluate = functools.partial(run_env_eval, plan=plan, make_env=run_env_factory(run_cfg, plan))
    result = _with_progress(run_cfg, config, policy, len(tasks) * config.k, args.quiet, evaluate)
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text if args.json else format_env_table(result, max_rows=args.rows))
    if result["num_failed"] == result["num_samples"]:
        print(
            f"rz eval: error: all {result['num_samples']} samples failed; the first: {result['first_error']}",
            file=sys.stderr,
        )
        return EXIT_ALL_FAILED
    return 0


def _with_progress(run_cfg, config, policy, total: int, quiet: bool, run_env_eval) -> dict[str, Any]:
    if quiet:
        return run_env_eval(run_cfg, config, policy)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    reward = 0.0
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("reward {task.fields[reward]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    ) as progress:
        bar = progress.add_task(f"{run_cfg.env.id} k={config.k}", total=total, reward="-")

        def on_sample(_: int, sample: dict) -> None:
            nonlocal reward
            reward += sample["reward"]
            done = progress.tasks[0].completed + 1
            progress.update(bar, advance=1, reward=f"{reward / done:.3f}")

        return run_env_eval(run_cfg, config, policy, on_sample=on_sample)
