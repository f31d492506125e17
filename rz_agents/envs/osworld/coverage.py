"""Which metric functions and getter types task files use, and which are implemented here.

``evaluator_inventory(paths)`` reads task JSONs (folders are searched recursively) and counts
each metric and getter by the tasks that use it; ``scripts/osworld_coverage.py`` prints it, so
the numbers in ``envs/osworld/README.md`` can be re-derived.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from rz_agents.envs.osworld.getters import GETTERS, UNAVAILABLE
from rz_agents.envs.osworld.metrics import METRICS, SPECIAL_METRICS, blocker


def _listed(value: Any, n: int) -> list[Any]:
    return value if isinstance(value, list) else [value] * n


def _task_files(paths: list[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(p.rglob("*.json")) if p.is_dir() else [p])
    return out


def evaluator_inventory(paths: list[str | Path]) -> dict[str, Any]:
    """Metric and getter use over the task files under ``paths``.

    Returns ``tasks`` (files with an evaluator), ``metrics`` and ``getters`` (name -> number of
    tasks using it, most used first; the empty name is a placeholder evaluator), and for each
    kind the names ``implemented``, ``missing`` and (getters) ``unavailable`` with their reasons,
    and (metrics) ``blocked``: implemented but needing a library or tool this machine lacks.
    """
    metric_use: Counter[str] = Counter()
    getter_use: Counter[str] = Counter()
    tasks = 0
    for path in _task_files(paths):
        try:
            task = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        ev = task.get("evaluator") if isinstance(task, dict) else None
        if not isinstance(ev, dict):
            continue
        tasks += 1
        funcs = ev.get("func")
        funcs = funcs if isinstance(funcs, list) else [funcs]
        metric_use.update({f for f in funcs if isinstance(f, str)})
        kinds = set()
        for key in ("result", "expected"):
            for getter in _listed(ev.get(key), len(funcs)):
                if isinstance(getter, dict) and "type" in getter:
                    kinds.add(getter["type"])
        getter_use.update(kinds)
    named = [m for m in metric_use if m]
    return {
        "tasks": tasks,
        "metrics": dict(metric_use.most_common()),
        "getters": dict(getter_use.most_common()),
        "metrics_implemented": sorted(m for m in named if m in METRICS or m in SPECIAL_METRICS),
        "metrics_missing": sorted(m for m in named if m not in METRICS and m not in SPECIAL_METRICS),
        "metrics_blocked": {m: blocker(m) for m in sorted(named) if m in METRICS and blocker(m)},
        "getters_implemented": sorted(g for g in getter_use if g in GETTERS),
        "getters_unavailable": {
            g: UNAVAILABLE[g] for g in sorted(getter_use) if g not in GETTERS and g in UNAVAILABLE
        },
        "getters_missing": sorted(g for g in getter_use if g not in GETTERS and g not in UNAVAILABLE),
    }
