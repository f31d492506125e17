"""Whole-run accounting across launches: a run stopped (Ctrl-C, SIGTERM) and resumed is one run.

Each ``rz train`` launch of a run directory adds one row to ``summary.json``'s ``launches``; the run's
``wall_s`` / ``rl_wall_s`` are the sums over its launches and its ``warm_start`` is the launch's that ran
it (a resume trains on the checkpoint and runs none).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def previous_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary.json an earlier launch of ``run_dir`` wrote (None: none, or unreadable)."""
    try:
        data = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def finished_at(run_dir: Path) -> int | None:
    """The step a finished run ended at (its last launch was not stopped), else None."""
    summary = previous_summary(run_dir)
    if summary is None or summary.get("stopped") or not isinstance(summary.get("steps"), int):
        return None
    return summary["steps"]


def _row(summary: dict[str, Any], steps_this_run: int | None, started: str | None) -> dict[str, Any]:
    steps = summary.get("steps", 0)
    first = steps - (steps_this_run if steps_this_run is not None else steps)
    stopped = summary.get("stopped") or {}
    return {
        "started": started,
        "steps": [first, steps],  # learner steps done before and after this launch
        "wall_s": summary.get("launch_wall_s", summary.get("wall_s")),
        "rl_wall_s": summary.get("launch_rl_wall_s", summary.get("rl_wall_s")),
        "warm_start_s": summary.get("launch_warm_start_s"),
        "stopped_by": stopped.get("signal") if isinstance(stopped, dict) else None,
    }


def account_launches(
    result: dict[str, Any], previous: dict[str, Any] | None, steps_this_run: int, started: float
) -> dict[str, Any]:
    """``result`` (this launch's summary) as the whole run's: one row per launch in ``launches``, ``wall_s``
    and ``rl_wall_s`` summed over them (this launch's alone in ``launch_wall_s`` / ``launch_rl_wall_s``),
    ``warm_start`` the run's. ``previous``: the summary the launch before wrote (None for a first launch)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started))
    out = dict(result, launch_wall_s=result.get("wall_s"), launch_rl_wall_s=result.get("rl_wall_s"))
    rows = []
    if previous is not None:
        rows = list(previous.get("launches") or [_row(previous, None, None)])  # (a summary from before rows)
        if out.get("warm_start") is None:
            out["warm_start"] = previous.get("warm_start")
    rows.append(_row(out, steps_this_run, stamp))
    out["launches"] = rows
    for key in ("wall_s", "rl_wall_s"):
        values = [r[key] for r in rows if isinstance(r[key], (int, float))]
        out[key] = sum(values) if values else out.get(key)
    return out
