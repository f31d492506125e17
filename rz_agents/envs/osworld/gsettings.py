"""GNOME settings without GNOME: ``gsettings`` on the desktop's own session bus and dconf database.

OSWorld's os tasks set and read GNOME keys (``org.gnome.desktop.interface text-scaling-factor``,
``org.gnome.shell favorite-apps``, the wallpaper's ``picture-uri`` ...) with ``gsettings``. That
needs no GNOME Shell: the GSettings schemas, the dconf backend (``gsettings`` writes through
``dconf-service``, activated on the desktop's session bus; reads come from ``~/.config/dconf/user``)
and a session bus, which every desktop has (``session.py``). ``gsettings_problem`` says what of
that is missing here, per schema a task names.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

DCONF_SERVICES = ("/usr/libexec/dconf-service", "/usr/lib/dconf/dconf-service")
GSETTINGS_SCHEMA = re.compile(r"\bgsettings\s+(?:get|set|reset|range|describe|writable)\s+([A-Za-z][\w.-]*)")
SCHEMA_PACKAGES = {
    "org.gnome.shell": "gnome-shell-common",
    "org.gnome.Terminal": "gnome-terminal",
    "org.gnome.desktop": "gsettings-desktop-schemas",
}


@functools.lru_cache(maxsize=1)
def installed_schemas() -> frozenset[str]:
    """The GSettings schemas installed here (empty when ``gsettings`` is missing or fails)."""
    if not shutil.which("gsettings"):
        return frozenset()
    try:
        r = subprocess.run(
            ["gsettings", "list-schemas"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "GSETTINGS_BACKEND": "memory"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(r.stdout.split()) if r.returncode == 0 else frozenset()


def gsettings_problem(schemas: list[str] = ()) -> str | None:
    """Why desktops here cannot keep GNOME settings (of ``schemas``); None when they can."""
    if not shutil.which("gsettings"):
        return "gsettings is not installed (apt-get install libglib2.0-bin)"
    if not any(os.path.exists(p) for p in DCONF_SERVICES):
        return "the dconf backend is not installed (apt-get install dconf-service dconf-gsettings-backend)"
    if not shutil.which("dbus-daemon"):
        return "dbus-daemon is not installed (gsettings writes through dconf on the session bus)"
    missing = [s for s in schemas if s not in installed_schemas()]
    if missing:
        package = next(
            (
                pkg
                for prefix, pkg in SCHEMA_PACKAGES.items()
                if missing[0] == prefix or missing[0].startswith(prefix + ".")
            ),
            "",
        )
        hint = f" (apt-get install {package})" if package else ""
        return f"GSettings schema {missing[0]} is not installed{hint}"
    return None


def schemas_in(command_text: str) -> list[str]:
    """The schemas a command's ``gsettings get/set ...`` name."""
    return GSETTINGS_SCHEMA.findall(command_text)
