"""Which Harbor tasks build and score here, and why the others do not.

A task counts as *buildable* when its environment builds in the bubblewrap sandbox, the untouched
environment scores 0.0 (the verifier is not vacuous) and the reference solution scores 1.0 (the task can
be solved and the verifier recognises it). Anything else is reported with its reason.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rz_agents.envs.harbor.shell import SandboxUnavailable
from rz_agents.envs.harbor.task import TaskError, find_tasks, load_task
from rz_agents.envs.harbor.trial import BuildError, Trial


def check_task(path: Path) -> dict[str, Any]:
    """One task's verdict: ``{"name", "buildable", "untouched", "oracle", "reason"}``."""
    row: dict[str, Any] = {"name": path.name, "buildable": False, "untouched": None, "oracle": None}
    try:
        task = load_task(path)
        row.update(category=task.category, difficulty=task.difficulty)
        if task.solution_dir is None:
            row["reason"] = "no solution/solve.sh: the task cannot be checked"
            return row
        with Trial(task) as trial:
            untouched = trial.verify()
            row["untouched"] = untouched.reward
        with Trial(task) as trial:
            solved = trial.run_solution()
            oracle = trial.verify()
            row["oracle"] = oracle.reward
    except (TaskError, BuildError, SandboxUnavailable) as exc:
        row["reason"] = f"{type(exc).__name__}: {exc}"
        return row
    if row["untouched"] != 0.0:
        row["reason"] = f"the untouched environment scores {row['untouched']} (expected 0.0)"
    elif row["oracle"] != 1.0:
        tail = solved.output[-300:].strip()
        row["reason"] = f"the reference solution scores {row['oracle']} (expected 1.0); " + (
            oracle.error or f"solve.sh exit {solved.exit_code}: {tail}"
        )
    else:
        row["buildable"] = True
        row["reason"] = None
    return row


def validate(folder: str | Path, jobs: int = 2) -> dict[str, Any]:
    """Check every task under ``folder``: ``{"buildable", "total", "tasks", "left_out": {name: why}}``."""
    paths = find_tasks(folder)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        rows = list(pool.map(check_task, paths))
    left_out = {r["name"]: r["reason"] for r in rows if not r["buildable"]}
    return {
        "folder": str(folder),
        "buildable": sum(r["buildable"] for r in rows),
        "total": len(rows),
        "left_out": left_out,
        "tasks": rows,
    }
