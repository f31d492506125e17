"""Desktop-state metrics (OSWorld's ``metrics/basic_os.py``): clipboard, time zone, GNOME settings.

The GNOME ones read ``gsettings`` output; on this desktop (no GNOME) their getters are the
blocker, not the metric.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any


def is_in_vm_clickboard(config: dict[str, Any], terminal_output: Any, **_: Any) -> float:
    """1 when the clipboard text contains ``config["expected"]`` (every item, for a list).

    Note OSWorld's argument order: the rule is the *result* getter, the clipboard the expected one.
    A missing clipboard output raises (scored 0), as there.
    """
    expected = config["expected"]
    if isinstance(expected, list):
        return float(all(item in terminal_output for item in expected))
    return float(expected in terminal_output)


def is_utc_0(timedatectl_output: str, **_: Any) -> float:
    """1 when the fourth line of ``timedatectl status`` (``Time zone: ...``) ends in ``+0000)``."""
    return float(timedatectl_output.split("\n")[3].endswith("+0000)"))


def check_gnome_favorite_apps(apps_str: str, rule: dict[str, Any], **_: Any) -> float:
    """1 when the favourite-apps list (gsettings' Python-like list text) is the expected set.

    OSWorld ``eval``s the text; it is parsed here as a Python literal (same values, no code run).
    """
    apps = ast.literal_eval(apps_str.strip())
    expected = rule["expected"]
    return float(len(apps) == len(expected) and set(apps) == set(expected))


def check_text_enlarged(scaling_factor_str: str, **_: Any) -> float:
    """1 when GNOME's text-scaling-factor is above 1."""
    return float(float(scaling_factor_str) > 1.0)


METRICS: dict[str, Callable[..., float]] = {
    "is_in_vm_clickboard": is_in_vm_clickboard,
    "is_utc_0": is_utc_0,
    "check_gnome_favorite_apps": check_gnome_favorite_apps,
    "check_text_enlarged": check_text_enlarged,
}
