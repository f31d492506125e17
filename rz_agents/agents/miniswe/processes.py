"""mini-swe-agent's process, killable from the episode that started it.

The episode's coroutine runs ``mini`` in an executor thread. If the episode is cancelled (a stopping run), the
thread must not keep waiting up to ``timeout_s``: ``EpisodeChildren.kill_all`` kills every child's process
group (litellm's helpers included) and marks the set cancelled, so a child the thread starts *after* the
cancellation (the thread had not reached ``Popen`` yet) is killed as it is added, and ``run_killable`` refuses
to start one at all once the set is cancelled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path


class Cancelled(subprocess.SubprocessError):
    """The episode was cancelled before its process started: nothing was run."""


class EpisodeChildren:
    """The child processes of one episode, and whether the episode was cancelled (thread-safe)."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self.cancelled = False

    def add(self, proc: subprocess.Popen) -> None:
        """Track ``proc``; kill it at once if the episode was cancelled meanwhile."""
        with self._lock:
            if not self.cancelled:
                self._procs.append(proc)
                return
        kill_process_groups([proc])

    def discard(self, proc: subprocess.Popen) -> None:
        with self._lock:
            if proc in self._procs:
                self._procs.remove(proc)

    def kill_all(self) -> None:
        """Cancel the episode: kill every child's group now, and any child added later as it is added."""
        with self._lock:
            self.cancelled = True
            procs = list(self._procs)
        kill_process_groups(procs)

    def __len__(self) -> int:
        with self._lock:
            return len(self._procs)


def kill_process_groups(children: Iterable[subprocess.Popen] | EpisodeChildren) -> None:
    """SIGKILL each still-running child's process group (its own session: nothing else is in it); given an
    ``EpisodeChildren``, cancel it (children started later are killed too)."""
    if isinstance(children, EpisodeChildren):
        children.kill_all()
        return
    for proc in list(children):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_killable(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    timeout_s: float,
    children: EpisodeChildren | list | None = None,
) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a process group of its own, tracked in ``children`` while it runs, so a
    cancelled episode can kill it (and litellm's helpers) at once (``kill_process_groups``); past
    ``timeout_s`` the whole group is killed and TimeoutExpired raised. Raises ``Cancelled`` without starting
    anything if ``children`` was already cancelled."""
    if isinstance(children, EpisodeChildren) and children.cancelled:
        raise Cancelled("the episode was cancelled before mini-swe-agent started")
    proc = subprocess.Popen(
        argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    if isinstance(children, EpisodeChildren):
        children.add(proc)  # killed here if the episode was cancelled between the check and Popen
    elif children is not None:
        children.append(proc)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_process_groups([proc])
        proc.communicate()
        raise
    finally:
        if isinstance(children, EpisodeChildren):
            children.discard(proc)
        elif children is not None and proc in children:
            children.remove(proc)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
