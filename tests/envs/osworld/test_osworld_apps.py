"""An OSWorld LibreOffice Calc task end to end: input from the cache, opened by xdg-open, edited by
pyautogui, saved by the task's postconfig (no "Keep format?" dialog) and scored by compare_table.

Slow (LibreOffice starts in ~10 s) and needs `scripts/install.sh --osworld-apps`: not in CI's run.
"""

from __future__ import annotations

import os
import shutil
import time

import openpyxl
import pytest

from rz_agents.envs.osworld.cache import download_paths
from rz_agents.envs.osworld.desktop_env import DesktopEnv

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (shutil.which("soffice") and shutil.which("xdg-open")), reason="needs LibreOffice"
    ),
]

URL = "https://drive.example.org/download?id=multiply"
TASK = {
    "id": "calc-multiply",
    "instruction": "Put the total earned amount in E3.",
    "config": [
        {"type": "download", "parameters": {"files": [{"url": URL, "path": "/home/user/Multiply.xlsx"}]}},
        {"type": "open", "parameters": {"path": "/home/user/Multiply.xlsx"}},
    ],
    "evaluator": {
        "postconfig": [
            {
                "type": "activate_window",
                "parameters": {"window_name": "Multiply.xlsx - LibreOffice Calc", "strict": True},
            },
            {"type": "sleep", "parameters": {"seconds": 0.5}},
            {
                "type": "execute",
                "parameters": {
                    "command": ["python", "-c", "import pyautogui; pyautogui.hotkey('ctrl', 's')"]
                },
            },
            {"type": "sleep", "parameters": {"seconds": 2}},
        ],
        "func": "compare_table",
        "result": {"type": "vm_file", "path": "/home/user/Multiply.xlsx", "dest": "Multiply.xlsx"},
        "options": {
            "rules": [
                {
                    "type": "check_cell",
                    "sheet_idx": 0,
                    "coordinate": "E3",
                    "props": {"value": {"method": "approx:0.001", "ref": 191.6667}},
                }
            ]
        },  # fmt: skip
    },
}


def test_calc_task_from_the_cache_is_edited_saved_and_scored(tmp_path):
    cached = download_paths(str(tmp_path), TASK["id"], URL, "/home/user/Multiply.xlsx")[0]
    os.makedirs(os.path.dirname(cached))
    wb = openpyxl.Workbook()
    wb.active["A3"], wb.active["E3"] = "Total", 1
    wb.save(cached)
    with DesktopEnv(download_cache=str(tmp_path), require_screenshot=False) as env:
        env.reset(TASK)
        deadline = time.monotonic() + 90
        while not any("Multiply.xlsx - LibreOffice Calc" == w["name"] for w in env.ctx.client.windows()):
            assert time.monotonic() < deadline, "LibreOffice never opened the file"
            time.sleep(0.5)
        time.sleep(3)  # the window settles (toolbars, sidebar)
        keys = (
            "pyautogui.click(900, 600); pyautogui.hotkey('ctrl', 'home'); "
            "pyautogui.press(['right'] * 4 + ['down'] * 2)"
        )
        env.step(f"{keys}; pyautogui.typewrite('=191.6667'); pyautogui.press('enter')", pause=1)
        env.step("DONE")
        assert env.evaluate() == 1.0, env.last_evaluation
        names = [w["name"] for w in env.ctx.client.windows()]
        assert not any("Format" in n or "Tip of the Day" in n for n in names), names  # no dialog came up
