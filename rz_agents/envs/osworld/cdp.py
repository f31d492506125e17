"""A small synchronous DevTools client: one WebSocket to the browser, flat sessions to its targets.

For the few calls a reset makes (``chrome_keep.py``): Playwright's ``connect_over_cdp`` attaches
to and initialises every tab, which costs the host ~1 CPU-s a reset with dozens of desktops and
stalls on a tab that has an ``alert`` open. Events are read and dropped.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from typing import Any


class CdpError(RuntimeError):
    """A DevTools command failed or got no answer in time; the message names it."""


class CdpClient:
    """``send`` commands to the browser (or, with ``session``, to an attached target)."""

    def __init__(self, endpoint: str, timeout_s: float = 10.0) -> None:
        from websockets.sync.client import connect

        with urllib.request.urlopen(endpoint + "/json/version", timeout=timeout_s) as resp:
            url = json.load(resp)["webSocketDebuggerUrl"]
        # entered as a context manager (websockets >= 17.1 warns otherwise); ``close`` ends it
        self._ws = connect(url, max_size=None, open_timeout=timeout_s).__enter__()
        self._ids = itertools.count(1)

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout_s: float = 30.0,
    ) -> dict[str, Any]:
        """The command's result."""
        cid = next(self._ids)
        message: dict[str, Any] = {"id": cid, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._ws.send(json.dumps(message))
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError(f"{method}: no answer within {timeout_s:.0f}s")
            try:
                reply = json.loads(self._ws.recv(left))
            except TimeoutError:
                continue
            if reply.get("id") == cid:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})

    def attach(self, target_id: str) -> str:
        """A flat session on the target."""
        return self.send("Target.attachToTarget", {"targetId": target_id, "flatten": True})["sessionId"]

    def evaluate(self, session: str, expression: str, timeout_s: float = 30.0) -> Any:
        """The value of ``expression`` (promises awaited) in the target's page."""
        out = self.send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            session,
            timeout_s,
        )
        if "exceptionDetails" in out:
            raise CdpError(f"evaluate: {out['exceptionDetails'].get('text')}")
        return out["result"].get("value")

    def close(self) -> None:
        self._ws.close()

    def __enter__(self) -> CdpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
