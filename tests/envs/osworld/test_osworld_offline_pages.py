"""Tasks whose setup opens live pages they do not need, run offline on the real desktop.

``live_web.PAGES_NOT_NEEDED``: the tabs show Chromium's error page (the desktop has no network), and
the task is scored on the desktop's files (or the browser's bookmarks, which keep the URL the tab was
sent to), so a scripted episode scores 1 and the untouched desktop 0 as on OSWorld's VM. The tasks
are OSWorld's files, unchanged; their inputs (Google Drive downloads on the VM) are made here in
OSWorld's cache layout: a cloned site's ``_config.yml`` to edit, MP3s without tags named
"Artist - Title" (and the other files that task's setup unpacks).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from rz_agents.envs.osworld.cache import download_paths
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.live_web import PAGES_NOT_NEEDED
from rz_agents.envs.osworld.runnability import check_task
from rz_agents.envs.osworld.task import load_task
from rz_agents.eval.osworld import run_osworld_eval

OFFICIAL = Path(__file__).parents[3] / "rz_agents/envs/osworld/official/examples/multi_apps"
ORACLES = Path(__file__).parent / "multi_app_oracles"
YAML_SITE = "e2392362-125e-4f76-a2ee-524b183a3412"  # a cloned site's _config.yml (tab: the template's page)
MP3_TAGS = "3f05f3b9-29ba-4b6b-95aa-2204697ffc06"  # tag MP3s from their names (tabs: Picard's, Kid3's)
SAMPLE = (YAML_SITE, MP3_TAGS)
BOOKMARK = "7a5a7856-f1b6-42a4-ade9-1ca81ca0f263"  # bookmark the page on screen (chrome: shared data)
SHARED_CHROME = Path("/work/shared/data/osworld/examples/chrome")
NEEDED = ("Xvfb", "openbox", "chromium", "nautilus", "picard", "ffmpeg", "code-server")

pytestmark = pytest.mark.skipif(
    not all(shutil.which(p) for p in NEEDED),
    reason="needs the OSWorld apps (scripts/install.sh --osworld-apps): " + ", ".join(NEEDED),
)

CONFIG_YML = b"""title: "Your Name / Site Title"
name: &name "Your Name"
description: "personal description"
author:
  name: *name
  bio: "Short biography for the left-hand sidebar"
  email: "none@example.org"
"""


def _tar_xz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _untagged_mp3(path: Path) -> bytes:
    """A short silent MP3 with no ID3 tag at all (what the task's files look like)."""
    subprocess.run(
        ["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", "anullsrc=r=8000:cl=mono", "-t", "0.3",
         "-b:a", "8k", "-map_metadata", "-1", "-id3v2_version", "0", "-write_xing", "0", "-y", str(path)],
        check=True,
    )  # fmt: skip
    return path.read_bytes()


def _input(task_id: str, path: str, scratch: Path) -> bytes:
    name = Path(path).name
    if task_id == YAML_SITE:
        return _tar_xz({"academicpages.github.io/_config.yml": CONFIG_YML})
    if name.endswith(".mp3"):
        return _untagged_mp3(scratch / "silence.mp3")
    if name.endswith(".tar.xz"):
        return _tar_xz({"README.md": b"unpacked by the setup\n"})
    return b"%PDF-1.4 placeholder" if name.endswith(".pdf") else b"placeholder"


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> tuple[Path, Path]:
    """The two official task files (unchanged) with their oracles, and a filled cache."""
    root = tmp_path_factory.mktemp("offline_pages")
    (root / "multi_apps").mkdir()
    (root / "oracles").mkdir()
    cache = root / "cache"
    for task_id in SAMPLE:
        shutil.copy(OFFICIAL / f"{task_id}.json", root / "multi_apps")
        shutil.copy(ORACLES / f"{task_id}.json", root / "oracles")
        for step in load_task(OFFICIAL / f"{task_id}.json").config:
            for f in step.parameters.get("files", []) if step.type == "download" else []:
                dest = Path(download_paths(str(cache), task_id, f["url"], f["path"])[0])
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(_input(task_id, f["path"], root))
    return root, cache


def test_tasks_open_live_pages_yet_are_runnable_here(task_dir):
    root, cache = task_dir
    assert set(SAMPLE) <= set(PAGES_NOT_NEEDED)
    for task_id in SAMPLE:
        task = load_task(root / "multi_apps" / f"{task_id}.json")
        assert any(step.type == "chrome_open_tabs" for step in task.config), task_id
        assert check_task(task, str(cache)).reasons == [], task_id


def test_scripted_episodes_score_one_and_the_untouched_desktop_zero(task_dir):
    root, cache = task_dir
    fast = {"accessibility": "fallback"}  # scoring is under test, not the tree
    oracle = run_osworld_eval(root, "oracle", pause=0.2, provider_options=fast, download_cache=str(cache))
    assert {r["id"]: r["score"] for r in oracle["tasks"]} == dict.fromkeys(SAMPLE, 1.0), oracle["tasks"]
    assert all(r["status"] == "ok" and not r.get("error") for r in oracle["tasks"]), oracle["tasks"]
    empty = run_osworld_eval(root, "noop", pause=0.2, provider_options=fast, download_cache=str(cache))
    assert {r["id"]: r["score"] for r in empty["tasks"]} == dict.fromkeys(SAMPLE, 0.0), empty["tasks"]
    errors = {r["id"]: r.get("error") for r in empty["tasks"]}
    assert all(r["status"] == "ok" for r in empty["tasks"]) and errors[YAML_SITE] is None, empty["tasks"]
    # untagged files: OSWorld's check_mp3_meta raises reading them (scored 0), as here
    assert "ID3NoHeaderError" in errors[MP3_TAGS], errors


@pytest.mark.skipif(
    not (SHARED_CHROME / f"{BOOKMARK}.json").is_file(), reason="OSWorld's chrome tasks absent"
)
def test_bookmarking_the_unreachable_page_scores_one_and_the_untouched_desktop_zero():
    """The tab shows Chromium's error page, yet bookmarking it (Ctrl+D, folder: Bookmarks bar) keeps
    the URL OSWorld's metric expects."""
    task = json.loads((SHARED_CHROME / f"{BOOKMARK}.json").read_text())
    assert check_task(load_task(SHARED_CHROME / f"{BOOKMARK}.json"), "/x").reasons == []
    oracle = (
        "import time\npyautogui.hotkey('ctrl', 'd'); time.sleep(1.5)\n"
        "pyautogui.press('tab'); pyautogui.press('space'); time.sleep(0.8)\n"  # the bubble's folder menu
        "pyautogui.click(1683, 247); time.sleep(0.8)\n"  # its first entry: Bookmarks bar
        "pyautogui.press('escape'); time.sleep(4)"  # Chromium writes Bookmarks 2.5 s after a change
    )
    with DesktopEnv(require_a11y_tree=False, require_screenshot=False) as env:
        env.reset(task)
        assert env.evaluate() == 0.0, env.last_evaluation
        env.reset(task)
        env.step(oracle)
        assert env.evaluate() == 1.0, env.last_evaluation
