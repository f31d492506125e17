"""``rz osworld``: check OSWorld task sets, fill their input cache, evaluate policies on the local desktop.

* ``rz osworld validate DIR [--json] [--cache DIR] [--assume-cached] [--subset FILE]``: parse every
  task and say, per task, whether it can run here and exactly why not; with a ``test_all.json``
  (found next to DIR, as in OSWorld's layout, or given) also the count over that subset.
  Exit 0 when every file parsed.
* ``rz osworld fetch DIR --cache DIR``: download every task's input files into the cache.
* ``rz osworld eval --tasks DIR|FILE --policy ...``: run the runnable tasks and print the success
  table (``rz eval osworld`` is the same command; its options are defined once, here).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> None:
    """Register ``osworld`` and its ``validate``/``fetch``/``eval`` subcommands."""
    parser = subparsers.add_parser("osworld", help="OSWorld tasks: validate, fetch inputs, evaluate a policy")
    sub = parser.add_subparsers(dest="osworld_command", metavar="SUBCOMMAND")

    v = sub.add_parser("validate", help="parse tasks and report which can run here and why not")
    v.add_argument("dir", help="a task folder (searched recursively) or one task file")
    v.add_argument("--json", action="store_true", help="print the full report as JSON")
    v.add_argument("--cache", default=None, help="input-file cache folder (default $RZ_OSWORLD_CACHE)")
    v.add_argument(
        "--assume-cached",
        action="store_true",
        help="count remote input files as cached (what a full cache allows)",
    )
    v.add_argument(
        "--subset",
        default=None,
        help="a test_all.json ({domain: [ids]}) to count runnable tasks of "
        "(default: DIR/../test_all.json if present)",
    )
    v.set_defaults(func=run_validate)

    f = sub.add_parser("fetch", help="download every task's input files into the cache (needs internet)")
    f.add_argument("dir", help="a task folder (searched recursively) or one task file")
    f.add_argument("--cache", default=None, help="cache folder to fill (default $RZ_OSWORLD_CACHE)")
    f.add_argument("--jobs", type=int, default=4, help="parallel downloads (default 4)")
    f.add_argument("--timeout", type=float, default=300.0, help="seconds per download (default 300)")
    f.set_defaults(func=run_fetch)

    e = sub.add_parser("eval", help="run a policy on the runnable tasks and print the success table")
    add_eval_arguments(e)
    e.set_defaults(func=run_eval)

    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _add(group: Any, *flags: str, **kwargs: Any) -> None:
    """Add an option unless the parser already has it (``rz eval`` defines --checkpoint etc. for math)."""
    taken = group._option_string_actions if hasattr(group, "_option_string_actions") else {}
    if not any(f in taken for f in flags):
        group.add_argument(*flags, **kwargs)


def add_eval_arguments(group: Any) -> None:
    """The options of an OSWorld evaluation, shared by ``rz osworld eval`` and ``rz eval osworld``."""
    _add(group, "--tasks", help="OSWorld task folder or file")
    _add(
        group,
        "--policy",
        default=None,
        help="oracle (default) | noop | package.module:callable | openai:URL/MODEL (an OpenAI-compatible "
        "endpoint, e.g. openai:http://gpu:8000/v1/Qwen/Qwen3-4B; key from $OPENAI_API_KEY)",
    )
    _add(group, "--checkpoint", help="evaluate this HF checkpoint (or packaged model) with our engine")
    _add(group, "--max-tokens", type=int, default=None, help="tokens per reply (default 512)")
    _add(group, "--temperature", type=float, default=None, help="sampling temperature (default 0: greedy)")
    _add(group, "--top-p", type=float, default=None, help="nucleus sampling (default 1)")
    _add(group, "--seed", type=int, default=None, help="sampling seed (default 0)")
    _add(
        group, "--history-turns", type=int, default=3, help="past turns a model sees (default 3, as OSWorld)"
    )
    _add(
        group,
        "--max-tree-tokens",
        type=int,
        default=10000,
        help="accessibility-tree budget per turn (default 10000)",
    )
    _add(
        group,
        "--observation",
        choices=("a11y_tree", "screenshot", "screenshot_a11y_tree"),
        default="a11y_tree",
        help="what the policy sees, OSWorld's names (default a11y_tree)",
    )
    _add(
        group,
        "--image-size",
        type=int,
        nargs=2,
        metavar=("W", "H"),
        default=None,
        help="resize screenshots to W x H (the model's image size; coordinates scaled back to the screen)",
    )
    _add(
        group,
        "--tokenizer",
        choices=("byte", "qwen3", "checkpoint"),
        default=None,
        help="the tokenizer --checkpoint was trained with (its training config's tokenizer:; default: its "
        "tokenizer.json, else Qwen3's)",
    )
    _add(group, "--max-len", type=int, default=None, help="engine context length (default: the model's)")
    _add(group, "--num-threads", type=int, help="torch threads for the engine (default: torch's)")
    _add(group, "--kernels", choices=("aligned", "standard"), help="op set (default aligned)")
    _add(group, "--dtype", choices=("float32", "bfloat16"), help="model dtype (default: the checkpoint's)")
    _add(group, "--max-steps", type=int, default=15, help="turns per task (default 15)")
    _add(group, "--action-space", choices=("pyautogui", "computer_13"), default="pyautogui")
    _add(group, "--provider", choices=("local", "docker"), default="local")
    _add(group, "--cache", default=None, help="input-file cache folder (default $RZ_OSWORLD_CACHE)")
    _add(group, "--include-unrunnable", action="store_true", help="also try tasks the check rejects")
    _add(
        group,
        "--subset",
        default=None,
        help="OSWorld's task list (test_all.json; default: one next to the --tasks folder): run the listed "
        "tasks and add the whole-benchmark figure, tasks not run here counted as failures",
    )
    _add(group, "--json", action="store_true", help="print the full result as JSON")


def _subset_file(args: argparse.Namespace, folder: str | None = None) -> Path | None:
    """``--subset``, else OSWorld's ``test_all.json`` next to the task folder (its layout)."""
    if args.subset:
        return Path(args.subset)
    folder = folder if folder is not None else args.dir
    guess = Path(folder).resolve().parent / "test_all.json"
    return guess if Path(folder).is_dir() and guess.is_file() else None


def run_validate(args: argparse.Namespace) -> int:
    """Print the runnability report; exit 1 when some file did not parse, 2 for a bad path."""
    from rz_agents.envs.osworld.cache import default_cache_dir
    from rz_agents.envs.osworld.runnability import validate_dir

    subset = _subset_file(args)
    try:
        ids = json.loads(subset.read_text()) if subset else None
        report = validate_dir(args.dir, args.cache or default_cache_dir(), args.assume_cached, subset=ids)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"error: --subset {subset}: {exc}", file=sys.stderr)
        return 2
    if report.get("subset") is not None:
        report["subset"]["file"] = str(subset)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_validate(report, args.assume_cached)
    return 0 if report["parsed"] == report["total"] else 1


def _print_validate(report: dict[str, Any], assumed: bool) -> None:
    for t in report["tasks"]:
        status = "runnable" if t["runnable"] else "NOT runnable"
        print(f"{t['domain']:<20} {t['id']:<40} {status}")
        for reason in t["reasons"]:
            print(f"    - {reason}")
    for path, err in report["parse_errors"].items():
        print(f"PARSE ERROR {path}: {err}")
    note = " (input files assumed cached)" if assumed else ""
    print(
        f"\n{report['parsed']}/{report['total']} parsed, {report['runnable']} runnable here{note};"
        " not runnable by first reason:"
    )
    for reason, n in report["not_runnable"].items():
        print(f"  {n:4d}  {reason}")
    for kind, packages in report["setup_packages"].items():
        if packages:
            listed = ", ".join(
                f"{n}{'' if p['installed'] else ' (NOT installed)'}" for n, p in packages.items()
            )
            print(f"setups' {kind} installs: {listed}")
    sub = report.get("subset")
    if sub:
        print(f"\n{sub['file']}: {sub['runnable']} of {sub['found']} tasks runnable ({sub['listed']} listed)")
        for domain, d in sorted(sub["by_domain"].items()):
            print(f"  {domain:<22} {d['runnable']:4d} / {d['total']}")


def run_fetch(args: argparse.Namespace) -> int:
    """Fill the cache; exit 1 when a download failed, 2 for a bad path."""
    from rz_agents.envs.osworld.cache import default_cache_dir
    from rz_agents.envs.osworld.fetch import fetch_inputs

    cache = args.cache or default_cache_dir()

    def progress(status: str, url: str) -> None:
        if status != "cached":
            print(f"  {status:<8} {url[:110]}", file=sys.stderr, flush=True)

    try:
        report = fetch_inputs(args.dir, cache, jobs=args.jobs, timeout=args.timeout, on_file=progress)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for url, reason in report.failed.items():
        print(f"FAILED {url}: {reason}")
    print(
        f"{report.tasks} tasks: {len(report.fetched)} files downloaded, {len(report.cached)} already cached, "
        f"{len(report.failed)} failed -> {cache}"
    )
    return 1 if report.failed else 0


def run_eval(args: argparse.Namespace) -> int:
    """Run the evaluation and print the success table; exit 2 for a bad task path or policy."""
    from rz_agents.eval.osworld import format_table, run_osworld_eval

    if not args.tasks:
        print("error: needs --tasks DIR|FILE", file=sys.stderr)
        return 2

    def progress(row: dict[str, Any]) -> None:
        if not args.json:
            score = "-" if row["score"] is None else f"{row['score']:.2f}"
            print(f"  {row['status']:<8} {score:>5}  {row['id']}", file=sys.stderr, flush=True)

    subset = _subset_file(args, args.tasks)
    try:
        ids = json.loads(subset.read_text()) if subset else None
    except (OSError, ValueError) as exc:
        print(f"error: --subset {subset}: {exc}", file=sys.stderr)
        return 2
    try:
        policy = _policy(args)
        summary = run_osworld_eval(
            args.tasks,
            policy=policy,
            max_steps=args.max_steps,
            action_space=args.action_space,
            provider=args.provider,
            download_cache=args.cache,
            include_unrunnable=args.include_unrunnable,
            max_tree_tokens=args.max_tree_tokens,
            on_result=progress,
            subset=ids,
            observation=args.observation,
            image_size=tuple(args.image_size) if args.image_size else None,
        )
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2) if args.json else format_table(summary))
    return 0


def _policy(args: argparse.Namespace) -> Any:
    """The policy the options ask for: a model (``--checkpoint`` / ``openai:``) or a named one."""
    from rz_agents.eval.osworld_policies import Sampling, model_policy
    from rz_agents.model.checkpoint import CheckpointError

    def given(name: str, default: Any) -> Any:
        value = getattr(args, name, None)
        return default if value is None else value

    sampling = Sampling(
        max_tokens=given("max_tokens", 512),
        temperature=given("temperature", 0.0),
        top_p=given("top_p", 1.0),
        seed=given("seed", 0),
        history_turns=args.history_turns,
    )
    engine = {"max_len": args.max_len, "num_threads": getattr(args, "num_threads", None),
              "kernels": given("kernels", "aligned"), "dtype": getattr(args, "dtype", None)}  # fmt: skip
    try:
        model = model_policy(args.policy, args.checkpoint, sampling, observation=args.observation,
                             tokenizer=getattr(args, "tokenizer", None), **engine)  # fmt: skip
    except CheckpointError as exc:
        raise ValueError(str(exc)) from exc
    return model if model is not None else (args.policy or "oracle")
