"""Getters ported from OSWorld (commit 8942695): pure ones directly, the rest on the real desktop."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import shutil
import zipfile

import openpyxl
import pytest
from pptx import Presentation

from rz_agents.envs.osworld.getters import GETTERS, UNAVAILABLE
from rz_agents.envs.osworld.getters_more import (
    format_day,
    get_rule_relativeTime,
    last_row_as_text,
    relative_day,
)

WED = dt.datetime(2024, 1, 31, 10, 0)  # a Wednesday, the last day of a month


def test_format_day_fills_the_first_of_each_placeholder():
    day = dt.datetime(2024, 3, 5)
    assert format_day("{DoW}, {Month} {DayD} {Year}", day) == "Tue, Mar 5 2024"
    assert format_day("{Year}-{Month0D}-{Day0D} {month} {MonthFull}", day) == "2024-03-05 march March"
    assert format_day("{DayD}/{DayD}", day) == "5/{DayD}"  # only the first, as OSWorld's replace(..., 1)


def test_relative_days_follow_osworlds_arithmetic():
    assert relative_day("tomorrow", WED, "time") == dt.datetime(2024, 2, 1, 10, 0)
    assert relative_day("5th next month", WED, "time") == dt.datetime(2024, 2, 5)
    assert relative_day("10th next month", dt.datetime(2024, 12, 3), "from") == dt.datetime(2025, 1, 10)
    assert relative_day("next Monday", WED, "time").date() == dt.date(2024, 2, 5)
    assert relative_day("this Saturday", WED, "from").date() == dt.date(2024, 2, 3)
    assert relative_day("this Sunday", WED, "to").date() == dt.date(2024, 2, 4)
    assert relative_day("next Friday", WED, "to", "next Monday").date() == dt.date(2024, 2, 9)
    assert relative_day("next Friday", WED, "to", "tomorrow").date() == dt.date(2024, 2, 2)
    assert relative_day("first monday four months later", WED, "time").date() == dt.date(2024, 5, 6)
    with pytest.raises(ValueError):
        relative_day("11th next month", WED, "time")  # OSWorld has no branch for it there


def test_rule_relative_time_fills_a_copy_of_the_rules():
    config = {"rules": {"relativeTime": {"from": "tomorrow"}, "expected": {"time": "{Month} {DayD}"}}}
    out = get_rule_relativeTime(None, config, now=WED)
    assert out["expected"]["time"] == "Feb 1" and config["rules"]["expected"]["time"] == "{Month} {DayD}"
    span = {"rules": {"relativeTime": {"from": "next Monday", "to": "next Friday"},
                      "expected": {"from": "{DayD}", "to": "{DayD}"}}}  # fmt: skip
    assert get_rule_relativeTime(None, span, now=WED)["expected"] == {"from": "5", "to": "9"}


def test_last_row_as_text_prints_values_as_pandas_types_them(tmp_path):
    wb = openpyxl.Workbook()
    for row in [("Name", "Score", "Note"), ("a", 1, "x"), ("b", 2.5, None)]:
        wb.active.append(row)
    wb.save(tmp_path / "t.xlsx")
    assert last_row_as_text(str(tmp_path / "t.xlsx")) == ["b", "2.5", "nan"]


def test_every_getter_of_the_task_files_is_implemented_or_says_why_not():
    for kind in ("active_tab_html_parse", "vscode_config", "find_unpacked_extension_path", "audio_in_slide",
                 "background_image_in_slide", "content_from_vm_file", "default_video_player", "pdf_from_url",
                 "find_installed_extension_name", "new_startup_page", "time_diff_range",
                 "rule_relativeTime"):  # fmt: skip
        assert kind in GETTERS
    for kind in ("googledrive_file", "info_from_website", "calc_insensitive_md5"):
        assert kind not in GETTERS and UNAVAILABLE[kind]


# --- on the real desktop ----------------------------------------------------------------------------

needs_desktop = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("chromium") and shutil.which("openbox")),
    reason="needs xvfb, chromium and openbox (scripts/install.sh installs them)",
)


def _deck_with_audio(mp3: bytes) -> bytes:
    prs = Presentation()
    prs.slides.add_slide(prs.slide_layouts[6])
    buf = io.BytesIO()
    prs.save(buf)
    src, out = zipfile.ZipFile(io.BytesIO(buf.getvalue())), io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "ppt/slides/_rels/slide1.xml.rels":
                rel = (
                    '<Relationship Id="rId9" Type="http://schemas.microsoft.com/office/2007/relationships/media"'
                    ' Target="../media/media1.mp3"/><Relationship Id="rId10" Type="http://schemas.'
                    'openxmlformats.org/officeDocument/2006/relationships/audio" '
                    'Target="../media/media1.mp3"/>'
                )
                data = data.replace(b"</Relationships>", rel.encode() + b"</Relationships>")
            dst.writestr(item, data)
        dst.writestr("ppt/media/media1.mp3", mp3)
    return out.getvalue()


def _tagged_mp3(tmp_path) -> bytes:
    from mutagen.easyid3 import EasyID3

    path = tmp_path / "a.mp3"
    path.write_bytes(b"\xff\xfb\x90\x00" + b"\x00" * 200)
    tags = EasyID3()
    tags["title"] = "Slide Song"
    tags.save(str(path))
    return path.read_bytes()


def _write(path: str, data: bytes) -> dict:
    code = f"import base64, os; os.makedirs(os.path.dirname({path!r}), exist_ok=True); " + (
        f"open({path!r}, 'wb').write(base64.b64decode({base64.b64encode(data).decode()!r}))"
    )
    return {"type": "execute", "parameters": {"command": ["python3", "-c", code]}}


@needs_desktop
def test_profile_slide_and_sheet_getters_score_through_the_evaluator(tmp_path):
    from rz_agents.envs.osworld.desktop_env import DesktopEnv

    prefs = {
        "session": {"restore_on_startup": 5},
        "extensions": {"settings": {"abc": {"path": "/home/user/ext", "manifest": {"name": "My Ext"}}}},
    }
    wb = openpyxl.Workbook()
    for row in [("Item", "Cost"), ("pen", 2), ("ink", 3.5)]:
        wb.active.append(row)
    sheet = io.BytesIO()
    wb.save(sheet)
    page = (
        "<html><body><p class='price'>$3</p><p class='price'>$4</p><input id='q' value=' hi '></body></html>"
    )
    task = {
        "id": "rz-getters-more",
        "instruction": "Nothing to do.",
        "config": [
            _write("/home/user/.config/google-chrome/Default/Preferences", json.dumps(prefs).encode()),
            _write("/home/user/Desktop/costs.xlsx", sheet.getvalue()),
            _write("/home/user/Desktop/talk.pptx", _deck_with_audio(_tagged_mp3(tmp_path))),
            _write("/home/user/page.html", page.encode()),
            {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
            {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["file:///home/user/page.html"]}},
        ],
        "evaluator": {
            "func": [
                "exact_match",
                "is_expected_installed_extensions",
                "is_in_list",
                "exact_match",
                "check_mp3_meta",
                "check_direct_json_object",
            ],  # fmt: skip
            "result": [
                {"type": "new_startup_page"},
                {"type": "find_installed_extension_name"},
                {"type": "find_unpacked_extension_path"},
                {
                    "type": "content_from_vm_file",
                    "path": "/home/user/Desktop/costs.xlsx",
                    "file_type": "xlsx",
                    "file_content": "last_row",
                },  # fmt: skip
                {
                    "type": "audio_in_slide",
                    "ppt_file_path": "/home/user/Desktop/talk.pptx",
                    "slide_index": 0,
                    "dest": "audio.mp3",
                },  # fmt: skip
                {
                    "type": "active_tab_html_parse",
                    "category": "class",
                    "class_multiObject": {"price": {"1": "second"}},
                    "class_singleObject": {"price": "first"},
                },  # fmt: skip
            ],
            "expected": [
                {"type": "rule", "rules": {"expected": "true"}},
                {"type": "rule", "rules": {"expected": ["My Ext"]}},
                {"type": "rule", "rules": {"expected": "/home/user/ext"}},
                {"type": "rule", "rules": {"expected": ["ink", "3.5"]}},
                {"type": "rule", "rules": {"title": {"method": "eq", "ref": "Slide Song"}}},
                {"type": "rule", "rules": {"expected": {"first": "$3", "second": "$4"}}},
            ],
        },
    }
    with DesktopEnv(require_a11y_tree=False, require_screenshot=False) as env:
        env.reset(task)
        env.step("DONE")
        score = env.evaluate()
        assert score == 1.0, env.last_evaluation
        assert env.last_evaluation.metric_scores == [1.0] * 6
