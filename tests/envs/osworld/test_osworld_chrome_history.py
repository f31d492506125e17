"""update_browse_history: a History database with the task's visits that the desktop's Chromium
keeps using (its own visits land in it), read back by the ``history`` getter and scored."""

from __future__ import annotations

import datetime as dt
import shutil
import sqlite3
import time

import pytest

from rz_agents.envs.osworld.chrome_history import add_visits, chrome_time, empty_history_db

needs_chromium = pytest.mark.skipif(
    not shutil.which("chromium"), reason="needs chromium (scripts/install.sh)"
)
YOUTUBE = {
    "url": "https://www.youtube.com/watch?v=x",
    "title": "A video",
    "visit_time_from_now_in_seconds": 3600,
}
NEWS = {
    "url": "https://www.nytimes.com/",
    "title": "The New York Times",
    "visit_time_from_now_in_seconds": 300,
}


def test_chrome_time_counts_microseconds_from_1601():
    assert chrome_time(dt.datetime(1601, 1, 2)) == 86_400_000_000
    assert chrome_time(dt.datetime(1970, 1, 1)) == 11_644_473_600_000_000  # the Unix epoch in Chrome's clock


@needs_chromium
def test_visits_go_into_the_empty_database_chromium_makes(tmp_path):
    db_path = empty_history_db(str(tmp_path / "History"))
    now = dt.datetime(2024, 5, 1, 12, 0, 0)
    add_visits(db_path, [YOUTUBE, NEWS], now=now)
    db = sqlite3.connect(db_path)
    urls = db.execute(
        "SELECT id, url, title, visit_count, typed_count, last_visit_time, hidden FROM urls"
    ).fetchall()
    visits = db.execute(
        "SELECT url, visit_time, from_visit, transition, segment_id, visit_duration FROM visits"
    ).fetchall()
    db.close()
    t1, t2 = chrome_time(now - dt.timedelta(seconds=3600)), chrome_time(now - dt.timedelta(seconds=300))
    assert [u[1:] for u in urls] == [
        (YOUTUBE["url"], "A video", 1, 0, t1, 0),
        (NEWS["url"], NEWS["title"], 1, 0, t2, 0),
    ]
    assert visits == [(urls[0][0], t1, 0, 805306368, 0, 0), (urls[1][0], t2, 0, 805306368, 0, 0)]


def _task(history):
    page = "printf '<title>Local</title>hi' > /home/user/page.html"
    return {
        "id": "rz-browse-history",
        "instruction": "Nothing to do.",
        "config": [
            {"type": "execute", "parameters": {"command": page, "shell": True}},
            {"type": "update_browse_history", "parameters": {"history": history}},
            {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
            {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["file:///home/user/page.html"]}},
        ],
        "evaluator": {
            "postconfig": [
                {"type": "launch", "parameters": {"command": ["pkill", "chrome"]}},
                {"type": "sleep", "parameters": {"seconds": 2}},
                {
                    "type": "launch",
                    "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]},
                },
            ],
            "func": "check_history_deleted",
            "result": {"type": "history", "dest": "history.sqlite"},
            "expected": {"type": "rule", "rules": {"type": "keywords", "keywords": ["youtube"]}},
        },
    }


@needs_chromium
@pytest.mark.skipif(not shutil.which("Xvfb"), reason="needs xvfb")
def test_the_desktops_chromium_keeps_the_injected_history_and_the_task_scores_it():
    from rz_agents.envs.osworld.desktop_env import DesktopEnv
    from rz_agents.envs.osworld.getters import get_state

    with DesktopEnv(require_a11y_tree=False, require_screenshot=False) as env:
        env.reset(_task([YOUTUBE, NEWS]))
        time.sleep(11)  # Chromium commits its history every 10 s: let the page's visit reach the file
        env.step("DONE")
        assert env.evaluate() == 0.0, env.last_evaluation  # the YouTube visit is still there
        rows = get_state(env.ctx, {"type": "history"})
        urls = [r[0] for r in rows]
        assert YOUTUBE["url"] in urls and NEWS["url"] in urls
        assert "file:///home/user/page.html" in urls  # Chromium's own visit went into the same database

        env.reset(_task([NEWS]))
        env.step("DONE")
        assert env.evaluate() == 1.0, env.last_evaluation
