"""A graceful stop: SIGINT / SIGTERM asks a run to stop at the next learner-step boundary and save there.

``StopRequest`` is the flag the training loop watches (``TrainLoop.train(stop=...)``): once it is set the loop
trains no further step (a step already running finishes; a wait for the next batch ends at once), writes the
checkpoint the periodic one would write at that step, and returns. ``StopSignals`` sets it from the
first SIGINT or SIGTERM; a second one aborts at once as if no handler were there (SIGINT: KeyboardInterrupt,
SIGTERM: the default action, death by the signal). Code that is not in the loop (the warm start) calls
``raise_if_requested`` between its steps: ``RunStopped`` ends it without writing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunStopped(Exception):
    """A stop was requested where the run has nothing to save (before its first learner step)."""

    def __init__(self, signum: int | None, where: str) -> None:
        self.signum, self.where = signum, where
        super().__init__(f"stopped by {signal_name(signum)} {where}")


def signal_name(signum: int | None) -> str:
    """``SIGTERM`` for 15; ``a stop request`` when no signal asked (a caller's ``request()``)."""
    if signum is None:
        return "a stop request"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def stop_exit_status(signum: int | None) -> int:
    """The exit status of a run that stopped gracefully: 128 + the signal (130 SIGINT, 143 SIGTERM), as a
    shell reports a process the signal ended, so a job scheduler sees the run did not finish; 0 without
    one."""
    return 128 + signum if signum else 0


class StopRequest:
    """A request to stop at the next learner-step boundary; ``request`` may be called from a signal handler
    or another thread, ``wait`` is awaited in the event loop that trains."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._requested = threading.Event()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._lock = threading.Lock()

    @property
    def requested(self) -> bool:
        """Whether a stop was requested."""
        return self._requested.is_set()

    def request(self, signum: int | None = None) -> None:
        """Ask the run to stop (``signum``: the signal that asked, for the message and the exit status)."""
        if self.requested:
            return
        self.signum = signum
        self._requested.set()
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:  # wake the loops waiting (thread-safe: a handler may run anywhere)
            with contextlib.suppress(RuntimeError):  # that loop is closed: nothing waits there any more
                loop.call_soon_threadsafe(event.set)

    async def wait(self) -> None:
        """Return once a stop is requested."""
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.append(entry)
        try:
            if not self.requested:  # (a request between the check and the append still sets the event)
                await event.wait()
        finally:
            with self._lock:
                self._waiters.remove(entry)

    def raise_if_requested(self, where: str) -> None:
        """``RunStopped`` if a stop was requested (``where``: e.g. "during the warm start")."""
        if self.requested:
            raise RunStopped(self.signum, where)


class StopSignals:
    """``with StopSignals(stop):`` the first SIGINT or SIGTERM calls ``stop.request`` and says so on stderr
    (one line starting with ``prog``), a second aborts at once. The previous handlers come back on leaving.
    Main thread only (Python's rule for signal handlers); elsewhere it installs nothing."""

    def __init__(self, stop: StopRequest, prog: str = "rz train") -> None:
        self.stop, self.prog = stop, prog
        self._previous: dict[int, object] = {}
        self._installed = False

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
            self._installed = True
            self.claim()
        return self

    def claim(self) -> None:
        """Install the handlers again: a library started inside replaced one (``ray.init`` sets a SIGTERM
        handler of its own that exits at once)."""
        if self._installed:
            for s in STOP_SIGNALS:
                signal.signal(s, self._on_signal)

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        """Put the previous handlers back (also before leaving the ``with``, once nothing is left to stop)."""
        if self._installed:
            for s, handler in self._previous.items():
                signal.signal(s, handler)
            self._installed = False

    def _on_signal(self, signum: int, frame) -> None:
        if self.stop.requested:
            self._abort(signum)
            return
        self.stop.request(signum)
        line = (
            f"\n{self.prog}: {signal_name(signum)} received: stopping at the next learner-step boundary and "
            "saving a checkpoint there (send it again to abort at once, without saving)\n"
        )
        # os.write, not print: the handler may run while the main thread is inside a write to stderr
        with contextlib.suppress(OSError):
            os.write(2, line.encode())

    def _abort(self, signum: int) -> None:
        """What the signal would have done without us: SIGINT raises KeyboardInterrupt, SIGTERM ends the
        process by the signal."""
        self.release()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
