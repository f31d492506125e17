"""A pool of pre-started sandboxes so an episode never waits for an interpreter to boot."""

from __future__ import annotations

import threading
from collections import deque

from rz_agents.envs.python_tool.limits import SandboxLimits
from rz_agents.envs.python_tool.sandbox import PythonSandbox


class SandboxPool:
    """Keeps ``size`` sandboxes started ahead of use; each episode gets a fresh one.

    Sandboxes are never reused across episodes (no state can leak between them): ``release``
    closes the sandbox, and ``acquire`` starts a replacement in the background (starting is a
    non-blocking process spawn; the interpreter boots while the episode's first turn is generated).
    """

    def __init__(self, size: int = 4, limits: SandboxLimits | None = None, **sandbox_kwargs: object) -> None:
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        self.size = size
        self.limits = limits or SandboxLimits()
        self.sandbox_kwargs = sandbox_kwargs
        self._idle: deque[PythonSandbox] = deque()
        self._lock = threading.Lock()
        self._closed = False
        self._top_up()

    def _new(self) -> PythonSandbox:
        return PythonSandbox(self.limits, **self.sandbox_kwargs)  # type: ignore[arg-type]

    def _top_up(self) -> None:
        while True:
            with self._lock:
                if self._closed or len(self._idle) >= self.size:
                    return
            sandbox = self._new()
            with self._lock:
                if self._closed:
                    sandbox.close()
                    return
                self._idle.append(sandbox)

    def acquire(self) -> PythonSandbox:
        """A started sandbox for one episode (a new one if the pool is empty)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("SandboxPool.acquire() after close()")
            sandbox = self._idle.popleft() if self._idle else None
        if sandbox is None:
            sandbox = self._new()
        self._top_up()
        return sandbox

    def release(self, sandbox: PythonSandbox) -> None:
        """Give back a sandbox at the end of its episode (it is closed)."""
        sandbox.close()

    def close(self) -> None:
        """Close every idle sandbox; later ``acquire`` calls fail."""
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle), deque()
        for sandbox in idle:
            sandbox.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
