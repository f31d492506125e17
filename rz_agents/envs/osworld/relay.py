"""A byte relay between two socket worlds: TCP loopback on one side, a Unix socket on the other.

The sandboxed desktop has its own network namespace (loopback only), so the host cannot reach
the desktop's TCP ports and the desktop cannot reach the host's. A Unix socket in a folder both
see is the one door: inside, the desktop's server listens on it directly and a ``Relay`` carries
``cdp.sock`` to Chromium's DevTools port; outside, ``Relay``s expose both sockets on host loopback
ports, so the host's HTTP client and Playwright connect as if the desktop were local.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable

CHUNK = 1 << 16


def tcp_listener(port: int = 0) -> socket.socket:
    """A listening TCP socket on ``127.0.0.1:port`` (0: the OS picks)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(64)
    return s


def unix_listener(path: str) -> socket.socket:
    """A listening Unix socket at ``path`` (a stale file there is replaced)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(64)
    return s


def connect_unix(path: str) -> Callable[[], socket.socket]:
    """A connector to the Unix socket at ``path``."""

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
        except OSError:
            s.close()
            raise
        return s

    return connect


def connect_tcp(port: int) -> Callable[[], socket.socket]:
    """A connector to ``127.0.0.1:port``."""
    return lambda: socket.create_connection(("127.0.0.1", port), timeout=10)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends, then pass the end on (half-close)."""
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass  # either side went away: the other pump sees it too
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class Relay:
    """Accept on ``listener``; pipe each connection both ways to a fresh ``connect()`` socket.

    One thread accepts; each connection gets two short-lived pump threads. A connection whose
    target cannot be reached is closed at once (the client sees the refusal as an ended stream).
    """

    def __init__(self, listener: socket.socket, connect: Callable[[], socket.socket], name: str) -> None:
        self.listener = listener
        self.connect = connect
        self.name = name
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name=f"relay-{name}", daemon=True)

    @property
    def port(self) -> int:
        """The TCP port of the listener (TCP listeners only)."""
        return self.listener.getsockname()[1]

    def start(self) -> Relay:
        """Start accepting; returns self."""
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # listener closed
            threading.Thread(
                target=self._serve, args=(client,), name=f"relay-{self.name}-c", daemon=True
            ).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = self.connect()
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        client.close()
        upstream.close()

    def close(self) -> None:
        """Stop accepting (open connections end when either side closes)."""
        self._closed.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
