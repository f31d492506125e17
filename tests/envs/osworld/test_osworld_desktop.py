"""The real desktop: Xvfb + openbox + Chromium in a bubblewrap sandbox, driven through pyautogui.

These tests start Xvfb themselves (CI installs xvfb, chromium, xdotool, openbox). One DesktopEnv
is shared by the API tests; each ``reset`` still starts a fresh desktop, as an episode must.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import gymnasium
import pytest

from rz_agents.envs.osworld import LOCAL_TASKS, register_envs
from rz_agents.envs.osworld.cache import cloud_file_path, download_paths
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.getters import get_vm_command_line
from rz_agents.envs.osworld.gym_env import ENV_ID, OSWorldEnv
from rz_agents.envs.osworld.providers.local import episode_pids, process_tree
from rz_agents.envs.osworld.setup_steps import SetupError
from rz_agents.eval.osworld import run_osworld_eval

pytestmark = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("chromium") and shutil.which("openbox")),
    reason="needs xvfb, chromium and openbox (scripts/install.sh installs them)",
)

TASKS = Path(LOCAL_TASKS)


def _task(domain: str, task_id: str) -> dict:
    return json.loads((TASKS / domain / f"{task_id}.json").read_text())


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid``."""
    return set(process_tree([pid])) - {pid}


@pytest.fixture(scope="module")
def env():
    e = DesktopEnv()
    yield e
    e.close()


def test_oracles_score_one_and_empty_trajectories_zero():
    # Scoring, not the tree, is under test: the fallback tree is cheaper than AT-SPI's (covered in
    # test_osworld_atspi.py), which keeps this 26-episode test's time down.
    fast = {"accessibility": "fallback"}
    oracle = run_osworld_eval(TASKS, "oracle", pause=0.2, provider_options=fast)
    assert oracle["evaluated"] >= 10 and oracle["skipped"] == 0
    assert {r["id"]: r["score"] for r in oracle["tasks"]} == {r["id"]: 1.0 for r in oracle["tasks"]}, oracle
    empty = run_osworld_eval(TASKS, "noop", pause=0.2, provider_options=fast)
    assert {r["id"]: r["score"] for r in empty["tasks"]} == {r["id"]: 0.0 for r in empty["tasks"]}, empty
    assert all(r["status"] == "ok" for r in oracle["tasks"] + empty["tasks"])


def test_wrong_trajectories_score_zero(env):
    env.reset(_task("os", "rz-os-rename-file"))
    env.step("import os\nos.rename('/home/user/Desktop/draft.txt', '/home/user/Desktop/final.md')", pause=0)
    env.step("DONE")
    assert env.evaluate() == 0.0
    env.reset(_task("chrome", "rz-chrome-open-about"))
    env.step(
        "pyautogui.hotkey('ctrl', 'l'); pyautogui.typewrite('file:///home/user/site/contact.html'); "
        "pyautogui.press('enter'); time.sleep(1)"
    )
    env.step("DONE")
    assert env.evaluate() == 0.0
    env.reset(_task("os", "rz-os-infeasible-bios"))
    assert not env.ctx.browser_running()  # the chrome task's browser went with its episode
    env.step("DONE")  # claiming success on an infeasible task
    assert env.evaluate() == 0.0


def test_observation_has_png_screenshot_a11y_tree_and_instruction(env):
    obs = env.reset(_task("chrome", "rz-chrome-open-about"))
    assert obs["screenshot"][:8] == b"\x89PNG\r\n\x1a\n" and len(obs["screenshot"]) > 1000
    tree = obs["accessibility_tree"]
    assert (
        'name="Chromium"' in tree and 'name="About us"' in tree
    )  # the page's own link, from Chrome's AX tree
    assert obs["instruction"].startswith("In Chrome, go to the About page")
    assert obs["terminal"] is None
    assert env.ctx.browser_running is not None and env.ctx.browser_running()  # the probe setup waits on


def test_actions_in_both_spaces_and_errors_reported_not_raised(env):
    env.reset(_task("os", "rz-os-mkdir-nested"))
    obs, reward, done, info = env.step(
        {"action_type": "MOVE_TO", "parameters": {"x": 321, "y": 123}}, pause=0
    )
    assert (reward, done, info) == (0.0, False, {})
    out = get_vm_command_line(
        env.ctx, {"command": ["python", "-c", "import pyautogui; print(tuple(pyautogui.position()))"]}
    )
    assert out == "(321, 123)\n"  # exactly the program's output: no Xlib warnings mixed in
    _, _, done, info = env.step("pyautogui.no_such_function()", pause=0)
    assert not done and "AttributeError" in info["error"]
    _, _, done, info = env.step("pyautogui.click(1,", pause=0)
    assert not done and "not valid Python" in info["error"]
    _, _, done, info = env.step("WAIT", pause=0)
    assert not done
    _, _, done, info = env.step("FAIL")
    assert done and info["done"] == "FAIL" and env.evaluate() == 0.0


def test_each_action_runs_in_a_fresh_interpreter_state(env):
    env.reset(_task("os", "rz-os-mkdir-nested"))
    _, _, _, info = env.step("leaked = 1\npyautogui.PAUSE = 5", pause=0)
    assert info == {}
    _, _, _, info = env.step("print(leaked)", pause=0)
    assert "NameError" in info["error"]  # like python -c: nothing survives an action
    out = env.ctx.client.run_python("print(pyautogui.PAUSE, __name__)")
    assert out["output"] == "0.1 __main__\n"
    out = env.ctx.client.execute(["python", "-c", "import sys; sys.exit(7)"])
    assert out["returncode"] == 7
    out = env.ctx.client.execute(["python", "-c", "import time; time.sleep(30)"], timeout=1)
    assert out["returncode"] != 0 and "timed out" in out["error"]


def test_reset_reverts_to_a_clean_home(env):
    env.reset(_task("os", "rz-os-mkdir-nested"))
    env.step("open('/home/user/Desktop/leftover.txt', 'w').write('x')", pause=0)
    assert get_vm_command_line(env.ctx, {"command": "ls /home/user/Desktop", "shell": True}).split() == [
        "leftover.txt"
    ]
    env.reset(_task("os", "rz-os-mkdir-nested"))
    assert get_vm_command_line(env.ctx, {"command": "ls -A /home/user/Desktop", "shell": True}) == ""


def test_setup_needing_the_internet_fails_clearly_and_frees_the_desktop():
    task = _task("os", "rz-os-mkdir-nested")
    task["config"] = [
        {
            "type": "download",
            "parameters": {"files": [{"url": "https://example.org/x", "path": "/home/user/x"}]},
        }
    ]
    with DesktopEnv() as e:
        with pytest.raises(SetupError, match="needs internet download"):
            e.reset(task)
        assert e.provider.desktop is None


def test_download_steps_are_served_from_the_cache(tmp_path):
    url, path = "https://example.org/files/report.txt", "/home/user/Desktop/report.txt"
    task = _task("os", "rz-os-mkdir-nested")
    task["config"] = [{"type": "download", "parameters": {"files": [{"url": url, "path": path}]}}]
    cached = Path(download_paths(str(tmp_path), task["id"], url, path)[0])
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"offline copy\n")
    with DesktopEnv(download_cache=str(tmp_path), require_a11y_tree=False) as e:
        e.reset(task)
        assert e.ctx.client.get_file(path) == b"offline copy\n"


def test_close_leaves_no_processes_behind():
    before = _children(os.getpid())
    e = DesktopEnv()
    episodes = []
    for task in (_task("chrome", "rz-chrome-close-ad-tab"), _task("os", "rz-os-count-lines")):
        e.reset(task)
        desktop = e.provider.desktop
        episodes.append(desktop)
        assert len(episode_pids(desktop.episode_id)) >= 3  # Xvfb, openbox, server (+ Chrome)
        e.step("DONE")
        e.evaluate()  # the Chrome getter starts Playwright's driver in this process
    e.close()
    for d in episodes:
        assert episode_pids(d.episode_id) == []
        assert not os.path.exists(d.root_dir)
        assert not os.path.exists(f"/tmp/.X{d.display.lstrip(':')}-lock")
    assert _children(os.getpid()) - before == set()


def test_gymnasium_env_chat_turns_parse_errors_and_truncation_reward():
    register_envs()
    env = gymnasium.make(ENV_ID, max_turns=2, pause=0.0)
    try:
        assert isinstance(env.unwrapped, OSWorldEnv)
        messages, info = env.reset(options={"task": _task("os", "rz-os-mkdir-nested")})
        assert [m["role"] for m in messages] == ["system", "user"] and info["task_id"] == "rz-os-mkdir-nested"
        assert (
            "pyautogui" in messages[0]["content"]
            and "following task: Create the folder" in messages[0]["content"]
        )
        assert messages[1]["content"].startswith(
            "Given the info from accessibility tree as below:\ntag\tname"
        )
        obs, reward, terminated, truncated, info = env.step("let me think about it")
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert obs[0]["content"].startswith("Action error:") and "action_error" in info
        # The last turn does the work without saying DONE: the turn limit ends it, scored as it stands.
        reply = "```python\nimport os\nos.makedirs('/home/user/Desktop/projects/2026/reports')\n```"
        obs, reward, terminated, truncated, info = env.step(reply)
        assert (reward, terminated, truncated) == (1.0, False, True)
    finally:
        env.close()


def test_a_reply_of_several_actions_runs_them_all_and_reads_the_tree_once():
    register_envs()
    env = gymnasium.make(ENV_ID, max_turns=3, pause=0.0)
    try:
        env.reset(options={"task": _task("os", "rz-os-mkdir-nested")})
        client = env.unwrapped.desktop.ctx.client
        reads = []
        real = client.accessibility_tree
        client.accessibility_tree = lambda *a, **k: reads.append(1) or real(*a, **k)  # counts, then reads
        reply = (
            "```python\nimport os\nos.makedirs('/home/user/Desktop/projects')\n```\n"
            "```python\nimport os\nos.makedirs('/home/user/Desktop/projects/2026/reports')\n```"
        )
        obs, reward, terminated, truncated, info = env.step(reply)
        assert len(reads) == 1 and not info["errors"]  # two actions, one observation: the last one's
        assert obs[0]["content"].startswith("Given the info from accessibility tree as below:")
        assert (
            client.execute("test -d /home/user/Desktop/projects/2026/reports", shell=True)["returncode"] == 0
        )
    finally:
        env.close()


def test_gold_files_come_from_the_cache_and_command_output_is_kept(tmp_path):
    gold_url = "https://example.org/gold/notes.txt"
    task = {
        "id": "rz-cache-eval",
        "instruction": "Write the notes.",
        "config": [
            {
                "type": "execute",
                "parameters": {"command": "printf 'a\\nb\\n' > ~/Desktop/notes.txt", "shell": True},
            }
        ],
        "evaluator": {
            "postconfig": [
                {
                    "type": "execute",
                    "parameters": {"command": ["ls", "/home/user/Desktop"], "stdout": "desktop.ls"},
                }
            ],
            "func": ["compare_text_file", "check_list"],
            "result": [
                {"type": "vm_file", "path": "/home/user/Desktop/notes.txt", "dest": "notes.txt"},
                {"type": "cache_file", "path": "desktop.ls"},
            ],
            "expected": [
                {"type": "cloud_file", "path": gold_url, "dest": "notes_gold.txt"},
                {"type": "rule", "rules": {"expect": [r"^notes\.txt$"]}},
            ],
        },
    }
    with DesktopEnv(download_cache=str(tmp_path), require_a11y_tree=False, require_screenshot=False) as e:
        e.reset(task)
        e.step("DONE")
        assert e.evaluate() == 0.0 and "needs internet download" in e.last_evaluation.errors[0]
        gold = Path(cloud_file_path(str(tmp_path), task["id"], "notes_gold.txt"))
        gold.parent.mkdir(parents=True, exist_ok=True)
        gold.write_text("a\nb\n")
        e.reset(task)
        e.step("DONE")
        assert e.evaluate() == 1.0, e.last_evaluation
