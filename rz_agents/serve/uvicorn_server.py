"""The uvicorn server an app runs under, with a time limit on a request's head.

uvicorn closes an idle keep-alive connection (``timeout_keep_alive``) but waits forever for the head of a
request: a client that connects and sends nothing, or a header a byte at a time, holds its connection (and
a file descriptor) for good. The protocol here closes a connection whose request head has not arrived
within ``header_timeout_s`` of the connection or of the previous response.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from rz_agents.serve.options import ServeOptions


class _HeadTimeoutProtocol(H11Protocol):
    header_timeout_s: float = 10.0

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        old = getattr(self, "_head_timer", None)
        if old is not None:
            old.cancel()
        self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(
            self.header_timeout_s, self._head_timed_out
        )

    def _head_timed_out(self) -> None:
        self._head_timer = None
        waiting_for_head = self.conn.their_state is h11.IDLE and (
            self.cycle is None or self.cycle.response_complete
        )
        if waiting_for_head and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)


def uvicorn_server(app, options: ServeOptions, port: int):
    """A ``uvicorn.Server`` for ``app`` on ``options.host:port`` with the options' idle and head timeouts."""
    import uvicorn

    protocol = type("RZHttpProtocol", (_HeadTimeoutProtocol,), {"header_timeout_s": options.header_timeout_s})
    config = uvicorn.Config(
        app,
        host=options.host,
        port=port,
        log_level="warning",
        lifespan="off",
        access_log=False,
        http=protocol,
        timeout_keep_alive=options.idle_timeout_s,
    )
    return uvicorn.Server(config)
