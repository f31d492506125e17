"""The in-VM server's X11 windows: listed over EWMH, found by title or class, acted on with xdotool."""

from __future__ import annotations

import subprocess
from typing import Any


def list_windows() -> list[dict[str, Any]]:
    """Top-level client windows (EWMH ``_NET_CLIENT_LIST``): id, title, class, geometry, active."""
    from Xlib import X, display

    d = display.Display()
    try:
        root = d.screen().root
        atom = d.intern_atom
        clients = root.get_full_property(atom("_NET_CLIENT_LIST"), X.AnyPropertyType)
        active = root.get_full_property(atom("_NET_ACTIVE_WINDOW"), X.AnyPropertyType)
        active_id = int(active.value[0]) if active and len(active.value) else 0
        out = []
        for wid in clients.value if clients else []:
            win = d.create_resource_object("window", int(wid))
            try:
                name_prop = win.get_full_property(atom("_NET_WM_NAME"), atom("UTF8_STRING"))
                name = name_prop.value if name_prop else (win.get_wm_name() or "")
                if isinstance(name, bytes):
                    name = name.decode("utf-8", "replace")
                cls = win.get_wm_class() or ("", "")
                geo = win.get_geometry()
                pos = win.translate_coords(root, 0, 0)
                out.append(
                    {
                        "id": int(wid),
                        "name": name,
                        "class": cls[1] if len(cls) > 1 else cls[0],
                        "x": -pos.x,
                        "y": -pos.y,
                        "w": geo.width,
                        "h": geo.height,
                        "active": int(wid) == active_id,
                    }
                )
            except Exception:
                continue  # the window closed while we looked
        return out
    finally:
        d.close()


def xdotool(*args: str) -> subprocess.CompletedProcess:
    """Run ``xdotool ARGS`` (10 s at most), output captured."""
    return subprocess.run(["xdotool", *args], capture_output=True, text=True, timeout=10)


def find_window(name: str, strict: bool = False, by_class: bool = False) -> dict[str, Any] | None:
    """The first window whose title (or class) equals (strict) or contains ``name``, case-insensitive."""
    key = "class" if by_class else "name"
    for w in list_windows():
        value = str(w[key]).lower()
        if (strict and value == name.lower()) or (not strict and name.lower() in value):
            return w
    return None
