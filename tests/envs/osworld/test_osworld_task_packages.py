"""Tasks' ``pip install`` steps on the real desktop: its pip finds what the host installed.

OSWorld's setups pip-install what their scoring scripts import (``pip install pygame``,
``sudo -S pip install pysrt``, ``pip install cssselect``); the desktop has no network, so its ``pip``
succeeds for packages the desktop's Python has (``scripts/install.sh --osworld-apps`` installs them
from the package index) and fails as an offline pip does for anything else, naming it.
"""

from __future__ import annotations

import shutil
from importlib import metadata

import pytest

from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.getters import get_vm_command_line

TASK_PACKAGES = ("pygame", "pysrt", "cssselect")  # the 369 test tasks' pip installs (one has PyMuPDF)


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("openbox") and all(map(_installed, TASK_PACKAGES))),
    reason="needs a desktop (Xvfb, openbox) and the tasks' packages (scripts/install.sh --osworld-apps)",
)


def _task(command: str) -> dict:
    return {
        "id": "pip-setup", "instruction": "i", "snapshot": "os", "related_apps": ["os"],
        "config": [{"type": "execute", "parameters": {"command": command, "shell": True}}],
        "evaluator": {"func": "exact_match", "result": {"type": "vm_command_line", "command": "true"},
                      "expected": {"type": "rule", "rules": {"expected": ""}}},
    }  # fmt: skip


def test_setup_pip_installs_succeed_for_installed_packages_and_fail_for_others():
    setup = (
        "cd /tmp && pip install pygame > pip.out 2>&1; echo rc=$? >> pip.out;"
        " echo password | sudo -S pip install pysrt >> pip.out 2>&1; echo rc=$? >> pip.out;"
        " pip3 install --upgrade cssselect no-such-dist-rz >> pip.out 2>&1; echo rc=$? >> pip.out"
    )
    with DesktopEnv(require_a11y_tree=False) as env:
        env.reset(_task(setup))
        out = get_vm_command_line(env.ctx, {"command": "cat /tmp/pip.out", "shell": True}) or ""
        scored = get_vm_command_line(
            env.ctx, {"command": ["python", "-c", "import pygame, pysrt, cssselect; print('imported')"]}
        )
    assert out.count("rc=0") == 2 and out.rstrip().endswith("rc=1"), out
    assert "Requirement already satisfied: pygame" in out and "Requirement already satisfied: pysrt" in out
    assert "no-such-dist-rz (no network on this desktop" in out, out
    assert "imported" in (scored or "")
