"""``rz osworld``: check OSWorld task sets and evaluate policies on the local desktop.

* ``rz osworld validate DIR [--json]``: parse every task and say, per task, whether it can run
  here and exactly why not. Exit 0 when every file parsed.
* ``rz osworld eval --tasks DIR|FILE --policy oracle|noop|module:callable``: run the runnable
  tasks and print the success table (``--json`` for the full result).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(subparsers: Any) -> None:
    """Register ``osworld`` and its ``validate``/``eval`` subcommands."""
    parser = subparsers.add_parser("osworld", help="OSWorld tasks: validate a task set, evaluate a policy")
    sub = parser.add_subparsers(dest="osworld_command", metavar="SUBCOMMAND")

    v = sub.add_parser("validate", help="parse tasks and report which can run here and why not")
    v.add_argument("dir", help="a task folder (searched recursively) or one task file")
    v.add_argument("--json", action="store_true", help="print the full report as JSON")
    v.add_argument("--cache", default=None, help="download cache folder (default $RZ_OSWORLD_CACHE)")
    v.set_defaults(func=run_validate)

    e = sub.add_parser("eval", help="run a policy on the runnable tasks and print the success table")
    e.add_argument("--tasks", required=True, help="task folder or file")
    e.add_argument("--policy", default="oracle", help="oracle | noop | package.module:callable")
    e.add_argument("--max-steps", type=int, default=15)
    e.add_argument("--action-space", choices=("pyautogui", "computer_13"), default="pyautogui")
    e.add_argument("--provider", choices=("local", "docker"), default="local")
    e.add_argument("--cache", default=None, help="download cache folder (default $RZ_OSWORLD_CACHE)")
    e.add_argument("--include-unrunnable", action="store_true", help="also try tasks the check rejects")
    e.add_argument("--json", action="store_true", help="print the full result as JSON")
    e.set_defaults(func=run_eval)

    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def run_validate(args: argparse.Namespace) -> int:
    """Print the runnability report; exit 1 when some file did not parse, 2 for a bad path."""
    from rz_agents.envs.osworld.cache import default_cache_dir
    from rz_agents.envs.osworld.runnability import validate_dir

    try:
        report = validate_dir(args.dir, args.cache or default_cache_dir())
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for t in report["tasks"]:
            status = "runnable" if t["runnable"] else "NOT runnable"
            print(f"{t['domain']:<20} {t['id']:<40} {status}")
            for reason in t["reasons"]:
                print(f"    - {reason}")
        for path, err in report["parse_errors"].items():
            print(f"PARSE ERROR {path}: {err}")
        print(
            f"\n{report['parsed']}/{report['total']} parsed, {report['runnable']} runnable here; "
            "not runnable by first reason:"
        )
        for reason, n in report["not_runnable"].items():
            print(f"  {n:4d}  {reason}")
    return 0 if report["parsed"] == report["total"] else 1


def run_eval(args: argparse.Namespace) -> int:
    """Run the evaluation and print the success table; exit 2 for a bad task path or policy."""
    from rz_agents.eval.osworld import format_table, run_osworld_eval

    def progress(row: dict[str, Any]) -> None:
        if not args.json:
            score = "-" if row["score"] is None else f"{row['score']:.2f}"
            print(f"  {row['status']:<8} {score:>5}  {row['id']}", file=sys.stderr, flush=True)

    try:
        summary = run_osworld_eval(
            args.tasks,
            policy=args.policy,
            max_steps=args.max_steps,
            action_space=args.action_space,
            provider=args.provider,
            download_cache=args.cache,
            include_unrunnable=args.include_unrunnable,
            on_result=progress,
        )
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2) if args.json else format_table(summary))
    return 0
