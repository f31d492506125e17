"""A sandbox never outlives the process that owns it, even when that process is SIGKILLed, and
lives as long as its owner whatever thread started it."""

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sandbox_test_support import FAST, processes_of_uid

from rz_agents.envs.python_tool import PythonSandbox, local

HOST = r"""
import os, sys, threading
from rz_agents.envs.python_tool import PythonSandbox
from rz_agents.envs.python_tool import local
if sys.argv[1] == "unsandboxed":
    local.bwrap_problem.cache_clear()
    os.environ["PATH"] = "/nonexistent"
if sys.argv[2] == "thread":  # started on a thread that has exited before the host is killed
    box = []
    t = threading.Thread(target=lambda: box.append(PythonSandbox(allow_unsandboxed=True)))
    t.start()
    t.join()
    sb = box[0]
else:
    sb = PythonSandbox(allow_unsandboxed=True)
print(sb.run("import os; (os.getuid(), os.getpid())").stdout, flush=True)
sb.run("while True: pass", timeout_s=60)
"""


def run_host_and_kill_it(mode: str, started_on: str = "main") -> tuple[int, int]:
    host = subprocess.Popen([sys.executable, "-c", HOST, mode, started_on], stdout=subprocess.PIPE, text=True)
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


@pytest.mark.parametrize("started_on", ["main", "thread"])
def test_sandboxed_session_dies_with_its_host(started_on):
    if os.getuid() != 0:
        pytest.skip("finding the sandbox's processes needs the per-sandbox uid a root host gives")
    uid, _ = run_host_and_kill_it("sandboxed", started_on)
    assert uid != 0
    assert wait_until(lambda: not processes_of_uid(uid))


@pytest.mark.parametrize("started_on", ["main", "thread"])
def test_unsandboxed_worker_dies_with_its_host(started_on):
    _, pid = run_host_and_kill_it("unsandboxed", started_on)

    def gone() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split()[2] == "Z"
        except OSError:
            return True

    assert wait_until(gone)


def _start_on_a_pool_thread(**kwargs) -> PythonSandbox:
    """A sandbox created and used on a ThreadPoolExecutor thread; the pool is shut down on return."""
    with ThreadPoolExecutor(1) as pool:
        sb = pool.submit(lambda: PythonSandbox(FAST, **kwargs)).result()
        assert pool.submit(sb.run, "x = 41").result().ok
    return sb


@pytest.mark.parametrize("mode", ["sandboxed", "unsandboxed"])
def test_session_outlives_the_thread_that_started_it(mode, monkeypatch):
    if mode == "unsandboxed":
        monkeypatch.setattr(local, "bwrap_problem", lambda: "forced unsandboxed for this test")
    sb = _start_on_a_pool_thread(allow_unsandboxed=mode == "unsandboxed")
    try:
        assert sb.sandboxed == (mode == "sandboxed")
        time.sleep(0.3)  # a parent-death signal tied to the exited thread would have fired by now
        r = sb.run("x + 1")
        assert (r.stdout, r.error, r.restarted) == ("42\n", None, False)
        assert sb.restarts == 0
    finally:
        sb.close()


def test_sessions_started_by_many_short_lived_threads_all_survive():
    boxes: dict[int, PythonSandbox] = {}

    def start(i: int) -> None:  # the thread lives until its session has run once, then exits
        boxes[i] = PythonSandbox(FAST)
        assert boxes[i].run(f"v = {i}").ok

    threads = [threading.Thread(target=start, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.3)
    try:
        assert len(boxes) == 4
        for i, sb in boxes.items():
            r = sb.run("v")
            assert (r.stdout, r.restarted) == (f"{i}\n", False)
    finally:
        for sb in boxes.values():
            sb.close()
