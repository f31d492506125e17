"""A desktop reset in place between episodes (``LocalProvider(warm_reset=True)``) comes back to
exactly its first state, or is replaced by a fresh desktop."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from rz_agents.envs.osworld import LOCAL_TASKS
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.providers import warm
from rz_agents.envs.osworld.providers.local import sandbox_problem

needs_desktop = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("chromium") and shutil.which("openbox")) or sandbox_problem(),
    reason="needs xvfb, chromium, openbox and bubblewrap (scripts/install.sh installs them)",
)


def _task(domain: str, task_id: str) -> dict:
    return json.loads((Path(LOCAL_TASKS) / domain / f"{task_id}.json").read_text())


def _comms(pids: list[int]) -> list[str]:
    out = []
    for p in pids:
        try:
            with open(f"/proc/{p}/comm") as f:
                out.append(f.read().strip())
        except OSError:
            pass
    return out


@needs_desktop
def test_warm_reset_keeps_the_desktop_and_brings_back_its_first_state():
    with DesktopEnv(require_screenshot=False, provider_options={"warm_reset": True}) as env:
        env.reset(_task("chrome", "rz-chrome-two-tabs"))
        provider, first = env.provider, env.provider.desktop
        assert "chromium" in _comms(provider.pids())
        registry = Path(first.home_dir, ".config/libreoffice/4/user/registrymodifications.xcu")
        fresh_registry = registry.read_bytes()
        env.ctx.client.execute(
            "echo x >> ~/.config/libreoffice/4/user/registrymodifications.xcu; touch ~/Desktop/junk /tmp/junk"
            " /dev/shm/junk; mkdir -p ~/.cache/junk; nohup sleep 600 >/dev/null 2>&1 &",
            shell=True,
        )
        env.step("pyautogui.moveTo(10, 10)", pause=0.0)

        env.reset(_task("os", "rz-os-rename-file"))
        assert provider.desktop is first and provider.warm_resets == 1, provider.warm_reset_failures
        comms = _comms(provider.pids())
        assert "chromium" not in comms and "sleep" not in comms
        assert registry.read_bytes() == fresh_registry
        assert not Path(first.home_dir, "Desktop", "junk").exists()
        assert not Path(first.home_dir, ".cache", "junk").exists()
        listing = env.ctx.client.execute("ls -A /tmp /dev/shm", shell=True)["output"]
        assert "junk" not in listing
        assert env.ctx.client.windows() == []
        assert (
            env.ctx.client.run_python("print(pyautogui.position())")["output"].strip()
            == "Point(x=960, y=540)"
        )
        _, _, done, info = env.step("pyautogui.moveTo(100, 100)", pause=0.0)  # and it still works
        assert not done and not info.get("error"), info
        assert env.evaluate() in (0.0, 1.0)
    assert provider.pids() == [] and not os.path.exists(first.root_dir)


@needs_desktop
def test_a_desktop_that_lost_one_of_its_own_processes_is_replaced_by_a_fresh_one():
    with DesktopEnv(require_screenshot=False, provider_options={"warm_reset": True}) as env:
        env.reset(_task("os", "rz-os-rename-file"))
        provider, first = env.provider, env.provider.desktop
        openbox = [p for p in provider.pids() if _comms([p]) == ["openbox"]]
        assert len(openbox) == 1
        os.kill(openbox[0], signal.SIGKILL)
        env.reset(_task("os", "rz-os-rename-file"))
        assert provider.desktop.episode_id != first.episode_id
        assert provider.warm_resets == 0
        # seen before the reset (pid gone) or by the check after it (a killed process still listed then)
        assert len(provider.warm_reset_failures) == 1
        assert provider.warm_reset_failures[0].startswith("desktop processes died: ")
        assert not os.path.exists(first.root_dir)
        assert "openbox" in _comms(provider.pids())


@needs_desktop
def test_an_unsandboxed_desktop_is_always_started_afresh():
    with DesktopEnv(
        require_screenshot=False,
        require_a11y_tree=False,
        provider_options={"warm_reset": True, "sandbox": "none"},
    ) as env:
        env.reset(_task("os", "rz-os-rename-file"))
        first = env.provider.desktop.episode_id
        env.reset(_task("os", "rz-os-rename-file"))
        assert env.provider.desktop.episode_id != first and env.provider.warm_resets == 0


def test_same_tree_names_the_first_difference(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "f").write_bytes(b"same")
    assert warm.same_tree(str(a), str(b)) is None
    (b / "sub" / "f").write_bytes(b"diff")  # same size, other bytes
    assert warm.same_tree(str(a), str(b)) == "home differs at sub/f"
    (b / "sub" / "f").write_bytes(b"same")
    (b / "extra").write_text("")
    assert warm.same_tree(str(a), str(b)) == "home differs at extra"


def test_restore_files_puts_home_back_and_removes_only_new_entries(tmp_path):
    home, copy, tmp = tmp_path / "home", tmp_path / "copy", tmp_path / "tmp"
    for d in (home, tmp):
        d.mkdir()
    (home / ".Xauthority").write_bytes(b"cookie")
    (tmp / ".X11-unix").mkdir()
    base = warm.take_baseline([], str(home), str(tmp), str(copy))
    (home / ".Xauthority").write_bytes(b"changed")
    (home / "Desktop").mkdir()
    (tmp / "junk").write_text("x")
    (tmp / "junkdir").mkdir()
    assert warm.verify([], base, str(home)) is not None
    warm.restore_files(base, str(home), None)
    assert warm.verify([], base, str(home)) is None
    assert sorted(os.listdir(tmp)) == [".X11-unix"] and (home / ".Xauthority").read_bytes() == b"cookie"


@needs_desktop
def test_chrome_steps_and_getters_reach_the_new_chromium_after_a_reset_in_place():
    # the CDP port stays, the browser behind it is new: the Playwright link must reconnect
    task = _task("chrome", "rz-chrome-close-ad-tab")  # its setup opens tabs over CDP
    with DesktopEnv(require_screenshot=False, provider_options={"warm_reset": True}) as env:
        for episode in range(2):
            env.reset(task)
            assert env.provider.warm_resets == episode, env.provider.warm_reset_failures
            env.step("DONE")
            assert env.evaluate() == 0.0  # the ad tab is still open: scored through CDP
            assert env.last_evaluation.errors == []


@needs_desktop
def test_a_process_that_keeps_forking_during_the_reset_is_killed_with_every_child_it_made():
    # A fork loop makes new processes between the reset's process listing and its kill: every one
    # of them must be gone too (before: "processes survived the reset", and a fresh desktop instead).
    with DesktopEnv(require_screenshot=False, provider_options={"warm_reset": True}) as env:
        env.reset(_task("os", "rz-os-rename-file"))
        provider, first = env.provider, env.provider.desktop
        env.ctx.client.execute("nohup sh -c 'while :; do sleep 600 & done' >/dev/null 2>&1 &", shell=True)
        env.reset(_task("os", "rz-os-rename-file"))
        assert provider.desktop is first and provider.warm_resets == 1, provider.warm_reset_failures
        assert "sleep" not in _comms(provider.pids()) and "sh" not in _comms(provider.pids())
    assert provider.pids() == []
