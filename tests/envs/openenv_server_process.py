"""Starting the echo-word OpenEnv server (openenv_echo_server.py) as OpenEnv's docs start one: uvicorn on a
free loopback port, in a process of its own; shared by the adapter tests and the Ray runtime's."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A loopback port nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def echo_server(log_dir: Path) -> Iterator[str]:
    """The server's URL while it runs (its log in ``log_dir``); stopped on exit."""
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "tests.envs.openenv_echo_server:app", "--host", "127.0.0.1"]
    log_path = log_dir / "server.log"
    log = log_path.open("w")  # a file, not a pipe: a full pipe would block the server's logging
    proc = subprocess.Popen([*cmd, "--port", str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"the OpenEnv server exited: {log_path.read_text()[-2000:]}")
                if time.monotonic() > deadline:
                    pytest.fail("the OpenEnv server did not answer /health within 60 s")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
