"""The desktop's terminal, as on OSWorld's Ubuntu VM: GNOME Terminal, opened by Ctrl+Alt+T, read over AT-SPI.

OSWorld's tasks open a terminal with ``pyautogui.hotkey('ctrl', 'alt', 't')`` (GNOME's shortcut)
and its ``vm_terminal_output`` getter reads the focused terminal's text from the accessibility
tree. Here the desktop has no GNOME Shell: openbox grabs the key (``openbox_config`` adds the
binding to the system configuration) and runs Debian's ``gnome-terminal``, whose server is
activated on the desktop's own session bus; ``terminal_output`` applies the official server's
selection to the desktop's AT-SPI tree.
"""

from __future__ import annotations

import os
import re
import shutil
import xml.etree.ElementTree as ET

TERMINAL_COMMAND = "gnome-terminal"
TERMINAL_KEY = "C-A-t"  # openbox's name for Ctrl+Alt+T
SYSTEM_OPENBOX_RC = "/etc/xdg/openbox/rc.xml"
GNOME_TERMINAL_SERVERS = (
    "/usr/libexec/gnome-terminal-server",
    "/usr/lib/gnome-terminal/gnome-terminal-server",
)
ST = "https://accessibility.ubuntu.example.org/ns/state"


def terminal_problem() -> str | None:
    """Why Ctrl+Alt+T cannot open a GNOME terminal on this machine's desktops (None when it can)."""
    if not shutil.which(TERMINAL_COMMAND) or not any(os.path.exists(p) for p in GNOME_TERMINAL_SERVERS):
        return "gnome-terminal is not installed (apt-get install gnome-terminal)"
    if not shutil.which("openbox"):
        return "openbox (which grabs Ctrl+Alt+T) is not installed"
    if not shutil.which("dbus-daemon"):
        return "dbus-daemon (gnome-terminal's server is started on the session bus) is not installed"
    return None


def openbox_config(config_dir: str, system_rc: str = SYSTEM_OPENBOX_RC) -> str | None:
    """Write openbox's configuration with the Ctrl+Alt+T terminal key to ``config_dir``; its path.

    The system file is kept whole (its mouse bindings give click-to-focus) and the key added
    first in ``<keyboard>``. None when there is no terminal to bind or no system file to extend.
    """
    if terminal_problem() is not None or not os.path.isfile(system_rc):
        return None
    with open(system_rc, encoding="utf-8") as f:
        text = f.read()
    binding = (
        f'<keybind key="{TERMINAL_KEY}"><action name="Execute">'
        f"<command>{TERMINAL_COMMAND}</command></action></keybind>"
    )
    text, n = re.subn(r"(<keyboard[^>]*>)", lambda m: m.group(1) + binding, text, count=1)
    if n == 0:
        return None
    path = os.path.join(config_dir, "openbox-rc.xml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def terminal_output(tree_xml: str) -> str | None:
    """The focused terminal's text in the active GNOME Terminal window, right-stripped; None otherwise.

    OSWorld's ``/terminal``: the ``gnome-terminal-server`` application's frame with ``st:active``,
    in it the one ``terminal`` with ``st:focused`` (none or several: None).
    """
    root = ET.fromstring(tree_xml)
    found = []
    for app in root.iter("application"):
        if app.get("name") != "gnome-terminal-server":
            continue
        for frame in app.findall("frame"):
            if frame.get(f"{{{ST}}}active") != "true":
                continue
            found += [t for t in frame.iter("terminal") if t.get(f"{{{ST}}}focused") == "true"]
    if len(found) != 1 or found[0].text is None:
        return None  # (the official server answers an error for a terminal without text: None too)
    return found[0].text.rstrip()
