"""A stopping run must not wait for mini-swe-agent: its process group is killed when the episode is
cancelled (``run_killable`` / ``kill_process_groups``), grandchildren included, and a timeout kills it too."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rz_agents.agents.miniswe.agent import kill_process_groups, run_killable
from rz_agents.agents.miniswe.processes import Cancelled, EpisodeChildren

# a child that starts a grandchild, writes its pid, and then both sleep far past the test
SCRIPT = (
    "import subprocess, sys, time; "
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
    "open(sys.argv[1], 'w').write(str(g.pid)); time.sleep(120)"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): count it as gone
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _wait_for(path: Path, seconds: float = 30.0) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError("the child never started its grandchild")


def test_killing_the_children_ends_the_process_group_at_once(tmp_path):
    pidfile = tmp_path / "grandchild"
    children: list[subprocess.Popen] = []
    result: dict = {}

    def run():
        result["done"] = run_killable([sys.executable, "-c", SCRIPT, str(pidfile)], dict(os.environ),
                                      tmp_path, 300.0, children)  # fmt: skip

    worker = threading.Thread(target=run)
    worker.start()
    grandchild = _wait_for(pidfile)
    assert len(children) == 1 and _alive(grandchild)
    started = time.monotonic()
    kill_process_groups(children)
    worker.join(timeout=30)
    assert not worker.is_alive(), "the worker thread still waits on a killed child"
    assert time.monotonic() - started < 30
    assert result["done"].returncode < 0  # killed by a signal
    assert children == []  # removed once it ended
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild), "the grandchild (litellm's helpers, say) outlived the kill"


def test_a_timeout_kills_the_group_and_raises(tmp_path):
    pidfile = tmp_path / "grandchild"
    with pytest.raises(subprocess.TimeoutExpired):
        run_killable([sys.executable, "-c", SCRIPT, str(pidfile)], dict(os.environ), tmp_path, 3.0)
    if pidfile.is_file() and pidfile.read_text():
        grandchild = int(pidfile.read_text())
        deadline = time.monotonic() + 10
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild)


def test_a_child_started_after_the_cancel_is_killed_or_never_started(tmp_path):
    """The race of an episode cancelled before its thread reached ``Popen``: the cancellation holds for a
    child added later (killed as it is added), and a cancelled set starts nothing at all."""
    children = EpisodeChildren()
    children.kill_all()  # the episode is cancelled first: nothing was running yet
    with pytest.raises(Cancelled):
        run_killable([sys.executable, "-c", SCRIPT, str(tmp_path / "never")], dict(os.environ), tmp_path,
                     300.0, children)  # fmt: skip
    assert not (tmp_path / "never").exists()
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    started = time.monotonic()
    children.add(late)  # the thread got past its check just before the cancel: killed on arrival
    assert late.wait(timeout=30) < 0 and time.monotonic() - started < 30
    assert len(children) == 0
