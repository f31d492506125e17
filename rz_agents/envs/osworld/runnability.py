"""Can a task run on this machine? Static checks with a precise reason for every "no".

Checks, in order: an evaluator exists; the related apps are installed; every setup/postconfig
step, getter and metric is implemented (and usable here); downloads are in the cache or local;
pages to open are local; commands the task runs exist here and need no package installs or
GNOME Shell (``gsettings`` works when its schemas and dconf are here, Ctrl+Alt+T when GNOME Terminal
is). ``validate_dir`` summarises a folder as ``rz osworld validate`` prints it.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rz_agents.envs.osworld.cache import is_local_url, missing_inputs
from rz_agents.envs.osworld.getters import GETTERS, UNAVAILABLE, getter_problem
from rz_agents.envs.osworld.gsettings import gsettings_problem, schemas_in
from rz_agents.envs.osworld.live_web import LIVE_WEB_TASKS, PAGES_NOT_NEEDED
from rz_agents.envs.osworld.metrics import METRICS, SPECIAL_METRICS, blocker, option_problem
from rz_agents.envs.osworld.providers.wrappers import (
    installed_packages,
    missing_pip_packages,
    pip_requirements,
)
from rz_agents.envs.osworld.setup_steps import STEPS
from rz_agents.envs.osworld.task import Task, TaskFormatError, load_tasks
from rz_agents.envs.osworld.terminal import terminal_problem
from rz_agents.envs.osworld.vscode import vscode_problem

# related_apps / snapshot names -> executables any of which makes the app available.
APP_BINARIES: dict[str, tuple[str, ...]] = {
    "chrome": ("chromium", "chromium-browser", "google-chrome"),
    "gimp": ("gimp",),
    "libreoffice_calc": ("soffice", "libreoffice"),
    "libreoffice calc": ("soffice", "libreoffice"),
    "libreoffice_writer": ("soffice", "libreoffice"),
    "libreoffice_impress": ("soffice", "libreoffice"),
    "msoffice_excel": ("excel",),
    "thunderbird": ("thunderbird",),
    "vlc": ("vlc",),
    # The multi-app tasks' names: LibreOffice and the browser by other names; Ubuntu's PDF and image
    # viewers (Document Viewer, Image Viewer), which files open in as on the VM (home_defaults.py);
    # Ubuntu's "Videos" (Totem) where installed, else VLC, the video player the VM also has (the one
    # task naming it opens a video to cut its subtitles, which Totem cannot do).
    "calc": ("soffice", "libreoffice"),
    "writer": ("soffice", "libreoffice"),
    "libreoffice": ("soffice", "libreoffice"),
    "browser": ("chromium", "chromium-browser", "google-chrome"),
    "pdf": ("evince",),
    "image": ("eog",),
    "ubuntu_media_player": ("totem", "vlc"),
    "picard": ("picard",),
}
VSCODE_APPS = ("vscode", "vs_code")  # the desktop's `code` runs code-server (vscode.py)
# No program of their own: the desktop itself (the multi-app tasks' snapshot is "multiapps").
NO_BINARY_APPS = ("os", "base_setup", "terminal", "multiapps")

SHELL_WORDS = {
    "cd", "echo", "export", "[", "[[", "if", "then", "else", "elif", "fi", "for", "do", "done", "while",
    "test", "true", "false", "set", "source", ".", "exit", "read", "printf", "case", "esac", "local",
    "return", "{", "}", "!", "sudo", "exec", "eval", "unset", "shift", "wait", "kill", "time",
}  # fmt: skip
GNOME_SHELL = {"gnome-shell"}  # no stand-in: openbox is the window manager
# systemd's control tools: the desktop runs no systemd (no timedated, logind or system bus), so e.g.
# `timedatectl status` prints nothing a metric can read and `timedatectl set-time` cannot move the clock.
SYSTEMD_TOOLS = {"timedatectl", "loginctl", "hostnamectl", "localectl", "systemctl"}
# GNOME's own applications run on any X desktop with a session bus, when installed.
GNOME_APPS = {"nautilus": "nautilus", "gnome-screenshot": "gnome-screenshot"}
APT_INSTALL = re.compile(r"\bapt(?:-get)?\s+((?:-\S+\s+)*)install\b((?:\s+[^\s;&|]+)*)")
PIP_INSTALL = re.compile(r"\bpip3?\s+((?:-\S+\s+)*)install\b((?:\s+[^\s;&|]+)*)")
PIP_SOURCE = "scripts/install.sh --osworld-apps installs it from the package index"
GSETTINGS_COMMANDS = {"gsettings", "dconf"}  # work on the desktop's own session bus (gsettings.py)
TERMINAL_HOTKEY = re.compile(r"""hotkey\(\s*['"]ctrl['"]\s*,\s*['"]alt['"]\s*,\s*['"]t['"]""")
# OSWorld's setup steps that act on live web services (they cannot be stood in for offline).
ONLINE_STEPS = {
    "googledrive": "uploads to / clears a Google Drive account through its API (internet and credentials)",
    "login": "logs in to a website in Chrome (internet and an account)",
}
# Tasks whose work needs root on the machine: the desktop runs as one unprivileged user with no root
# to become (its sudo runs the command as that user; /etc is read-only).
NEEDS_ROOT_TASKS = {
    "5812b315-e7bd-4265-b51f-863c02174c28": "creates a user account with a password (useradd, chpasswd), "
    "scored through getent passwd",
}
# Tasks whose page content is not needed, yet which cannot score offline, and why (measured on this
# desktop). Key: (domain, id): chrome and thunderbird share some ids.
TABS_OFFLINE = (
    "needs internet (tabs' URLs)",
    "scored on the open tabs' URLs: offline a live page's tab reports chrome-error://chromewebdata/ "
    "(Playwright's page.url, which OSWorld's getter reads), so the setup's tabs cannot match",
)
OFFLINE_SCORING_BLOCKERS: dict[tuple[str, str], tuple[str, str]] = {
    ("chrome", "06fe7178-4491-4589-810f-2e2bc9502122"): TABS_OFFLINE,  # reopen the closed tab
    ("multi_apps", "58565672-7bfe-48ab-b828-db349231de6b"): TABS_OFFLINE,  # an e-mail's link in a new tab
    ("multi_apps", "e135df7c-7687-4ac0-a5f0-76b74438b53e"): TABS_OFFLINE,  # xlsx to html, viewed in Chrome
    ("chrome", "3299584d-8f11-4457-bf4c-ce98f7600250"): (
        "needs a used Chrome profile",
        "its setup edits Chrome's Preferences with jq before Chrome starts: OSWorld's used profile has "
        "that file, a fresh desktop profile not until Chromium first writes it (~10 s after launch), so "
        "the edit fails and the untouched desktop would score 1",
    ),
}
URL_IN_TEXT = re.compile(r"https?://[^\s'\"<>]+")


@dataclass
class Runnability:
    """Whether a task can run here; ``reasons`` are ``(category, detail)`` pairs, empty when it can."""

    task_id: str
    path: str
    domain: str
    reasons: list[tuple[str, str]] = field(default_factory=list)

    @property
    def runnable(self) -> bool:
        """True when nothing stands in the way."""
        return not self.reasons


def _command_text(command: Any) -> str:
    if isinstance(command, list):
        return " ".join(str(c) for c in command)
    return str(command or "")


def _command_heads(command: Any) -> list[str]:
    """The programs a command runs (first word of each shell segment), skipping shell words."""
    if isinstance(command, list):
        return [str(command[0])] if command else []
    heads = []
    for segment in re.split(r"[;&|\n()]+|\$\(", str(command)):
        try:
            words = shlex.split(segment, comments=True)
        except ValueError:
            words = segment.split()
        while words and (
            re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] in ("sudo", "-S", "nohup")
        ):
            words = words[1:]
        # Only words that look like program names (not numbers from 2>&1, not quoted fragments).
        if words and words[0] not in SHELL_WORDS and re.fullmatch(r"[A-Za-z_./][\w.+/-]*", words[0]):
            heads.append(words[0])
    return heads


def _apt_packages(text: str) -> list[str] | None:
    """The packages an ``apt``/``apt-get install`` in ``text`` names; None when there is none."""
    found = APT_INSTALL.findall(text)
    if not found:
        return None
    return [w for _opts, words in found for w in words.split() if not w.startswith("-")]


def _pip_packages(text: str) -> list[str] | None:
    """The distributions a ``pip install`` in ``text`` names; None when there is none."""
    found = PIP_INSTALL.findall(text)
    if not found:
        return None
    names = []
    for _opts, words in found:
        try:
            names += pip_requirements(shlex.split(words))
        except ValueError:  # an unbalanced quote: the words as they stand
            names += pip_requirements(words.split())
    return names


def _check_command(command: Any, add: Any, wrapped: set[str], setup: bool = False) -> None:
    """``setup``: a task's own setup step, whose ``apt-get install`` of packages installed here
    succeeds on the desktop as on the VM, and whose ``pip install`` of packages the desktop's
    Python has, likewise (``providers/wrappers.py``)."""
    text = _command_text(command)
    apt = _apt_packages(text) if setup else None
    pip = _pip_packages(text) if setup else None
    if re.search(r"\bsnap\s+(-\S+\s+)*install\b", text) or (
        not setup and re.search(r"\b(apt-get|apt|pip3?)\s+(-\S+\s+)*install\b", text)
    ):
        add("needs internet (package install)", text[:120])
    if apt:
        missing = [p for p in apt if re.split(r"[=:]", p)[0] not in installed_packages()]
        if missing:
            add("needs internet (package install)", f"{' '.join(missing)} (not installed here): {text[:120]}")
    if pip:
        missing = missing_pip_packages(pip)
        if missing:
            add(
                "needs internet (package install)",
                f"pip install {' '.join(missing)} (not installed here; {PIP_SOURCE}): {text[:80]}",
            )
    for ext in re.findall(r"--install-extension[\s=]+(\S+)", text):
        if not ext.lower().endswith(".vsix"):
            add("needs internet (extension marketplace)", ext)
    if TERMINAL_HOTKEY.search(text):
        problem = terminal_problem()
        if problem:
            add("needs GNOME desktop (terminal shortcut Ctrl+Alt+T)", f"{problem}: {text[:120]}")
    for url in URL_IN_TEXT.findall(text):
        if not is_local_url(url):
            add("needs internet (web page)", url)
    for head in _command_heads(command):
        name = head.rsplit("/", 1)[-1]
        if name in GNOME_SHELL:
            add("needs GNOME desktop", name)
        elif name in SYSTEMD_TOOLS:
            add("needs systemd (the desktop runs none)", text[:120])
        elif name in GNOME_APPS and not shutil.which(name):
            add("needs GNOME desktop", f"{name} (not installed: apt-get install {GNOME_APPS[name]})")
        elif name in ("apt", "apt-get") and setup:
            continue  # the desktop's apt wrapper (checked above)
        elif name in GSETTINGS_COMMANDS:
            problem = gsettings_problem(schemas_in(text)) or (
                None if shutil.which(name) else f"{name} is not installed (apt-get install dconf-cli)"
            )
            if problem:
                add("needs GNOME desktop: gsettings", problem)
        elif (
            name in ("python", "python3", "pip", "pip3", "socat")
            or name in wrapped
            or head.startswith(("./", "/home/user"))
        ):
            continue
        elif "/" not in head and not shutil.which(name):
            add("command not installed", name)


def _check_extension_source(task: Task, add: Any) -> None:
    """A task scored on ``code --list-extensions`` whose setup brings no ``.vsix`` is solved from the
    extension marketplace: offline the agent cannot install it."""
    ev = task.evaluator
    listed = [g for g in ev.results if g and "--list-extensions" in _command_text(g.get("command"))]
    if not listed or "is_extension_installed" not in ev.funcs:
        return
    steps = " ".join(json.dumps(step.parameters) for step in task.config)
    if ".vsix" not in steps:
        add("needs internet (extension marketplace)", _command_text(listed[0].get("command"))[:120])


def check_task(task: Task, download_cache: str, assume_cached: bool = False) -> Runnability:
    """Every reason ``task`` cannot run here (empty when it can).

    ``assume_cached``: count the task's remote input files as present (what a full cache,
    ``rz osworld fetch``, would make runnable).
    """
    r = Runnability(task.id, task.source_path or "", task.domain)
    seen: set[tuple[str, str]] = set()

    def add(category: str, detail: str) -> None:
        if category == "needs internet (web page)" and task.id in PAGES_NOT_NEEDED:
            return  # opened offline as error pages: neither the work nor the score needs them
        if (category, detail) not in seen:
            seen.add((category, detail))
            r.reasons.append((category, detail))

    ev = task.evaluator
    _check_known_blockers(task, add)
    _check_apps(task, add)
    wrapped = _wrapped_commands()
    _check_steps(task, add, wrapped)
    if not assume_cached:
        for item in missing_inputs(task, download_cache):
            add("needs internet download", item.url[:120])
    if not ev.is_infeasible:
        _check_extension_source(task, add)
        _check_metrics(task, add)
        _check_getters(task, add, wrapped)
    return r


def _check_known_blockers(task: Task, add: Any) -> None:
    """The reasons listed by task id: no evaluator, needs root, offline scoring, live web pages."""
    if not task.evaluator.funcs:
        # OSWorld's harness cannot score it either: it looks its metric up by name (getattr(metrics, ""))
        add(
            "no evaluator defined",
            "the task's evaluator is empty or a placeholder (func \"\"): OSWorld's "
            "harness fails to load it too; none is among test_all.json's tasks",
        )
    if task.id in NEEDS_ROOT_TASKS:
        add("needs root (the desktop has none to become)", NEEDS_ROOT_TASKS[task.id])
    if (task.domain, task.id) in OFFLINE_SCORING_BLOCKERS:
        add(*OFFLINE_SCORING_BLOCKERS[(task.domain, task.id)])
    if task.id in LIVE_WEB_TASKS:
        add("needs internet (the instruction's web pages)", LIVE_WEB_TASKS[task.id])


def _check_apps(task: Task, add: Any) -> None:
    """The task's apps (and its snapshot's) that are not installed here."""
    for app in [*task.related_apps, task.snapshot]:
        key = app.lower()
        if key in NO_BINARY_APPS or not key:
            continue
        if key in VSCODE_APPS:
            if vscode_problem():
                add("app not installed", f"{app}: {vscode_problem()}")
            continue
        binaries = APP_BINARIES.get(key)
        if binaries is None:
            add("app not installed", app)
        elif not any(shutil.which(b) for b in binaries):
            add("app not installed", app)


def _wrapped_commands() -> set[str]:
    """Commands each desktop provides through its own wrapper (found whether or not installed here)."""
    wrapped = {"google-chrome", "google-chrome-stable", "chrome", "chromium", "chromium-browser"}
    if vscode_problem() is None:
        wrapped.add("code")  # each desktop's own wrapper
    return wrapped


def _check_steps(task: Task, add: Any, wrapped: set[str]) -> None:
    """Setup and postconfig steps that are online, not implemented, or run a command missing here."""
    for step in [*task.config, *task.evaluator.postconfig]:
        if step.type in ONLINE_STEPS:
            add("needs internet (setup step)", f"{step.type}: {ONLINE_STEPS[step.type]}")
            continue
        if step.type not in STEPS:
            add("setup step not implemented", step.type)
            continue
        p = step.parameters
        if step.type == "open" and not shutil.which("xdg-open"):
            add("command not installed", "xdg-open (the open step; apt-get install xdg-utils)")
        elif step.type == "chrome_open_tabs":
            for url in p.get("urls_to_open", []) or []:
                if not is_local_url(str(url)):
                    add("needs internet (web page)", str(url))
        elif step.type in ("execute", "command", "launch"):
            _check_command(p.get("command"), add, wrapped, setup=True)


def _check_metrics(task: Task, add: Any) -> None:
    """Metrics not implemented, called with options not implemented, or needing what is not here."""
    ev = task.evaluator
    for i, name in enumerate(ev.funcs):
        if name not in METRICS and name not in SPECIAL_METRICS:
            add("metric not implemented", name)
        elif name in METRICS:
            problem = option_problem(name, ev.options[i] if i < len(ev.options) else {})
            if problem:
                add("metric option not implemented", f"{name}: {problem}")
            missing = blocker(name)
            if missing:
                add("metric needs a library or tool not here", f"{name}: {missing}")


def _check_getters(task: Task, add: Any, wrapped: set[str]) -> None:
    """Getters unavailable or not implemented here, or reading a command or web page they cannot."""
    ev = task.evaluator
    for getter in [*ev.results, *ev.expected]:
        if not getter:
            continue
        kind = getter["type"]
        if kind in UNAVAILABLE:
            add("getter unavailable here", f"{kind}: {UNAVAILABLE[kind]}")
        elif kind not in GETTERS:
            add("getter not implemented", kind)
        elif getter_problem(kind):
            add("getter unavailable here", f"{kind}: {getter_problem(kind)}")
        elif kind in ("vm_command_line", "vm_command_error"):
            _check_command(getter.get("command"), add, wrapped)
        elif kind == "page_info" and not is_local_url(str(getter.get("url", ""))):
            add("needs internet (web page)", str(getter.get("url")))
        elif kind == "pdf_from_url" and not is_local_url(str(getter.get("path", ""))):
            add("needs internet (web page)", str(getter.get("path")))


def setup_packages(task: Task) -> list[tuple[str, str]]:
    """``("pip" | "apt", name)`` for every package the task's setup or postconfig installs (the
    desktop's wrappers find them installed here, or fail as an offline install would)."""
    found = []
    for step in [*task.config, *task.evaluator.postconfig]:
        if step.type in ("execute", "command", "launch"):
            text = _command_text(step.parameters.get("command"))
            found += [("pip", n) for n in _pip_packages(text) or []]
            found += [("apt", re.split(r"[=:]", n)[0]) for n in _apt_packages(text) or []]
    return list(dict.fromkeys(found))


def _packages_summary(tasks: list[Task]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {"pip": {}, "apt": {}}
    for task in tasks:
        for kind, name in setup_packages(task):
            entry = out[kind].setdefault(name, {"installed": None, "tasks": []})
            entry["tasks"].append(task.id)
    for name, entry in out["pip"].items():
        entry["installed"] = not missing_pip_packages([name])
    for name, entry in out["apt"].items():
        entry["installed"] = name in installed_packages()
    return out


def validate_dir(
    path: str | Path,
    download_cache: str,
    assume_cached: bool = False,
    subset: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """Parse and check every task under ``path`` (``assume_cached``: see ``check_task``).

    Returns ``total``, ``parsed``, ``parse_errors`` (path -> message), ``runnable``,
    ``not_runnable`` (first reason's category -> task count), ``reasons`` (every category ->
    task count), ``by_domain``, ``setup_packages`` (``pip``/``apt`` -> package -> installed here,
    the ids of the tasks whose setup installs it: ``scripts/install.sh --osworld-apps`` puts them
    here) and ``tasks`` (per task: id, domain, path, runnable, reasons).
    With ``subset`` (OSWorld's ``test_all.json``: domain -> ids), ``subset`` counts the listed
    tasks found (a task file named after its id, in its domain's folder) and runnable, per domain.
    """
    loaded = load_tasks(path)
    parse_errors = {str(p): str(t) for p, t in loaded if isinstance(t, TaskFormatError)}
    checks = [check_task(t, download_cache, assume_cached) for _p, t in loaded if isinstance(t, Task)]
    first = Counter(c.reasons[0][0] for c in checks if c.reasons)
    every = Counter(cat for c in checks for cat in {cat for cat, _ in c.reasons})
    by_domain: dict[str, dict[str, int]] = {}
    for c in checks:
        d = by_domain.setdefault(c.domain, {"total": 0, "runnable": 0})
        d["total"] += 1
        d["runnable"] += int(c.runnable)
    return {
        "subset": _subset_summary(checks, subset) if subset is not None else None,
        "total": len(loaded),
        "parsed": len(checks),
        "parse_errors": parse_errors,
        "runnable": sum(c.runnable for c in checks),
        "not_runnable": dict(first.most_common()),
        "reasons": dict(every.most_common()),
        "by_domain": by_domain,
        "setup_packages": _packages_summary([t for _p, t in loaded if isinstance(t, Task)]),
        "tasks": [
            {
                "id": c.task_id,
                "domain": c.domain,
                "path": c.path,
                "runnable": c.runnable,
                "reasons": [f"{cat}: {detail}" for cat, detail in c.reasons],
            }
            for c in checks
        ],
    }


def _subset_summary(checks: list[Runnability], subset: dict[str, list[str]]) -> dict[str, Any]:
    listed = {(domain, task_id) for domain, ids in subset.items() for task_id in ids}
    # A variant file (e.g. "<id>-win.json") repeats an id: only "<id>.json" stands for the task.
    found = [c for c in checks if (c.domain, c.task_id) in listed and Path(c.path).stem == c.task_id]
    by_domain: dict[str, dict[str, int]] = {}
    for c in found:
        d = by_domain.setdefault(c.domain, {"total": 0, "runnable": 0})
        d["total"] += 1
        d["runnable"] += int(c.runnable)
    return {
        "listed": len(listed),
        "found": len(found),
        "runnable": sum(c.runnable for c in found),
        "by_domain": by_domain,
    }
