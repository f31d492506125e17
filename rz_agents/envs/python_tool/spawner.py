"""One long-lived thread per process that starts every sandbox and desktop process.

Linux ties a child's parent-death signal (``PR_SET_PDEATHSIG``, which bubblewrap's
``--die-with-parent`` and the unsandboxed worker use) to the *thread* that forked it, not to the
process: a sandbox started on a ``ThreadPoolExecutor`` thread is killed the moment that thread
exits, although its owner (the env, the process) is still alive. Running every start on one
thread that lives as long as the process keeps both halves of the contract: a sandbox survives
the exit of whichever thread asked for it, and still dies with the process (when the process
dies, so does this thread, and the kernel sends the signal).

The thread only forks/execs; waiting for the child's ready line and talking to it stay on the
caller's thread. After ``os.fork`` the child process gets a thread of its own on first use.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_thread: threading.Thread | None = None
_jobs: queue.SimpleQueue | None = None


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        fn, args, kwargs, done = jobs.get()
        if not done.set_running_or_notify_cancel():
            continue
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who re-raises it
            done.set_exception(exc)


def _ensure_thread() -> queue.SimpleQueue:
    global _thread, _jobs
    with _lock:
        if _thread is None or not _thread.is_alive():
            _jobs = queue.SimpleQueue()
            _thread = threading.Thread(target=_serve, args=(_jobs,), name="rz-spawner", daemon=True)
            _thread.start()
        return _jobs


def _forget_after_fork() -> None:
    global _thread, _jobs, _lock
    _thread, _jobs, _lock = None, None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def spawner_thread() -> threading.Thread:
    """The process's spawner thread (started on first use)."""
    _ensure_thread()
    return _thread  # type: ignore[return-value]


def on_spawner(fn: Callable[..., T], *args, **kwargs) -> T:
    """Run ``fn(*args, **kwargs)`` on the process's spawner thread and return (or raise) its result.

    Use it for the call that forks a child whose life must not depend on the calling thread
    (``subprocess.Popen``, ``posix_spawn``). Called from the spawner thread itself, ``fn`` runs
    directly.
    """
    jobs = _ensure_thread()
    if threading.current_thread() is _thread:
        return fn(*args, **kwargs)
    done: Future = Future()
    jobs.put((fn, args, kwargs, done))
    return done.result()
