"""``rz harbor``: Harbor terminal tasks.

* ``rz harbor validate [DIR] [--json] [--jobs N]``: for each task under DIR (default: the packaged set),
  build its environment in the sandbox, score the untouched environment (must be 0.0) and the reference
  solution (must be 1.0), and say why any task is left out. Exit 0 when every task is buildable, 1 when
  some are not.
* ``rz harbor list [DIR]``: the tasks, one line each (name, category, difficulty).
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(subparsers: Any) -> None:
    """Register ``harbor`` and its ``validate`` / ``list`` subcommands."""
    parser = subparsers.add_parser("harbor", help="Harbor terminal tasks: validate, list")
    sub = parser.add_subparsers(dest="harbor_command", metavar="SUBCOMMAND")
    v = sub.add_parser("validate", help="build each task here; oracle must score 1.0, untouched 0.0")
    v.add_argument("dir", nargs="?", default=None, help="a Harbor task folder or a folder of tasks")
    v.add_argument("--json", action="store_true", help="print the whole report as one JSON object")
    v.add_argument("--jobs", type=int, default=2, help="tasks checked at once (default 2)")
    v.set_defaults(func=run_validate)
    ls = sub.add_parser("list", help="the tasks, one line each")
    ls.add_argument("dir", nargs="?", default=None)
    ls.set_defaults(func=run_list)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def run_validate(args: argparse.Namespace) -> int:
    from rz_agents.envs.harbor.task import packaged_tasks_dir
    from rz_agents.envs.harbor.validate import validate

    folder = args.dir or str(packaged_tasks_dir())
    report = validate(folder, jobs=args.jobs)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for row in report["tasks"]:
            mark = "ok  " if row["buildable"] else "left"
            print(f"{mark} {row['name']}" + (f": {row['reason']}" if row.get("reason") else ""))
        print(f"buildable: {report['buildable']} of {report['total']}")
    if report["total"] == 0:
        print(f"rz harbor validate: no Harbor tasks (task.toml) under {folder}")
        return 2
    return 0 if report["buildable"] == report["total"] else 1


def run_list(args: argparse.Namespace) -> int:
    from rz_agents.envs.harbor.task import TaskError, find_tasks, load_task, packaged_tasks_dir

    for path in find_tasks(args.dir or packaged_tasks_dir()):
        try:
            t = load_task(path)
            print(f"{t.name:40s} {t.category:18s} {t.difficulty}")
        except TaskError as exc:
            print(f"{path.name:40s} malformed: {exc}")
    return 0
