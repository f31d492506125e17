"""What the in-VM server observes of the desktop: the accessibility tree (AT-SPI, Chromium's own,
or a window-list fallback), the terminal's text, the wallpaper, screenshots, screen size, the cursor."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from typing import Any
from xml.sax.saxutils import quoteattr

from rz_agents.envs.osworld.terminal import terminal_output
from rz_agents.envs.osworld.vm_commands import map_path
from rz_agents.envs.osworld.vm_windows import list_windows

SYSTEM_PYTHON = os.environ.get("RZ_OSWORLD_SYSTEM_PYTHON", "/usr/bin/python3")
ATSPI_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "atspi_tree.py")


class AtspiTree:
    """The server's handle on ``atspi_tree.py``, kept running under the system Python.

    Used when the session switched AT-SPI on (``RZ_OSWORLD_ATSPI=1``). A dump that fails or
    overruns its time kills the helper (the next request starts a fresh one) and returns None, so
    the caller falls back to the X11/Chromium tree.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.last_error = ""

    @staticmethod
    def enabled() -> bool:
        """True when this desktop has AT-SPI switched on."""
        return os.environ.get("RZ_OSWORLD_ATSPI") == "1"

    def _start(self) -> subprocess.Popen | None:
        proc = subprocess.Popen(
            [SYSTEM_PYTHON, ATSPI_SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        ready = self._readline(proc, 30.0)
        if not ready or not json.loads(ready).get("ready"):
            proc.kill()
            self.last_error = "the AT-SPI helper could not import pyatspi"
            return None
        return proc

    @staticmethod
    def _readline(proc: subprocess.Popen, timeout: float) -> str | None:
        import select

        if not select.select([proc.stdout], [], [], timeout)[0]:
            return None
        return proc.stdout.readline() or None

    def dump(self, time_s: float = 20.0, view: str = "full", collect: bool = True) -> str | None:
        """The AT-SPI tree as XML (``view``: ``full`` or ``agent``, see ``atspi_tree.py``), or None
        (``last_error`` says why). ``collect=False``: the agent view by a walk (the reference)."""
        with self._lock:
            try:
                if self._proc is None or self._proc.poll() is not None:
                    self._proc = self._start()
                if self._proc is None:
                    return None
                request = {"time_s": time_s, "view": view, "collect": collect}
                self._proc.stdin.write(json.dumps(request) + "\n")
                self._proc.stdin.flush()
                line = self._readline(self._proc, time_s + 15)
                if line is None:
                    raise OSError(f"no answer within {time_s + 15:.0f}s")
                answer = json.loads(line)
            except (OSError, ValueError) as exc:
                self.last_error = f"AT-SPI helper: {exc}"
                if self._proc is not None:
                    self._proc.kill()
                self._proc = None
                return None
            if "xml" not in answer:
                self.last_error = answer.get("error", "no tree")
                return None
            return answer["xml"]


_atspi = AtspiTree()

_chrome_link = None
_chrome_lock = threading.Lock()


def _chrome_nodes() -> list[dict[str, Any]]:
    """The active Chrome tab's AX nodes, or [] when no browser listens on the episode's CDP port."""
    global _chrome_link
    port = os.environ.get("RZ_OSWORLD_CDP_PORT")
    if not port:
        return []
    with socket.socket() as s:
        s.settimeout(0.2)
        if s.connect_ex(("127.0.0.1", int(port))) != 0:
            return []
    from rz_agents.envs.osworld.chrome import ChromeLink, active_page, page_ax_nodes

    with _chrome_lock:
        if _chrome_link is None:
            _chrome_link = ChromeLink(int(port))
        link = _chrome_link

    def grab(browser: Any) -> list[dict[str, Any]]:
        page = active_page(browser)
        return page_ax_nodes(page) if page is not None else []

    return link.call(grab, timeout_s=20)


A11Y_VIEWS = ("full", "agent")


def accessibility_xml(view: str = "full", collect: bool = True) -> str:
    """The desktop's accessibility tree: AT-SPI's (every app's widgets) when the session has it,
    else the fallback: X11 windows, with Chromium's page tree (over CDP) inside its window.

    ``view="agent"``: only the nodes OSWorld's text agent keeps (same table, far fewer calls)."""
    if view not in A11Y_VIEWS:
        raise ValueError(f"view must be one of {A11Y_VIEWS}, got {view!r}")
    if AtspiTree.enabled():
        xml = _atspi.dump(view=view, collect=collect)
        if xml is not None:
            return xml
    return fallback_xml()


def terminal_text() -> str | None:
    """OSWorld's ``/terminal``: the focused GNOME Terminal's text, or None (no AT-SPI, no such terminal)."""
    if not AtspiTree.enabled():
        return None
    xml = _atspi.dump()
    return None if xml is None else terminal_output(xml)


def wallpaper_path() -> str | None:
    """The file of GNOME's desktop background (``org.gnome.desktop.background picture-uri``), or None.

    As OSWorld's server reads it: the setting's text without ``file://`` and quotes.
    """
    try:
        r = subprocess.run(
            ["gsettings", "get", "org.gnome.desktop.background", "picture-uri"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return map_path(r.stdout.strip().replace("file://", "").replace("'", ""))


def fallback_xml() -> str:
    """X11 windows, with Chrome's own AX tree inside its window (no AT-SPI needed)."""

    def attrs(d: dict[str, Any]) -> str:
        return (
            f" name={quoteattr(str(d.get('name', '')))} "
            f'screencoord="({d.get("x", -1)}, {d.get("y", -1)})" size="({d.get("w", 0)}, {d.get("h", 0)})"'
        )

    lines = ['<desktop-frame name="main">']
    try:
        windows = list_windows()
    except Exception as exc:
        windows = []
        lines.append(f"<!-- windows unavailable: {exc} -->")
    for w in windows:
        app = str(w["class"] or "application")
        lines.append(f"<application name={quoteattr(app)}>")
        lines.append(f"<frame{attrs(w)} active={quoteattr(str(w['active']).lower())}>")
        if "chrom" in app.lower():
            try:
                for n in _chrome_nodes():
                    tag = "".join(ch for ch in n["role"] if ch.isalnum()) or "node"
                    text = n.get("value") or ""
                    lines.append(f"<{tag}{attrs(n)} text={quoteattr(text)}/>")
            except Exception as exc:
                lines.append(f"<!-- chrome tree unavailable: {type(exc).__name__} -->")
        lines.append("</frame>")
        lines.append("</application>")
    lines.append("</desktop-frame>")
    return "\n".join(lines)


# --- screenshots -------------------------------------------------------------------------------


# zlib level of the screenshot PNG: 1 encodes a 1920x1080 desktop in ~18 ms of CPU instead of ~38 ms
# at mss's default 6, for ~2x the bytes (~45 KB, over loopback); PNG is lossless, the pixels are the same.
SCREENSHOT_PNG_LEVEL = 1


def screenshot_png(level: int = SCREENSHOT_PNG_LEVEL) -> bytes:
    """A PNG of the whole display (mss grabs X11 directly, no temporary file)."""
    import mss
    import mss.tools

    factory = getattr(mss, "MSS", None) or mss.mss
    with factory(display=os.environ.get("DISPLAY")) as grabber:
        img = grabber.grab(grabber.monitors[0])
        return mss.tools.to_png(img.rgb, img.size, level=level)


def screen_size() -> tuple[int, int]:
    """Width and height of the display."""
    from Xlib import display

    d = display.Display()
    try:
        s = d.screen()
        return s.width_in_pixels, s.height_in_pixels
    finally:
        d.close()


def cursor_position() -> tuple[int, int]:
    """The pointer's position on the display."""
    from Xlib import display

    d = display.Display()
    try:
        p = d.screen().root.query_pointer()
        return p.root_x, p.root_y
    finally:
        d.close()
