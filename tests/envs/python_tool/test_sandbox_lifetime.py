"""A sandbox never outlives the process that owns it, even when that process is SIGKILLed."""

import os
import subprocess
import sys
import time

import pytest
from sandbox_test_support import processes_of_uid

HOST = r"""
import os, sys
from rz_agents.envs.python_tool import PythonSandbox
from rz_agents.envs.python_tool import local
if sys.argv[1] == "unsandboxed":
    local.bwrap_problem.cache_clear()
    os.environ["PATH"] = "/nonexistent"
sb = PythonSandbox(allow_unsandboxed=True)
print(sb.run("import os; (os.getuid(), os.getpid())").stdout, flush=True)
sb.run("while True: pass", timeout_s=60)
"""


def run_host_and_kill_it(mode: str) -> tuple[int, int]:
    host = subprocess.Popen([sys.executable, "-c", HOST, mode], stdout=subprocess.PIPE, text=True)
    uid, pid = eval(host.stdout.readline())  # our own tuple of two ints
    time.sleep(0.3)  # the worker is spinning now
    host.kill()
    host.wait()
    return uid, pid


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_sandboxed_session_dies_with_its_host():
    if os.getuid() != 0:
        pytest.skip("finding the sandbox's processes needs the per-sandbox uid a root host gives")
    uid, _ = run_host_and_kill_it("sandboxed")
    assert uid != 0
    assert wait_until(lambda: not processes_of_uid(uid))


def test_unsandboxed_worker_dies_with_its_host():
    _, pid = run_host_and_kill_it("unsandboxed")

    def gone() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split()[2] == "Z"
        except OSError:
            return True

    assert wait_until(gone)
