"""The ``update_browse_history`` setup step: a Chrome History database with the task's visits.

OSWorld's setup controller downloads an empty ``History`` database (``history_empty.sqlite``),
inserts one ``urls`` row and one ``visits`` row per item (visited ``visit_time_from_now_in_seconds``
ago, Chrome's microseconds since 1601, typed transition flags ``805306368``), and uploads it as
``~/.config/google-chrome/Default/History`` before Chrome starts. Here the empty database is that
file when the download cache has it (``<cache>/<task_id>/history_empty.sqlite`` or
``<cache>/history_empty.sqlite``), else the one this machine's Chromium creates in a fresh
profile (its own schema version, which the desktop's Chromium then reads without migrating).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from typing import Any

from rz_agents.envs.osworld.cache import first_existing
from rz_agents.envs.osworld.chrome import chromium_binary
from rz_agents.envs.osworld.context import EpisodeContext

HISTORY_PATH = "/home/user/.config/google-chrome/Default/History"
TEMPLATE_NAME = "history_empty.sqlite"
TEMPLATE_URL = (  # where OSWorld's controller downloads the empty database (for `rz osworld fetch` users)
    "https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/chrome/"
    "44ee5668-ecd5-4366-a6ce-c1c9b8d4e938/history_empty.sqlite?download=true"
)
TYPED_TRANSITION = 805306368  # PAGE_TRANSITION_TYPED | CHAIN_START | CHAIN_END, as OSWorld writes
CHROME_EPOCH = dt.datetime(1601, 1, 1)


def chrome_time(when: dt.datetime) -> int:
    """Chrome's timestamp: microseconds since 1601-01-01 (OSWorld passes a naive local time)."""
    return int((when - CHROME_EPOCH).total_seconds() * 1_000_000)


def empty_history_db(dest: str, timeout_s: float = 30.0) -> str:
    """Write the empty ``History`` database a fresh Chromium profile starts with to ``dest``.

    Chromium runs headless on a throwaway profile (outside any desktop) until it has created the
    file, and is stopped; raises ``RuntimeError`` when there is no Chromium or it does not.
    """
    binary = chromium_binary()
    if not binary:
        raise RuntimeError("no Chromium to create an empty History database (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="rz-history-") as profile:
        proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        made = os.path.join(profile, "Default", "History")
        try:
            # Chromium holds the database locked while it runs: wait for the file, then stop it
            deadline = time.monotonic() + timeout_s
            while not (os.path.isfile(made) and os.path.getsize(made) > 0):
                if time.monotonic() > deadline or proc.poll() is not None:
                    break
                time.sleep(0.2)
            time.sleep(1.0)  # it writes its tables in the first moments
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        if not _has_tables(made):
            raise RuntimeError(f"Chromium did not create a History database within {timeout_s:.0f}s")
        shutil.copyfile(made, dest)
    return dest


def _has_tables(path: str) -> bool:
    if not os.path.isfile(path):
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)) as db:
            names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error:
        return False
    return {"urls", "visits", "meta"} <= names


def add_visits(db_path: str, history: list[dict[str, Any]], now: dt.datetime | None = None) -> None:
    """Insert each item's ``urls`` and ``visits`` rows, as OSWorld's controller does."""
    now = now or dt.datetime.now()
    with contextlib.closing(sqlite3.connect(db_path)) as db, db:
        for item in history:
            stamp = chrome_time(now - dt.timedelta(seconds=item["visit_time_from_now_in_seconds"]))
            cur = db.execute(
                "INSERT INTO urls (url, title, visit_count, typed_count, last_visit_time, hidden) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (item["url"], item["title"], 1, 0, stamp, 0),
            )
            db.execute(
                "INSERT INTO visits (url, visit_time, from_visit, transition, segment_id, visit_duration) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (cur.lastrowid, stamp, 0, TYPED_TRANSITION, 0, 0),
            )


def step_update_browse_history(ctx: EpisodeContext, history: list[dict[str, Any]], **_: Any) -> None:
    """Give the desktop's Chrome profile a History database holding ``history``."""
    db_path = os.path.join(ctx.work_dir, "history_new.sqlite")
    template = first_existing(
        [
            os.path.join(ctx.download_cache, ctx.task_id, TEMPLATE_NAME),
            os.path.join(ctx.download_cache, TEMPLATE_NAME),
        ]
    )
    if template:
        shutil.copyfile(template, db_path)
    else:
        empty_history_db(db_path)
    add_visits(db_path, history)
    with open(db_path, "rb") as f:
        ctx.client.upload(HISTORY_PATH, f.read())
