"""Reset a running desktop in place between episodes, with a verified clean state.

A fresh desktop costs Xvfb, a session bus, the accessibility bus, openbox, the in-VM server and
its helpers: seconds of CPU that dozens of desktops on one node pay again every episode. With
``LocalProvider(warm_reset=True)`` the provider keeps the desktop and, at the next ``start``:

1. kills every process of the desktop that was not part of it when it first came up (the
   task's apps, the agent's programs, their daemons); the desktop's own uid and the sandbox's
   PID namespace find them all, whatever they call themselves;
2. puts the home folder back to the copy taken when the desktop first came up, and removes what
   appeared since in its other writable places (``/tmp``, ``/dev/shm``, ``/run``, ``/var``);
3. verifies: exactly the first processes are alive, the home tree equals the copy (paths, sizes,
   file bytes), the other places hold exactly their first entries, no window is open, the
   pointer is back at the screen's centre. Any difference means a fresh desktop instead.

Only sandboxed desktops are reset in place (their writable places are all known); one without a
sandbox is always started afresh.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

INNER_PLACES = ("dev/shm", "run", "var")  # tmpfs of the sandbox, reached through /proc/PID/root
RESTARTABLE = ("dconf-service",)  # bus-activated helpers holding settings in memory: never kept


@dataclass
class Baseline:
    """What a desktop looked like when it first came up."""

    pids: set[int]
    home_copy: str  # a copy of the home folder, restored at each reset
    places: dict[str, set[str]] = field(default_factory=dict)  # host path -> its entries


def comm(pid: int) -> str:
    """The process's name (``/proc/PID/comm``, 15 characters at most), or "" when it is gone."""
    return _comm(pid)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def inner_root(pids: set[int]) -> str | None:
    """``/proc/PID/root`` of a process inside the sandbox (its own mount namespace), or None."""
    host_root = os.stat("/")
    for pid in sorted(pids):
        path = f"/proc/{pid}/root"
        try:
            st = os.stat(path)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) != (host_root.st_dev, host_root.st_ino):
            return path
    return None


def _entries(path: str) -> set[str]:
    try:
        return set(os.listdir(path))
    except OSError:
        return set()


def take_baseline(pids: list[int], home: str, tmp: str, copy_to: str) -> Baseline:
    """Record a freshly started desktop: its processes, a copy of its home, its places' entries."""
    kept = {p for p in pids if _comm(p) not in RESTARTABLE}
    shutil.copytree(home, copy_to, symlinks=True)
    places = {tmp: _entries(tmp)}
    root = inner_root(kept)
    if root is not None:
        for place in INNER_PLACES:
            places[os.path.join(root, place)] = _entries(os.path.join(root, place))
    return Baseline(kept, copy_to, places)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def kill_extra(current: list[int], baseline: Baseline) -> None:
    """SIGKILL every process of the desktop that is not in the baseline."""
    for pid in current:
        if pid not in baseline.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def kill_extra_until_gone(
    list_pids: Callable[[], list[int]], baseline: Baseline, timeout_s: float = 10.0
) -> None:
    """``kill_extra`` again while new processes appear, until only the baseline's are left or the time is up.

    One listing and its kill leave whatever was forked in between (a fork loop, a dying app's helper):
    each round lists the desktop's processes again and kills what is not in the baseline. ``verify``
    reports anything still left at the end."""
    deadline = time.monotonic() + timeout_s
    while True:
        current = list_pids()
        extra = set(current) - baseline.pids
        if not extra or time.monotonic() >= deadline:
            return
        kill_extra(current, baseline)
        wait_until_gone(extra, timeout_s=max(0.0, min(3.0, deadline - time.monotonic())))


def _remove_all_but(folder: str, rel: str, keep: tuple[str, ...]) -> None:
    """Remove everything in ``folder`` except the paths in ``keep`` (relative to the home)."""
    for name in os.listdir(folder):
        path_rel = os.path.join(rel, name)
        if path_rel in keep:
            continue
        path = os.path.join(folder, name)
        if any(k.startswith(path_rel + os.sep) for k in keep) and os.path.isdir(path):
            _remove_all_but(path, path_rel, keep)
        else:
            _remove(path)


def restore_files(baseline: Baseline, home: str, uid: int | None, keep: tuple[str, ...] = ()) -> None:
    """Home back to the baseline copy; other places back to their baseline entries.

    ``keep``: paths relative to the home left as they are (a kept browser's profile, which the
    browser holds open and ``chrome_keep.py`` cleans through the browser itself)."""
    _remove_all_but(home, "", keep)
    shutil.copytree(baseline.home_copy, home, symlinks=True, dirs_exist_ok=True)
    if uid is not None:
        os.lchown(home, uid, uid)
        for parent, dirs, files in os.walk(home):
            rel = os.path.relpath(parent, home)
            dirs[:] = [d for d in dirs if os.path.normpath(os.path.join(rel, d)) not in keep]
            for name in dirs + files:
                os.lchown(os.path.join(parent, name), uid, uid)
    for place, entries in baseline.places.items():
        for name in _entries(place) - entries:
            _remove(os.path.join(place, name))


def same_tree(a: str, b: str, skip: tuple[str, ...] = ()) -> str | None:
    """None when folders ``a`` and ``b`` hold the same paths, kinds, link targets and file bytes
    (``skip``: relative paths not compared)."""
    cmp = filecmp.dircmp(a, b)
    stack = [(cmp, "")]
    while stack:
        d, rel = stack.pop()
        odd = d.left_only + d.right_only + d.funny_files + d.common_funny
        diff = sorted(n for n in odd if os.path.join(rel, n) not in skip)
        if diff:
            return f"home differs at {os.path.join(rel, diff[0])}"
        _, mismatch, errors = filecmp.cmpfiles(d.left, d.right, d.common_files, shallow=False)
        if mismatch or errors:
            return f"home differs at {os.path.join(rel, (mismatch + errors)[0])}"
        for name, sub in d.subdirs.items():
            if os.path.join(rel, name) not in skip:
                stack.append((sub, os.path.join(rel, name)))
    return None


def verify(current: list[int], baseline: Baseline, home: str, skip: tuple[str, ...] = ()) -> str | None:
    """None when the desktop is back to its baseline (processes and files), else what differs
    (``skip``: home paths a kept browser holds; its processes are left out of ``current``)."""
    alive = set(current)
    if alive != baseline.pids:
        missing, extra = baseline.pids - alive, alive - baseline.pids
        if missing:
            return f"desktop processes died: {sorted(_comm(p) or p for p in missing)}"
        return f"processes survived the reset: {sorted(_comm(p) or p for p in extra)}"
    problem = same_tree(home, baseline.home_copy, skip)
    if problem:
        return problem
    for place, entries in baseline.places.items():
        now = _entries(place)
        if now != entries:
            return f"{place} holds {sorted(now ^ entries)[:3]} after the reset"
    return None


def wait_until_gone(pids: set[int], timeout_s: float = 3.0) -> None:
    """Wait until none of ``pids`` is alive (zombies count as gone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
