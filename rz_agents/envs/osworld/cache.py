"""The input-file cache: where a task's downloads live so episodes run offline.

OSWorld tasks fetch their inputs from the web: ``download`` setup steps (files put into the
desktop) and ``cloud_file`` getters (gold files a metric compares against). ``rz osworld fetch``
downloads them once on a networked machine; the desktop, the evaluator and ``validate`` read them
here. The layout is OSWorld's own cache layout, so an existing OSWorld cache works as is:

- a ``download`` step's file: ``<cache>/<task_id>/<uuid5(URL)>_<basename(path)>`` (also found
  flat at ``<cache>/<uuid5(URL)>_<basename>``, for files shared by tasks);
- a ``cloud_file`` getter's file: ``<cache>/<task_id>/<dest>``.

``<cache>`` is ``$RZ_OSWORLD_CACHE`` or ``~/.cache/rz_agents/osworld`` unless given.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any

from rz_agents.envs.osworld.task import Task

LOCAL_SCHEMES = ("file", "data", "about", "chrome", "chrome-extension", "view-source")
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def default_cache_dir() -> str:
    """``$RZ_OSWORLD_CACHE`` or ``~/.cache/rz_agents/osworld``."""
    return os.environ.get("RZ_OSWORLD_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "rz_agents", "osworld"
    )


def is_local_url(url: str) -> bool:
    """True for URLs that need no network: ``file:``, ``data:``, ``about:``, ``chrome:``, loopback HTTP."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in LOCAL_SCHEMES:
        return True
    if parsed.scheme in ("http", "https"):
        return (parsed.hostname or "") in LOCAL_HOSTS
    return False


def download_paths(cache_dir: str, task_id: str, url: str, path: str) -> list[str]:
    """Where a ``download`` step's file may sit in the cache, in lookup order (the first is canonical)."""
    name = f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{os.path.basename(path)}"
    return [os.path.join(cache_dir, task_id, name), os.path.join(cache_dir, name)]


def cloud_file_path(cache_dir: str, task_id: str, dest: str) -> str:
    """Where a ``cloud_file`` getter's file sits in the cache."""
    return os.path.join(cache_dir, task_id, os.path.basename(dest))


def first_existing(paths: list[str]) -> str | None:
    """The first of ``paths`` that is a file, or None."""
    return next((p for p in paths if os.path.isfile(p)), None)


@dataclass(frozen=True)
class RemoteInput:
    """One file a task needs from the web: its URL and where it goes in the cache."""

    url: str
    cache_path: str
    kind: str  # "download" (setup step) or "cloud_file" (evaluator getter)

    def lookup(self, cache_dir: str) -> str | None:
        """The cached copy, or None."""
        if self.kind == "download":  # also the flat layout, for files shared by tasks
            return first_existing(
                [self.cache_path, os.path.join(cache_dir, os.path.basename(self.cache_path))]
            )
        return first_existing([self.cache_path])


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def cloud_file_items(getter: dict[str, Any]) -> list[tuple[str, str]]:
    """``(url, dest)`` pairs of a ``cloud_file`` getter config (``multi`` lists or single values)."""
    paths, dests = _as_list(getter.get("path")), _as_list(getter.get("dest"))
    if getter.get("multi") or isinstance(getter.get("path"), list):
        return [(str(p), str(d)) for p, d in zip(paths, dests, strict=False)]
    return [(str(getter.get("path")), str(getter.get("dest") or os.path.basename(str(getter.get("path")))))]


def remote_inputs(task: Task, cache_dir: str) -> list[RemoteInput]:
    """Every remote file the task's setup, postconfig and evaluator read (local URLs excluded)."""
    out: list[RemoteInput] = []
    for step in [*task.config, *task.evaluator.postconfig]:
        if step.type != "download":
            continue
        for item in step.parameters.get("files", []) or []:
            url, path = str(item.get("url", "")), str(item.get("path", ""))
            if url and not is_local_url(url):
                out.append(RemoteInput(url, download_paths(cache_dir, task.id, url, path)[0], "download"))
    for getter in [*task.evaluator.results, *task.evaluator.expected]:
        if getter and getter.get("type") == "cloud_file":
            for url, dest in cloud_file_items(getter):
                if not is_local_url(url):
                    out.append(RemoteInput(url, cloud_file_path(cache_dir, task.id, dest), "cloud_file"))
    return out


def missing_inputs(task: Task, cache_dir: str) -> list[RemoteInput]:
    """The task's remote inputs not in the cache."""
    return [r for r in remote_inputs(task, cache_dir) if r.lookup(cache_dir) is None]
