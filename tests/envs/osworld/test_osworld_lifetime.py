"""A desktop lives as long as the env that owns it, whatever thread reset it, and dies with its
process: bubblewrap's --die-with-parent follows the forking thread, so the provider forks on the
process's spawner thread."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rz_agents.envs.osworld import LOCAL_TASKS
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.providers.local import episode_pids, process_tree

pytestmark = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("chromium") and shutil.which("openbox")),
    reason="needs xvfb, chromium and openbox (scripts/install.sh installs them)",
)

TASKS = {
    "os": Path(LOCAL_TASKS) / "os" / "rz-os-rename-file.json",
    "chrome": Path(LOCAL_TASKS) / "chrome" / "rz-chrome-open-about.json",
}
ROOT = Path(__file__).resolve().parents[3]


def _descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid``."""
    return set(process_tree([pid])) - {pid}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.parametrize("domain", ["os", "chrome"])
def test_desktop_reset_on_a_pool_thread_keeps_working_after_the_pool_shuts_down(domain):
    task = json.loads(TASKS[domain].read_text())
    with DesktopEnv(require_a11y_tree=False) as env:
        with ThreadPoolExecutor(2) as pool:  # the common per-batch pattern
            pool.submit(env.reset, task).result()
        time.sleep(0.5)  # a parent-death signal tied to the exited thread would have fired by now
        _, _, done, info = env.step("pyautogui.moveTo(100, 100)", pause=0.0)
        assert not done and not info.get("error"), info
        out = env.ctx.client.run_python("print(6 * 7)")
        assert out.get("output", "").strip() == "42", out


HOST = r"""
import json, sys, threading, time
from rz_agents.envs.osworld.desktop_env import DesktopEnv
env = DesktopEnv(require_a11y_tree=False)
t = threading.Thread(target=env.reset, args=(json.load(open(sys.argv[1])),))
t.start()
t.join()  # the thread that started the desktop is gone before the host is killed
print(env.provider.desktop.episode_id, flush=True)
time.sleep(120)
"""


def test_desktop_started_on_an_exited_thread_dies_when_its_process_is_killed():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels")])}
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, str(TASKS["chrome"])], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        episode = host.stdout.readline().strip()
        assert episode, "the host did not start its desktop"
        tree = _descendants(host.pid)
        assert len(episode_pids(episode)) >= 4  # Xvfb, openbox, server, Chromium (+ its helpers)
        assert all(_alive(p) for p in tree)
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
    assert _wait_until(lambda: not episode_pids(episode)), episode_pids(episode)
    assert _wait_until(lambda: not [p for p in tree if _alive(p)]), [p for p in tree if _alive(p)]
