"""What PythonSandbox needs from a backend: a byte pipe to the worker with deadlines, and a kill."""

from __future__ import annotations

import json
from typing import Any

from rz_agents.envs.python_tool.worker import HEADER

MAX_FRAME = 64 << 20  # a result larger than this is a protocol violation by the sandboxed code


class WorkerGone(Exception):
    """The worker closed its end, died, or broke the protocol."""


class DeadlineExceeded(Exception):
    """No complete reply before the deadline."""


class Transport:
    """A started worker. Backends implement ``send``, ``recv``, ``kill`` and the diagnostics."""

    sandboxed = True

    def send(self, data: bytes) -> None:
        """Write all of ``data`` to the worker (raises WorkerGone)."""
        raise NotImplementedError

    def recv(self, n: int, deadline: float, watch: bool = True) -> bytes:
        """Read exactly ``n`` bytes before ``deadline`` (time.monotonic); raises
        WorkerGone / DeadlineExceeded.

        ``watch``: enforce the session-wide resource checks while waiting (off during startup).
        """
        raise NotImplementedError

    def kill(self) -> None:
        """Kill the worker and everything it started; safe to call twice."""
        raise NotImplementedError

    def exit_description(self) -> str:
        """How the worker ended, for error messages."""
        return "exited"

    def has_exited(self) -> bool:
        """Whether the worker is known to have ended (False when the backend cannot tell without a call)."""
        return False

    def stderr_tail(self, limit: int = 2000) -> str:
        """What the worker wrote to its stderr before redirecting it (startup errors)."""
        return ""

    def send_frame(self, obj: dict[str, Any]) -> None:
        """Send one length-prefixed JSON message."""
        body = json.dumps(obj).encode()
        self.send(HEADER.pack(len(body)) + body)

    def recv_frame(self, deadline: float, watch: bool = True) -> dict[str, Any]:
        """Read one length-prefixed JSON message; anything malformed is WorkerGone."""
        (size,) = HEADER.unpack(self.recv(HEADER.size, deadline, watch))
        if size > MAX_FRAME:
            raise WorkerGone(f"protocol violation: {size}-byte message")
        try:
            obj = json.loads(self.recv(size, deadline, watch))
        except ValueError as exc:
            raise WorkerGone(f"protocol violation: {exc}") from exc
        if not isinstance(obj, dict):
            raise WorkerGone("protocol violation: message is not an object")
        return obj
