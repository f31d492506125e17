"""A watchdog on the run loop: no progress for a while is an error with a stack dump, never a silent hang.

Progress is whatever the runtime's ``progress`` callable returns (engine steps, episode events, learner
steps); the watchdog only compares successive values. It polls from its own thread, so it also notices a
blocked event loop: the stacks of every thread are logged at once. The asyncio tasks' stacks (where each
coroutine waits: the informative part when the loop is idle) are added by a callback in the loop, which
then cancels the watched task; the runtime turns that cancellation into ``RunStalled``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable
from pathlib import Path

log = logging.getLogger(__name__)


class RunStalled(RuntimeError):
    """The run made no progress for ``watchdog_s`` seconds."""


def thread_stacks() -> str:
    """The current stack of every Python thread."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(
            f"--- thread {names.get(ident, '?')} ({ident})\n" + "".join(traceback.format_stack(frame))
        )
    return "\n".join(parts)


def task_stacks(loop: asyncio.AbstractEventLoop) -> str:
    """Where each asyncio task of ``loop`` waits: its chain of awaits, outermost first (call from the
    loop)."""
    parts = []
    for task in asyncio.all_tasks(loop):
        lines = [f"--- task {task.get_name()}"]
        awaited = task.get_coro()
        while awaited is not None:  # coroutine -> the coroutine it awaits -> ... -> a future
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                lines.append(f"  awaiting {awaited!r}"[:300])
                break
            code = frame.f_code
            lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        parts.append("\n".join(lines))
    return "\n".join(parts)


class Watchdog:
    """Cancels ``task`` with a ``RunStalled`` reason when ``progress()`` has not changed for ``timeout_s``."""

    def __init__(
        self,
        timeout_s: float,
        progress: Callable[[], Hashable],
        describe: Callable[[], str],
        dump_path: str | Path | None = None,
        poll_s: float | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.progress = progress
        self.describe = describe
        self.dump_path = Path(dump_path) if dump_path else None
        self.poll_s = poll_s if poll_s is not None else min(max(timeout_s / 20, 0.05), 5.0)
        self.error: RunStalled | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, task: asyncio.Task) -> None:
        """Watch from a daemon thread; on a stall, cancel ``task`` (whose loop is the running one)."""
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._watch, args=(loop, task), name="rz-watchdog", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the thread ends within one poll)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.poll_s * 4 + 1)

    def _watch(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task) -> None:
        last, since = self.progress(), time.monotonic()
        while not self._stop.wait(self.poll_s):
            now_value = self.progress()
            if now_value != last:
                last, since = now_value, time.monotonic()
                continue
            idle = time.monotonic() - since
            if idle < self.timeout_s:
                continue
            message = (
                f"no progress for {idle:.0f} s (watchdog_s={self.timeout_s:g}: no engine step, episode event "
                f"or learner step); {self.describe()}"
            )
            threads = thread_stacks()
            log.error("%s\nthread stacks:\n%s", message, threads)
            try:
                loop.call_soon_threadsafe(self._fire, loop, task, message, threads)
            except RuntimeError:  # the loop is closed: the run ended meanwhile
                pass
            return

    def _fire(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task, message: str, threads: str) -> None:
        if self._stop.is_set() or task.done():
            return
        tasks = task_stacks(loop)
        dump = f"{message}\n\nasyncio tasks:\n{tasks}\n\nthread stacks:\n{threads}"
        if self.dump_path is not None:
            try:
                self.dump_path.parent.mkdir(parents=True, exist_ok=True)
                self.dump_path.write_text(dump)
                message += f"; stacks written to {self.dump_path}"
            except OSError as e:  # the error itself matters more than its dump file
                message += f"; could not write the stacks to {self.dump_path}: {e}"
        log.error("asyncio tasks:\n%s", tasks)
        self.error = RunStalled(message)
        task.cancel()
