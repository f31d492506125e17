"""OSWorld's own multi-app tasks on the local desktop: scripted episodes score 1, the untouched desktop 0.

The tasks are OSWorld's files as packaged (``official/examples/multi_apps``), unchanged; their
inputs, which OSWorld downloads from Google Drive, are made here and put in a cache in OSWorld's
layout (as ``rz osworld fetch`` would). They use the pieces the multi-app tasks need: a setup's
``apt-get install`` of a package the host has (the desktop's apt wrapper) and the clipboard (xsel),
GNOME's file manager and Document Viewer (``nautilus`` launched, a PDF opened with ``xdg-open``),
Ubuntu's default video player (Totem, so making VLC the default is a change), a zip archive of
PDFs scored by ``compare_archive``, and an infeasible task. The replies are in
``multi_app_oracles/`` (the ``sar`` task's oracle runs ``sar`` for 30 s and is left out here).
"""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from rz_agents.envs.osworld.cache import cloud_file_path, download_paths
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.getters import get_vm_command_line
from rz_agents.envs.osworld.runnability import check_task
from rz_agents.envs.osworld.task import load_task
from rz_agents.eval.osworld import run_osworld_eval

OFFICIAL = Path(__file__).parents[3] / "rz_agents/envs/osworld/official/examples/multi_apps"
ORACLES = Path(__file__).parent / "multi_app_oracles"
CLIPBOARD = "716a6079-22da-47f1-ba73-c9d58f986a38"  # find secret.docx, copy its path (xsel)
BOOK = "5df7b33a-9f77-4101-823e-02f863e1c1ae"  # split a PDF book by chapter (nautilus, evince, zip)
VIDEO_PLAYER = "937087b6-f668-4ba6-9110-60682ee33441"  # make VLC the default video player
INFEASIBLE = "6d72aad6-187a-4392-a4c4-ed87269c51cf"  # Impress to video: infeasible
SAMPLE = (CLIPBOARD, BOOK, VIDEO_PLAYER, INFEASIBLE)
NEEDED = ("Xvfb", "openbox", "xsel", "nautilus", "evince", "totem", "gedit", "vlc", "wmctrl", "zip", "unzip")

pytestmark = pytest.mark.skipif(
    not all(shutil.which(p) for p in NEEDED),
    reason="needs the OSWorld apps (scripts/install.sh --osworld-apps): " + ", ".join(NEEDED),
)

CHAPTERS = [("Eigenvalues", 0), ("Isoperimetric Problems", 2), ("Diameters", 4)]


def _pdf(pages: list[str]) -> bytes:
    import pymupdf

    doc = pymupdf.open()
    for text in pages:
        doc.new_page().insert_text((72, 72), text)
    return doc.tobytes()


def _book_pages() -> list[str]:
    return [f"Chapter {n}: {title}, page {p}" for n, (title, _) in enumerate(CHAPTERS, 1) for p in (1, 2)]


def _zip(files: dict[str, bytes], folder: str = "") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(folder + name, data)
    return buf.getvalue()


def _fill_cache(cache: Path) -> None:
    """The inputs and gold files the sampled tasks download, made here (same names and paths)."""

    def put(path: str, data: bytes) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)

    for task_id in (CLIPBOARD, BOOK):
        task = load_task(OFFICIAL / f"{task_id}.json")
        for step in task.config:
            for f in step.parameters.get("files", []) if step.type == "download" else []:
                data = b"PK secret" if task_id == CLIPBOARD else b""
                if task_id == BOOK:
                    pages = _book_pages()
                    data = _zip(
                        {
                            "Spectral Graph Theory.pdf": _pdf(pages),
                            "Chapter 1 - Eigenvalues.pdf": _pdf(pages[:2]),
                        },
                        folder="book/",
                    )
                put(download_paths(str(cache), task_id, f["url"], f["path"])[0], data)
    pages = _book_pages()
    gold = {"Spectral Graph Theory.pdf": _pdf(pages)}
    for n, (title, first) in enumerate(CHAPTERS, 1):
        gold[f"Chapter {n} - {title}.pdf"] = _pdf(pages[first : first + 2])
    put(cloud_file_path(str(cache), BOOK, "gold_book.zip"), _zip(gold))


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> tuple[Path, Path]:
    """The sampled official task files (unchanged) with their oracles, and a filled cache."""
    root = tmp_path_factory.mktemp("multi")
    (root / "multi_apps").mkdir()
    shutil.copytree(ORACLES, root / "oracles")
    for task_id in SAMPLE:
        shutil.copy(OFFICIAL / f"{task_id}.json", root / "multi_apps")
    cache = root / "cache"
    _fill_cache(cache)
    return root, cache


def test_sampled_tasks_are_runnable_here(task_dir):
    root, cache = task_dir
    for task_id in SAMPLE:
        assert check_task(load_task(root / "multi_apps" / f"{task_id}.json"), str(cache)).reasons == [], (
            task_id
        )


def test_scripted_episodes_score_one_and_the_untouched_desktop_zero(task_dir):
    root, cache = task_dir
    fast = {"accessibility": "fallback"}  # scoring is under test, not the tree
    oracle = run_osworld_eval(root, "oracle", pause=0.2, provider_options=fast, download_cache=str(cache))
    assert {r["id"]: r["score"] for r in oracle["tasks"]} == dict.fromkeys(SAMPLE, 1.0), oracle
    empty = run_osworld_eval(root, "noop", pause=0.2, provider_options=fast, download_cache=str(cache))
    assert {r["id"]: r["score"] for r in empty["tasks"]} == dict.fromkeys(SAMPLE, 0.0), empty
    assert all(r["status"] == "ok" and not r.get("error") for r in oracle["tasks"] + empty["tasks"])
    assert oracle["by_domain"]["multi_apps"]["evaluated"] == len(SAMPLE)


def test_gnome_file_manager_and_document_viewer_stand_in(task_dir):
    """The book task's setup launches nautilus on the folder and opens the PDF as Ubuntu would:
    in Document Viewer (the desktop's default for PDFs), both real windows on this desktop."""
    root, cache = task_dir
    task = json.loads((root / "multi_apps" / f"{BOOK}.json").read_text())
    with DesktopEnv(download_cache=str(cache), require_a11y_tree=False) as env:
        env.reset(task)
        windows = ""
        for _ in range(40):  # the apps map their windows a few seconds after the setup returns
            windows = get_vm_command_line(env.ctx, {"command": ["wmctrl", "-lx"]}) or ""
            if "nautilus  desktop book" in windows.lower() and "Spectral Graph Theory" in windows:
                break
            env.step("WAIT")
        # Debian 12's Nautilus 43 names its class "org.gnome.Nautilus"; Ubuntu 22.04's 42,
        # "Org.gnome.Nautilus"
        assert "org.gnome.nautilus.org.gnome.nautilus  desktop book" in windows.lower(), windows
        assert "Spectral Graph Theory" in windows and "evince" in windows.lower(), windows
        for mime, desktop_file in (("application/pdf", "org.gnome.Evince.desktop"),
                                   ("application/json", "org.gnome.gedit.desktop")):  # fmt: skip
            default = get_vm_command_line(env.ctx, {"command": ["xdg-mime", "query", "default", mime]})
            assert default.strip() == desktop_file, mime
