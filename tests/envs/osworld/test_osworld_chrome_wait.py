"""Waiting for Chrome's DevTools port: past the first timeout only while its process runs.

A real HTTP endpoint stands in for Chromium's ``/json/version`` (opened late, or never); the
process probe is the function the desktop env passes (``DesktopEnv._browser_probe``, exercised on
a real desktop in test_osworld_desktop.py).
"""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from rz_agents.envs.osworld.chrome import ChromeLink
from rz_agents.envs.osworld.client import VMClient
from rz_agents.envs.osworld.context import EpisodeContext
from rz_agents.envs.osworld.setup_steps import SetupError, wait_for_chrome


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ctx(port: int, running) -> EpisodeContext:
    return EpisodeContext(
        client=VMClient("http://127.0.0.1:9"),
        chrome=ChromeLink(port),
        task_id="t",
        download_cache="/nonexistent",
        work_dir="/nonexistent",
        browser_running=running,
    )


class _Version(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the handler's name is http.server's
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


def _serve_after(port: int, delay_s: float) -> http.server.HTTPServer:
    server = http.server.HTTPServer(("127.0.0.1", port), _Version)
    server.socket.close()  # reopened after the delay: until then the port refuses, as a starting Chromium's

    def later() -> None:
        time.sleep(delay_s)
        server.socket = socket.create_server(("127.0.0.1", port))
        server.serve_forever(poll_interval=0.05)

    threading.Thread(target=later, daemon=True).start()
    return server


def test_a_running_chromium_gets_past_the_first_timeout():
    port = _free_port()
    server = _serve_after(port, 1.5)
    t0 = time.monotonic()
    try:
        wait_for_chrome(_ctx(port, lambda: True), timeout_s=0.5, running_cap_s=10)
    finally:
        server.shutdown()
    assert 1.4 < time.monotonic() - t0 < 8


def test_no_running_chromium_fails_at_the_first_timeout_and_says_so():
    t0 = time.monotonic()
    with pytest.raises(SetupError, match=r"within \ds \(no Chromium of the episode is running\)"):
        wait_for_chrome(_ctx(_free_port(), lambda: False), timeout_s=0.5, running_cap_s=10)
    assert time.monotonic() - t0 < 3


def test_a_running_chromium_that_never_answers_fails_at_the_cap():
    t0 = time.monotonic()
    with pytest.raises(SetupError, match=r"its process runs but does not answer"):
        wait_for_chrome(_ctx(_free_port(), lambda: True), timeout_s=0.3, running_cap_s=1.5)
    assert 1.4 < time.monotonic() - t0 < 5


def test_without_a_probe_the_first_timeout_is_final():
    with pytest.raises(SetupError, match=r"debugging port within \ds$"):
        wait_for_chrome(_ctx(_free_port(), None), timeout_s=0.3, running_cap_s=10)
