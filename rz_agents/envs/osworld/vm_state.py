"""What every getter reads through: the desktop's files and commands (the in-VM server) and the live
browser (CDP). getters.py and getters_more.py both build on these (and getters.py lists them as getters)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rz_agents.envs.osworld.context import EpisodeContext


def get_vm_command_line(ctx: EpisodeContext, config: dict[str, Any]) -> str | None:
    """The standard output of a command run in the desktop."""
    result = ctx.client.execute(config["command"], shell=bool(config.get("shell", False)))
    return result.get("output") if result.get("status") == "success" else None


def get_vm_command_error(ctx: EpisodeContext, config: dict[str, Any]) -> str | None:
    """The standard error of a command run in the desktop."""
    result = ctx.client.execute(config["command"], shell=bool(config.get("shell", False)))
    return result.get("error")


def given(paths: list[str | None], config: dict[str, Any]) -> str | list[str | None] | None:
    """OSWorld's ``gives``: the indices handed to the metric (default ``[0]``); one path, or a list."""
    gives = config.get("gives", [0])
    picked = [paths[i] for i in gives if i < len(paths)]
    return picked[0] if len(picked) == 1 else picked


def paths_and_dests(config: dict[str, Any]) -> list[tuple[str, str]]:
    paths = config["path"] if isinstance(config["path"], list) else [config["path"]]
    dests = config.get("dest")
    dests = dests if isinstance(dests, list) else [dests] * len(paths)
    if len(dests) != len(paths):
        dests = [None] * len(paths)
    return [(str(p), os.path.basename(str(d or p))) for p, d in zip(paths, dests, strict=True)]


def get_vm_file(ctx: EpisodeContext, config: dict[str, Any]) -> str | list[str | None] | None:
    """Copy a file (or, with ``multi``, several) out of the desktop into the evaluation folder.

    Each lands as ``<work_dir>/<dest>`` (siblings matter: a metric may look for ``<name>-Sheet1.csv``
    next to ``<name>.xlsx``); the metric gets the path(s) picked by ``gives``, None for a missing file.
    """
    out: list[str | None] = []
    for path, dest in paths_and_dests(config):
        data = ctx.client.get_file(path)
        if data is None:
            out.append(None)
            continue
        local = os.path.join(ctx.work_dir, dest)
        with open(local, "wb") as f:
            f.write(data)
        out.append(local)
    return given(out, config)


def chrome_call(ctx: EpisodeContext, fn: Callable[[Any], Any]) -> Any:
    """Run ``fn`` on the browser; None when Chrome is not running (nothing to read)."""
    import urllib.request

    try:
        with urllib.request.urlopen(ctx.chrome.endpoint + "/json/version", timeout=1):
            pass
    except OSError:
        return None
    return ctx.chrome.call(fn, timeout_s=60)
