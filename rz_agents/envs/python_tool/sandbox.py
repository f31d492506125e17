"""``PythonSandbox``: a persistent, resource-limited Python session per episode.

The session is a long-lived worker process (see worker.py) started at construction, so the
interpreter boots while the caller does something else; ``run`` then costs a pipe round trip.
A call that breaks a limit returns an error result; if the worker died or had to be killed the
session is restarted (its state is lost, and the result says so).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from rz_agents.envs.python_tool.limits import SandboxLimits
from rz_agents.envs.python_tool.local import LocalWorker, local_launch
from rz_agents.envs.python_tool.transport import DeadlineExceeded, Transport, WorkerGone


@dataclass
class SandboxResult:
    """The outcome of one ``PythonSandbox.run`` call."""

    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # None on success, else a short message ("ZeroDivisionError: ...")
    timed_out: bool = False
    duration_s: float = 0.0  # host-side round trip
    restarted: bool = False  # the session died or was killed; variables are gone
    # The session was already dead when the call was sent: nothing of the policy's was running (background
    # threads end a call with a restart, processes it started are killed after each call), so the
    # infrastructure lost it (host OOM killer, preemption, an operator). The env reports it as an
    # infrastructure failure; a death while the code runs is the code's (its limits kill it the same way).
    lost: bool = False

    @property
    def ok(self) -> bool:
        """True when the code ran to completion without an exception."""
        return self.error is None


class SandboxError(RuntimeError):
    """The sandbox could not be started."""


class PythonSandbox:
    """A persistent Python session in a sandbox: variables and imports survive between calls.

    ``PythonSandbox()`` gives the safe defaults of :class:`SandboxLimits` and the ``local``
    (bubblewrap) backend. The worker starts immediately in the background; the first ``run``
    waits for it. Use as a context manager or call ``close()``.

    >>> with PythonSandbox() as sb:
    ...     sb.run("x = 6*7")
    ...     print(sb.run("x").stdout)   # '42\\n'
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        backend: str = "local",
        allow_unsandboxed: bool = False,
        docker_image: str | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        if backend not in ("local", "docker"):
            raise ValueError(f"backend must be 'local' or 'docker', got {backend!r}")
        self.backend = backend
        self.allow_unsandboxed = allow_unsandboxed
        self.docker_image = docker_image
        self.restarts = 0
        self.calls = 0
        self._lock = threading.Lock()
        self._worker: Transport | None = None
        self._ready = False
        self._closed = False
        self._spawn()

    # --- lifecycle ------------------------------------------------------------------------------
    def _spawn(self) -> None:
        if self.backend == "docker":
            from rz_agents.envs.python_tool.docker_backend import DockerWorker

            self._worker = DockerWorker(self.limits, image=self.docker_image)
        else:
            self._worker = LocalWorker(
                local_launch(self.limits, self.allow_unsandboxed), self.limits.session_memory_bytes
            )
        self._ready = False

    @property
    def sandboxed(self) -> bool:
        """False only in the explicitly allowed unsandboxed fallback."""
        return self._worker.sandboxed

    def _wait_ready(self) -> None:
        if self._ready:
            return
        deadline = time.monotonic() + self.limits.startup_timeout_s
        try:
            hello = self._worker.recv_frame(deadline, watch=False)
        except (WorkerGone, DeadlineExceeded) as exc:
            detail = self._worker.stderr_tail()
            self._worker.kill()
            raise SandboxError(f"the sandbox failed to start ({exc}): {detail or 'no output'}") from None
        if not hello.get("ready"):
            self._worker.kill()
            raise SandboxError(f"the sandbox sent an unexpected greeting: {hello!r:.200}")
        self._ready = True

    def restart(self) -> None:
        """Kill the session and start a fresh one (all state is lost)."""
        with self._lock:
            self._restart()

    def _restart(self) -> None:
        self._worker.kill()
        self.restarts += 1
        self._spawn()

    def close(self) -> None:
        """Kill the worker and free everything; safe to call twice."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._worker.kill()

    def __enter__(self) -> PythonSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed and self._worker is not None:
                self._worker.kill()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # --- calls ------------------------------------------------------------------------------------
    def run(self, code: str, timeout_s: float | None = None) -> SandboxResult:
        """Run ``code`` in the session and return its output; never raises for bad code.

        The value of a trailing expression is printed (as in a notebook). ``timeout_s`` overrides
        the per-call wall limit.
        """
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        wall = float(timeout_s if timeout_s is not None else self.limits.wall_s)
        if not wall > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        with self._lock:
            if self._closed:
                raise RuntimeError("PythonSandbox.run() after close()")
            self._wait_ready()
            self.calls += 1
            start = time.monotonic()
            try:
                if self._worker.has_exited():  # dead before the call: its pipe may still take the frame
                    raise WorkerGone(self._worker.exit_description())
                self._worker.send_frame({"code": code, "timeout_s": wall})
            except WorkerGone as exc:
                self._restart()
                return SandboxResult(
                    error=f"SandboxError: the Python session was gone before the call ({exc}); "
                    "it was restarted and its variables are lost",
                    duration_s=time.monotonic() - start,
                    restarted=True,
                    lost=True,
                )
            try:
                reply = self._worker.recv_frame(start + wall + self.limits.grace_s)
            except DeadlineExceeded:
                self._restart()
                return SandboxResult(
                    error=f"TimeoutError: the call exceeded {wall:g} s of wall time and was killed; "
                    "the session was restarted and its variables are lost",
                    timed_out=True,
                    duration_s=time.monotonic() - start,
                    restarted=True,
                )
            except WorkerGone as exc:
                how = self._worker.exit_description() if str(exc) == "end of file" else str(exc)
                self._restart()
                return SandboxResult(
                    error=f"SandboxError: the Python session died ({how}); "
                    "it was restarted and its variables are lost",
                    duration_s=time.monotonic() - start,
                    restarted=True,
                )
            result = SandboxResult(
                stdout=str(reply.get("stdout", "")),
                stderr=str(reply.get("stderr", "")),
                error=None if reply.get("error") is None else str(reply["error"]),
                timed_out=bool(reply.get("timed_out", False)),
                duration_s=time.monotonic() - start,
            )
            if reply.get("threads_left"):
                # a thread still running would keep burning CPU and writing output between calls
                self._restart()
                result.restarted = True
                note = "background threads were still running after the call; the session was restarted"
                result.stderr = (result.stderr + "\n" + note).lstrip("\n")
            return result
