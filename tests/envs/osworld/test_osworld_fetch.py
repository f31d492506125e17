"""The input-file cache: ``rz osworld fetch`` fills it from a (test) web server, ``validate`` reads it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from osworld_cli_helper import rz_osworld

from rz_agents.envs.osworld.cache import cloud_file_path, download_paths, missing_inputs, remote_inputs
from rz_agents.envs.osworld.fetch import _drive_confirmation
from rz_agents.envs.osworld.task import parse_task

FILES = {"/report.xlsx": b"PK\x03\x04 spreadsheet bytes", "/gold.docx": b"PK\x03\x04 gold bytes"}


@pytest.fixture(scope="module")
def server():
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = FILES.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *a):
            return

    # 127.0.0.2 is loopback too, but not a "local URL" to the runnability check (127.0.0.1/localhost
    # are): the task's inputs count as remote, as a cloud drive's would, and this server plays the web.
    srv = ThreadingHTTPServer(("127.0.0.2", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.2:{srv.server_address[1]}"
    srv.shutdown()


def task(base: str, missing: bool = False) -> dict:
    return {
        "id": "t-fetch",
        "instruction": "Fix the report.",
        "config": [
            {
                "type": "download",
                "parameters": {"files": [{"url": f"{base}/report.xlsx", "path": "/home/user/report.xlsx"}]},
            }
        ],
        "evaluator": {
            "func": "compare_table",
            "result": {"type": "vm_file", "path": "/home/user/report.xlsx", "dest": "report.xlsx"},
            "expected": {
                "type": "cloud_file",
                "path": f"{base}/{'nope' if missing else 'gold'}.docx",
                "dest": "gold.docx",
            },
            "options": {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]},
        },
    }


def test_remote_inputs_lists_downloads_and_cloud_files(tmp_path):
    t = parse_task(task("https://example.org"))
    inputs = remote_inputs(t, str(tmp_path))
    assert [(i.kind, i.cache_path) for i in inputs] == [
        (
            "download",
            download_paths(
                str(tmp_path), "t-fetch", "https://example.org/report.xlsx", "/home/user/report.xlsx"
            )[0],
        ),
        ("cloud_file", cloud_file_path(str(tmp_path), "t-fetch", "gold.docx")),
    ]
    assert len(missing_inputs(t, str(tmp_path))) == 2


def test_fetch_fills_the_cache_then_validate_finds_the_task_runnable(tmp_path, server, capsys):
    tasks, cache = tmp_path / "tasks" / "libreoffice_calc", tmp_path / "cache"
    tasks.mkdir(parents=True)
    (tasks / "t-fetch.json").write_text(json.dumps(task(server)))
    assert rz_osworld("validate", str(tasks.parent), "--cache", str(cache), "--json") == 0
    before = json.loads(capsys.readouterr().out)
    assert before["runnable"] == 0 and before["not_runnable"] == {"needs internet download": 1}
    assert rz_osworld("validate", str(tasks.parent), "--cache", str(cache), "--assume-cached", "--json") == 0
    assert json.loads(capsys.readouterr().out)["runnable"] == 1

    assert rz_osworld("fetch", str(tasks.parent), "--cache", str(cache)) == 0
    assert "2 files downloaded, 0 already cached, 0 failed" in capsys.readouterr().out
    cached = Path(cloud_file_path(str(cache), "t-fetch", "gold.docx"))
    assert cached.read_bytes() == FILES["/gold.docx"]
    assert not list(cache.rglob(".part-*"))  # written atomically
    assert rz_osworld("fetch", str(tasks.parent), "--cache", str(cache)) == 0
    assert "0 files downloaded, 2 already cached" in capsys.readouterr().out
    assert rz_osworld("validate", str(tasks.parent), "--cache", str(cache), "--json") == 0
    assert json.loads(capsys.readouterr().out)["runnable"] == 1


def test_fetch_reports_a_failed_download_and_exits_1(tmp_path, server, capsys):
    (tmp_path / "t.json").write_text(json.dumps(task(server, missing=True)))
    assert rz_osworld("fetch", str(tmp_path), "--cache", str(tmp_path / "cache")) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "nope.docx" in out and "404" in out
    assert "1 files downloaded, 0 already cached, 1 failed" in out


def test_validate_counts_the_test_subset_next_to_the_examples(tmp_path, capsys):
    examples = tmp_path / "examples" / "os"
    examples.mkdir(parents=True)
    for tid in ("a", "b"):
        (examples / f"{tid}.json").write_text(
            json.dumps({"id": tid, "instruction": "i", "evaluator": {"func": "infeasible"}})
        )
    (examples / "a-win.json").write_text(
        json.dumps({"id": "a", "instruction": "i", "evaluator": {"func": "infeasible"}})
    )
    (tmp_path / "test_all.json").write_text(json.dumps({"os": ["a", "zzz"], "gimp": ["q"]}))
    assert rz_osworld("validate", str(tmp_path / "examples"), "--json") == 0
    subset = json.loads(capsys.readouterr().out)["subset"]
    assert (subset["listed"], subset["found"], subset["runnable"]) == (3, 1, 1)
    assert subset["by_domain"] == {"os": {"total": 1, "runnable": 1}}


def test_google_drive_warning_page_yields_the_confirmation_link():
    page = (
        '<form id="download-form" action="https://drive.usercontent.google.com/download" method="get">'
        '<input type="hidden" name="id" value="abc"><input type="hidden" name="confirm" value="t">'
        '<input type="hidden" name="uuid" value="u-1"></form>'
    )
    assert _drive_confirmation(page, "https://drive.google.com/uc?id=abc") == (
        "https://drive.usercontent.google.com/download?id=abc&confirm=t&uuid=u-1"
    )
    assert _drive_confirmation("<html>no access</html>", "https://drive.google.com/uc?id=abc") is None
