"""Runnability check: every task gets a verdict, and each "no" names the exact reason."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from osworld_cli_helper import rz_osworld

from rz_agents.envs.osworld import LOCAL_TASKS
from rz_agents.envs.osworld.cache import download_paths
from rz_agents.envs.osworld.gsettings import gsettings_problem
from rz_agents.envs.osworld.live_web import LIVE_WEB_TASKS, PAGES_NOT_NEEDED
from rz_agents.envs.osworld.runnability import (
    APP_BINARIES,
    NEEDS_ROOT_TASKS,
    OFFLINE_SCORING_BLOCKERS,
    check_task,
    validate_dir,
)
from rz_agents.envs.osworld.session import atspi_problem
from rz_agents.envs.osworld.task import parse_task
from rz_agents.envs.osworld.terminal import terminal_problem
from rz_agents.envs.osworld.vscode import vscode_problem

# shared/ lies beside the repository checkout (CI clones elsewhere with a copy of shared/ beside it).
SHARED = next(
    (
        p
        for p in (
            Path(__file__).resolve().parents[3].parent / "shared/data/osworld/examples",
            Path("/work/shared/data/osworld/examples"),
        )
        if p.is_dir()
    ),
    Path("/work/shared/data/osworld/examples"),
)
RULE = {"type": "rule", "rules": {"expected": "1"}}
HOTKEY = "import pyautogui; pyautogui.hotkey('ctrl', 'alt', 't')"


def _task(config=(), apps=("os",), **ev):
    evaluator = {"func": "exact_match", "result": RULE, "expected": RULE}
    evaluator.update(ev)
    return parse_task(
        {
            "id": "t",
            "instruction": "i",
            "snapshot": "os",
            "config": list(config),
            "related_apps": list(apps),
            "evaluator": evaluator,
        }
    )


def _categories(task, cache="/nonexistent-cache"):
    return [c for c, _ in check_task(task, cache).reasons]


def test_plain_task_is_runnable():
    assert check_task(_task(), "/x").runnable


def test_download_needs_internet_unless_cached(tmp_path):
    url, path = "https://example.org/f.txt", "/home/user/Desktop/f.txt"
    task = _task([{"type": "download", "parameters": {"files": [{"url": url, "path": path}]}}])
    assert _categories(task, str(tmp_path)) == ["needs internet download"]
    cached = Path(download_paths(str(tmp_path), "t", url, path)[0])
    cached.parent.mkdir(parents=True)
    cached.write_text("data")
    assert check_task(task, str(tmp_path)).runnable


def test_remote_pages_and_package_installs_need_internet():
    tabs = _task([{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://www.apple.com"]}}])
    assert _categories(tabs) == ["needs internet (web page)"]
    local = _task(
        [
            {
                "type": "chrome_open_tabs",
                "parameters": {"urls_to_open": ["file:///home/user/a.html", "http://127.0.0.1:8000/"]},
            }
        ]
    )
    assert check_task(local, "/x").runnable
    apt = _task(
        [
            {
                "type": "execute",
                "parameters": {"command": "echo password | sudo -S apt-get install zsh -y", "shell": True},
            }
        ]
    )
    assert "needs internet (package install)" in _categories(apt)


def test_missing_app_step_getter_metric_are_each_named(monkeypatch):
    assert _categories(_task(apps=["gimp"])) == (["app not installed"] if not shutil.which("gimp") else [])
    assert _categories(_task([{"type": "no_such_step", "parameters": {}}])) == ["setup step not implemented"]
    assert _categories(_task(result={"type": "no_such_getter"})) == ["getter not implemented"]
    web_pdf = _task(result={"type": "pdf_from_url", "path": "https://example.org/a", "dest": "a.pdf"})
    assert _categories(web_pdf) == ["needs internet (web page)"]
    assert _categories(_task(func="no_such_metric")) == ["metric not implemented"]
    assert _categories(_task(func="compare_audios")) == []  # librosa and fastdtw come with the extra
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a, **k: None if n == "fastdtw" else real(n, *a, **k)
    )
    assert _categories(_task(func="compare_audios")) == ["metric needs a library or tool not here"]
    bad_rule = _task(func="compare_table", options={"rules": [{"type": "sheet_magic"}]})
    assert _categories(bad_rule) == ["metric option not implemented"]
    assert _categories(_task(func="")) == ["no evaluator defined"]


def _without(monkeypatch, *programs):
    """Make ``shutil.which`` (as every check sees it) miss ``programs``."""
    real = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name in programs else real(name, *a, **k)
    )


def test_terminal_tasks_count_only_with_gnome_terminal_installed(monkeypatch):
    hotkey = {"type": "execute", "parameters": {"command": ["python", "-c", HOTKEY]}}
    terminal = _task([hotkey], result={"type": "vm_terminal_output"})
    if terminal_problem() is None and atspi_problem() is None:
        assert check_task(terminal, "/x").runnable
    _without(monkeypatch, "gnome-terminal")
    reasons = check_task(terminal, "/x").reasons
    assert [c for c, _ in reasons] == [
        "needs GNOME desktop (terminal shortcut Ctrl+Alt+T)",
        "getter unavailable here",
    ]
    assert all("apt-get install gnome-terminal" in detail for _, detail in reasons)


def test_gsettings_commands_count_only_with_dconf_and_their_schema(monkeypatch):
    def gs(schema):
        cmd = f"export DBUS_SESSION_BUS_ADDRESS='unix:path=/run/user/1000/bus'\ngsettings get {schema} k"
        return _task(result={"type": "vm_command_line", "command": cmd, "shell": True})

    reasons = check_task(gs("org.example.not.a.schema"), "/x").reasons
    assert [c for c, _ in reasons] == ["needs GNOME desktop: gsettings"]
    if gsettings_problem() is None:
        assert reasons[0][1] == "GSettings schema org.example.not.a.schema is not installed"
    if gsettings_problem(["org.gnome.desktop.interface"]) is None:
        assert check_task(gs("org.gnome.desktop.interface"), "/x").runnable
    _without(monkeypatch, "dbus-daemon")
    assert [c for c, _ in check_task(gs("org.gnome.desktop.interface"), "/x").reasons] == [
        "needs GNOME desktop: gsettings"
    ]
    wallpaper = _task(func="compare_images", result={"type": "vm_wallpaper", "dest": "w.png"})
    assert [c for c, _ in check_task(wallpaper, "/x").reasons] == ["getter unavailable here"]


def test_commands_missing_here_and_gnome_only_commands(monkeypatch):
    def cmd(text):
        return _task(result={"type": "vm_command_line", "command": text, "shell": True})

    cats = _categories(cmd("gnome-shell --replace; surely-not-a-command-xyz --x"))
    assert "needs GNOME desktop" in cats and "command not installed" in cats
    # GNOME's own apps run on this desktop when installed; without them the reason names the package.
    _without(monkeypatch, "nautilus")
    reasons = check_task(cmd("nautilus ~"), "/x").reasons
    assert reasons == [("needs GNOME desktop", "nautilus (not installed: apt-get install nautilus)")]
    monkeypatch.undo()
    if shutil.which("nautilus"):
        assert check_task(cmd("nautilus ~"), "/x").runnable
    ok = _task(
        result={"type": "vm_command_line", "command": "[ -d ~/x ] && echo yes 2>&1 || echo no", "shell": True}
    )
    assert check_task(ok, "/x").runnable


def test_infeasible_tasks_need_no_getters():
    assert check_task(_task(func="infeasible", result={"type": "pdf_from_url"}), "/x").runnable


def test_local_task_set_is_fully_runnable_here():
    report = validate_dir(LOCAL_TASKS, "/nonexistent-cache")
    assert report["total"] == report["parsed"] == report["runnable"] >= 10
    assert report["not_runnable"] == {}


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared OSWorld examples not present")
def test_cli_validate_json_on_shared_examples():
    env = dict(os.environ, RZ_OSWORLD_CACHE="/nonexistent-cache")
    proc = subprocess.run(
        [sys.executable, "-m", "rz_agents", "osworld", "validate", str(SHARED), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["total"] == report["parsed"] == len(list(SHARED.rglob("*.json")))
    assert report["runnable"] + sum(report["not_runnable"].values()) == report["parsed"]
    assert 0 < report["runnable"] < report["parsed"]
    for task in report["tasks"]:
        assert task["runnable"] == (task["reasons"] == [])
    reasons = set(report["reasons"])
    assert {
        "app not installed",
        "needs internet download",
        "needs internet (web page)",
        "no evaluator defined",
    } <= reasons


def test_cli_validate_exits_nonzero_on_a_bad_file(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert rz_osworld("validate", str(tmp_path), "--json") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["parsed"] == 0 and "must be a JSON object" in next(iter(report["parse_errors"].values()))


def test_cli_validate_text_report_names_reasons(tmp_path, capsys):
    task = {
        "id": "t",
        "instruction": "i",
        "related_apps": ["gimp-not-here"],
        "evaluator": {"func": "exact_match"},
    }
    (tmp_path / "t.json").write_text(json.dumps(task))
    assert rz_osworld("validate", str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert (
        "NOT runnable" in out
        and "app not installed: gimp-not-here" in out
        and "1/1 parsed, 0 runnable" in out
    )


def test_vscode_tasks_count_with_code_server_and_without_a_marketplace_download(monkeypatch):
    launch = {"type": "launch", "parameters": {"command": ["code"]}}
    listing = {"type": "vm_command_line", "command": ["code", "--list-extensions", "|", "grep", "pub.ext"]}
    contain = {"type": "rule", "rules": {"type": "contain", "expected": "pub.ext"}}
    vsix = {
        "type": "download",
        "parameters": {"files": [{"url": "https://example.org/x", "path": "/home/user/x.vsix"}]},
    }
    local = _task(
        [vsix, launch], apps=["vscode"], func="is_extension_installed", result=listing, expected=contain
    )
    store = _task([launch], apps=["vscode"], func="is_extension_installed", result=listing, expected=contain)
    marketplace = _task(
        [{"type": "command", "parameters": {"command": ["code", "--install-extension", "ms-python.python"]}}],
        apps=["vscode"],
    )
    if vscode_problem() is None:
        assert check_task(local, "/x", assume_cached=True).runnable
    assert ("needs internet (extension marketplace)", "code --list-extensions | grep pub.ext") in check_task(
        store, "/x", assume_cached=True
    ).reasons
    assert ("needs internet (extension marketplace)", "ms-python.python") in check_task(
        marketplace, "/x"
    ).reasons
    _without(monkeypatch, "code-server")
    reasons = check_task(local, "/x", assume_cached=True).reasons
    assert reasons[0][0] == "app not installed" and "install code-server" in reasons[0][1]


def test_multi_app_names_map_to_installed_apps(monkeypatch):
    """The multi-app tasks' related_apps names (any case) need the program standing for each."""
    for app, program in (("pdf", "evince"), ("image", "eog"), ("Writer", "soffice"), ("calc", "soffice"),
                         ("browser", "chromium"), ("Chrome", "chromium")):  # fmt: skip
        task = _task(apps=(app,))
        if shutil.which(program):
            assert check_task(task, "/x").runnable, app
        _without(monkeypatch, *APP_BINARIES[app.lower()])
        assert check_task(task, "/x").reasons == [("app not installed", app)], app
        monkeypatch.undo()
    assert check_task(_task(apps=("multiapps", "OS", "terminal")), "/x").runnable
    assert check_task(_task(apps=("no-such-app",)), "/x").reasons == [("app not installed", "no-such-app")]


def test_setup_package_installs_count_when_installed_here(monkeypatch):
    """A setup's apt-get / pip install succeeds on the desktop (its apt and pip wrappers) for packages
    the host has; any other package, a snap, or an install the evaluator runs needs the internet."""
    import rz_agents.envs.osworld.runnability as runnability

    monkeypatch.setattr(runnability, "installed_packages", lambda: ("unzip", "xsel"))
    # the host these packages are installed on has their programs (not this one: the default install has no
    # xsel, an --osworld-apps program)
    real = shutil.which
    monkeypatch.setattr(
        shutil,
        "which",
        lambda name, *a, **k: f"/usr/bin/{name}" if name in ("unzip", "xsel") else real(name, *a, **k),
    )

    def setup(command):
        return _task(config=[{"type": "execute", "parameters": {"command": command, "shell": True}}])

    ok = (
        "echo password | sudo -S apt-get update -y && echo password | sudo -S apt-get install unzip -y"
        " && unzip a"
    )
    assert check_task(setup(ok), "/x").runnable
    assert check_task(setup("sudo apt install xsel && xsel -bc"), "/x").runnable
    reasons = check_task(setup("sudo apt-get install -y sysstat unzip"), "/x").reasons
    assert [c for c, _ in reasons] == ["needs internet (package install)"]
    assert reasons[0][1].startswith("sysstat (not installed here)")
    # pip installs: what the desktop's Python (this one) has succeeds; anything else names the package
    assert check_task(setup("echo password | sudo -S pip install pytest 'ruff>=0.1'"), "/x").runnable
    reasons = check_task(setup("pip install -q pytest no-such-dist-rz"), "/x").reasons
    assert [c for c, _ in reasons] == ["needs internet (package install)"]
    assert reasons[0][1].startswith("pip install no-such-dist-rz (not installed here; scripts/install.sh")
    for source in ("-r requirements.txt", "-e .", "./dist/x.whl"):  # cannot be checked offline: never "here"
        reasons = check_task(setup(f"pip install --no-cache-dir pytest {source}"), "/x").reasons
        assert [c for c, _ in reasons] == ["needs internet (package install)"], source
        assert reasons[0][1].startswith(f"pip install {source} (not installed here"), source
    assert "needs internet (package install)" in _categories(setup("sudo snap install code"))
    scored = _task(result={"type": "vm_command_line", "command": "apt-get install unzip", "shell": True})
    assert "needs internet (package install)" in _categories(scored)


def test_validate_names_the_packages_setups_install_and_whether_they_are_here(tmp_path, monkeypatch):
    import rz_agents.envs.osworld.runnability as runnability

    monkeypatch.setattr(runnability, "installed_packages", lambda: ("unzip",))
    (tmp_path / "os").mkdir()
    command = "sudo apt-get install -y unzip zsh && pip install pytest no-such-dist-rz"
    step = {"type": "execute", "parameters": {"command": command, "shell": True}}
    raw = {"id": "p", "instruction": "i", "snapshot": "os", "related_apps": ["os"], "config": [step],
           "evaluator": {"func": "exact_match", "result": RULE, "expected": RULE}}  # fmt: skip
    (tmp_path / "os" / "p.json").write_text(json.dumps(raw))
    report = validate_dir(tmp_path, "/x")
    assert report["setup_packages"] == {
        "pip": {
            "pytest": {"installed": True, "tasks": ["p"]},
            "no-such-dist-rz": {"installed": False, "tasks": ["p"]},
        },
        "apt": {"unzip": {"installed": True, "tasks": ["p"]}, "zsh": {"installed": False, "tasks": ["p"]}},
    }
    reasons = report["tasks"][0]["reasons"]
    assert any("zsh (not installed here)" in r for r in reasons) and any(
        "no-such-dist-rz" in r for r in reasons
    )


def test_tasks_whose_instruction_needs_the_web_name_it():
    task_id = next(iter(LIVE_WEB_TASKS))
    raw = {"id": task_id, "instruction": "i", "snapshot": "os", "related_apps": ["os"],
           "evaluator": {"func": "exact_match", "result": RULE, "expected": RULE}}  # fmt: skip
    assert check_task(parse_task(raw), "/x").reasons == [
        ("needs internet (the instruction's web pages)", LIVE_WEB_TASKS[task_id])
    ]
    official = Path(__file__).parents[3] / "rz_agents/envs/osworld/official/examples/multi_apps"
    assert all((official / f"{i}.json").is_file() for i in LIVE_WEB_TASKS)  # ids of packaged tasks


def test_live_pages_a_task_does_not_need_are_no_blocker_for_it_alone():
    """Pages opened in the setup block a task unless it is listed in ``PAGES_NOT_NEEDED`` (scored on
    the desktop's files; the tabs show Chromium's error page offline)."""
    tabs = [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://example.org/"]}}]
    raw = {"instruction": "i", "snapshot": "os", "related_apps": ["os"], "config": tabs,
           "evaluator": {"func": "exact_match", "result": RULE, "expected": RULE}}  # fmt: skip
    listed = next(iter(PAGES_NOT_NEEDED))
    assert check_task(parse_task({**raw, "id": listed}), "/x").runnable
    reasons = check_task(parse_task({**raw, "id": "other"}), "/x").reasons
    assert reasons == [("needs internet (web page)", "https://example.org/")]
    official = Path(__file__).parents[3] / "rz_agents/envs/osworld/official/examples/multi_apps"
    folders = [official, *([SHARED / "chrome"] if SHARED.is_dir() else [])]
    assert all(any((f / f"{i}.json").is_file() for f in folders) for i in PAGES_NOT_NEEDED)


def test_tasks_that_cannot_score_offline_name_why_in_their_own_domain_only():
    """Keyed by (domain, id): chrome and thunderbird share ids (06fe7178 is a tab task in chrome only)."""
    (domain, task_id), (category, detail) = next(iter(OFFLINE_SCORING_BLOCKERS.items()))
    raw = {"id": task_id, "instruction": "i", "related_apps": [],
           "evaluator": {"func": "exact_match", "result": RULE, "expected": RULE}}  # fmt: skip
    assert (category, detail) in check_task(parse_task({**raw, "snapshot": domain}), "/x").reasons
    # in another domain the same id is not blocked (whether that domain's app is installed here is apart)
    other = check_task(parse_task({**raw, "snapshot": "thunderbird"}), "/x").reasons
    assert (category, detail) not in other
    assert all(c == "app not installed" for c, _ in other), other


def test_tasks_that_need_root_name_it():
    task_id = next(iter(NEEDS_ROOT_TASKS))
    raw = {"id": task_id, "instruction": "i", "snapshot": "os", "related_apps": ["os"],
           "evaluator": {"func": "exact_match", "result": RULE, "expected": RULE}}  # fmt: skip
    assert check_task(parse_task(raw), "/x").reasons == [
        ("needs root (the desktop has none to become)", NEEDS_ROOT_TASKS[task_id])
    ]


def test_online_setup_steps_are_named_as_needing_the_internet():
    for step in ("googledrive", "login"):
        reasons = check_task(_task(config=[{"type": step, "parameters": {}}]), "/x").reasons
        assert [c for c, _ in reasons] == ["needs internet (setup step)"] and reasons[0][1].startswith(step)
    assert _categories(_task(config=[{"type": "no_such_step", "parameters": {}}])) == [
        "setup step not implemented"
    ]


def test_systemd_tools_are_named_as_unavailable():
    """The desktop runs no systemd: a task reading or setting the clock through timedatectl (in its
    setup, postconfig or getter) cannot be scored here."""
    getter = _task(result={"type": "vm_command_line", "command": "timedatectl status", "shell": True})
    assert _categories(getter) == ["needs systemd (the desktop runs none)"]
    post = _task(
        postconfig=[{"type": "command", "parameters": {"command": ["timedatectl", "set-time", "16:00"]}}]
    )
    assert _categories(post) == ["needs systemd (the desktop runs none)"]
