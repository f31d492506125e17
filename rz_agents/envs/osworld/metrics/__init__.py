"""Metrics: compare a getter's result with the expected state; each returns a score in [0, 1].

Signatures follow OSWorld: ``metric(result, expected, **options)`` (or ``metric(result, **options)``
when the task has no ``expected`` getter). A ``None`` result (state missing) scores 0.
``infeasible`` is scored by the evaluator from the action history, not here.

One module per kind of state: ``general`` (literals, JSON/CSV/list files, SQLite, the
accessibility tree), ``chrome``, ``table`` (spreadsheets, CSV), ``pdf``, ``slides``, ``docs``,
``images``, ``app_config`` (GIMP, LibreOffice, Thunderbird, VLC settings), ``vscode`` (settings
text, extensions, zips, test suites), ``os_state`` (clipboard, time zone, GNOME settings),
``media`` (MP3 tags, EPUB, audio, video), ``archive`` (``compare_archive``). ``option_problem``
says when a task asks a metric for something it does not implement, ``blocker`` when this machine
lacks a library or tool a metric needs for the task's files (the runnability check uses both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rz_agents.envs.osworld.metrics import (
    app_config,
    archive,
    chrome,
    docs,
    general,
    images,
    media,
    os_state,
    pdf,
    slides,
    table,
    vscode,
)

_MODULES = (general, chrome, table, pdf, slides, docs, images, app_config, vscode, os_state, media, archive)
METRICS: dict[str, Callable[..., float]] = {k: v for m in _MODULES for k, v in m.METRICS.items()}

# Scored from the action history by the evaluator.
SPECIAL_METRICS = ("infeasible",)

# name -> options -> a reason the options are not supported here (None when they are)
OPTION_CHECKS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    k: v for m in _MODULES for k, v in getattr(m, "OPTION_CHECKS", {}).items()
}


# name -> () -> why the task's files cannot be scored on this machine (a missing library or tool)
BLOCKERS: dict[str, Callable[[], str | None]] = {
    k: v for m in _MODULES for k, v in getattr(m, "BLOCKERS", {}).items()
}


def blocker(name: str) -> str | None:
    """What this machine lacks to score ``name`` on a task's files, or None."""
    check = BLOCKERS.get(name)
    return check() if check else None


def option_problem(name: str, options: dict[str, Any]) -> str | None:
    """Why ``name`` cannot score with these ``options`` here, or None."""
    check = OPTION_CHECKS.get(name)
    return check(options or {}) if check else None


__all__ = ["BLOCKERS", "METRICS", "OPTION_CHECKS", "SPECIAL_METRICS", "blocker", "option_problem"]
