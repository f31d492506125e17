"""What happened to a run's episodes, for the console: failed / rerun / lost, with the first error."""

from __future__ import annotations

from typing import Any


def episode_counts(run_summary: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``'s ``episodes``: started, finished, failed, rerun, lost and the first error."""
    c = run_summary.get("rollout") or {}
    return {
        "started": int(c.get("episodes_started", 0)),
        "finished": int(c.get("episodes_finished", 0)),
        "failed": int(c.get("episodes_failed", 0)),
        "rerun": int(c.get("episodes_rerun", 0)),
        "lost": int(c.get("episodes_lost", 0)),
        "first_error": run_summary.get("first_episode_error"),
    }


def episode_line(episodes: dict[str, Any] | None) -> str:
    """One summary line, plus the first error when an episode failed (its traceback is in rz.log)."""
    if not episodes:
        return "episodes: -"
    e = episodes
    line = (
        f"episodes: {e['finished']} finished, {e['failed']} failed, {e['rerun']} rerun, {e['lost']} lost"
        f" (of {e['started']} started"
    )
    running = e["started"] - e["finished"] - e["failed"]
    line += f"; {running} stopped with the run)" if running > 0 else ")"
    if e["failed"] and e.get("first_error"):
        line += f"\n  first failed episode: {e['first_error']} (traceback: rz.log)"
    return line


def failed_note(metrics: dict[str, Any]) -> str:
    """The progress line's note on failed episodes so far ('' when none)."""
    failed = int(metrics.get("rollout_episodes_failed", 0) or 0)
    return f"  {failed} episodes failed" if failed else ""
