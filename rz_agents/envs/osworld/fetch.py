"""Fill the input-file cache: download every remote file a task set needs, once (``rz osworld fetch``).

Run on a networked machine; copy the cache folder to machines without internet. Each file is
written atomically (a partial download never looks cached), files already cached are skipped,
and a failure is reported per file without stopping the others. Google Drive's "cannot scan
this file for viruses" page is answered with its confirmation link.
"""

from __future__ import annotations

import html
import os
import re
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rz_agents.envs.osworld.cache import RemoteInput, remote_inputs
from rz_agents.envs.osworld.task import Task, load_tasks

USER_AGENT = "rz-agents-osworld-fetch/1"
_DRIVE_HOSTS = ("drive.google.com", "drive.usercontent.google.com", "docs.google.com")


class FetchError(RuntimeError):
    """A file could not be downloaded; the message says why."""


@dataclass
class FetchReport:
    """What ``fetch_inputs`` did: files downloaded, already cached, and failures (url -> reason)."""

    fetched: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    tasks: int = 0


def _open(url: str, timeout: float) -> tuple[bytes, str]:
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read(), resp.headers.get("Content-Type", "")


def _drive_confirmation(page: str, url: str) -> str | None:
    """The download link behind Google Drive's virus-scan warning page, if this is one."""
    form = re.search(r'<form[^>]+action="([^"]+)"', page)
    inputs = dict(re.findall(r'<input[^>]+name="([^"]+)"[^>]+value="([^"]*)"', page))
    if form and inputs:
        return html.unescape(form.group(1)) + "?" + urllib.parse.urlencode(inputs)
    m = re.search(r"confirm=([0-9A-Za-z_-]+)", page)
    if m:
        sep = "&" if "?" in url else "?"
        return f"{url}{sep}confirm={m.group(1)}"
    return None


def download(url: str, timeout: float = 300.0) -> bytes:
    """The bytes at ``url``, following Google Drive's confirmation page; ``FetchError`` on failure."""
    try:
        data, ctype = _open(url, timeout)
        if "text/html" in ctype and (urllib.parse.urlparse(url).hostname or "") in _DRIVE_HOSTS:
            confirm = _drive_confirmation(data.decode("utf-8", "replace"), url)
            if confirm is None:
                raise FetchError(f"{url}: Google Drive answered with a page, not the file (access denied?)")
            data, _ = _open(confirm, timeout)
    except OSError as exc:
        raise FetchError(f"{url}: {exc}") from exc
    return data


def store(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (parents created)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def fetch_inputs(
    tasks_path: str | Path,
    cache_dir: str,
    jobs: int = 4,
    timeout: float = 300.0,
    on_file: Callable[[str, str], None] | None = None,
) -> FetchReport:
    """Download every uncached remote input of the tasks at ``tasks_path`` into ``cache_dir``.

    ``on_file(status, url)`` is called per file (``fetched``/``cached``/``failed``).
    """
    report = FetchReport()
    todo: list[RemoteInput] = []
    seen: set[str] = set()
    for _path, task in load_tasks(tasks_path):
        if not isinstance(task, Task):
            continue
        report.tasks += 1
        for item in remote_inputs(task, cache_dir):
            if item.cache_path in seen:
                continue
            seen.add(item.cache_path)
            if item.lookup(cache_dir):
                report.cached.append(item.url)
                if on_file:
                    on_file("cached", item.url)
            else:
                todo.append(item)

    def one(item: RemoteInput) -> None:
        try:
            store(item.cache_path, download(item.url, timeout))
        except (FetchError, OSError) as exc:
            report.failed[item.url] = str(exc)
            status = "failed"
        else:
            report.fetched.append(item.url)
            status = "fetched"
        if on_file:
            on_file(status, item.url)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, todo))
    return report
