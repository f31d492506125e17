"""Dump the desktop's AT-SPI accessibility tree as OSWorld's XML. Runs under the SYSTEM Python.

Debian's ``python3-pyatspi`` (with ``gir1.2-atspi-2.0``) exists only for ``/usr/bin/python3``, not
for the interpreter rz_agents runs on, so this file imports nothing of rz_agents: the desktop's
server starts it as ``/usr/bin/python3 atspi_tree.py`` inside the sandbox (the session bus and
the AT-SPI bus are the desktop's own) and keeps it running. Protocol: one JSON request per line on
stdin (``{"max_nodes", "max_children", "max_depth", "time_s"}``, all optional), one JSON answer per
line on stdout: ``{"xml": ...}`` or ``{"error": ...}``.

XML form (as OSWorld's VM server writes it): one element per node, named by role with spaces as
dashes (``push-button``), ``name`` attribute, the node's text as element text, and namespaced
attributes: ``st:<state>="true"``, ``attr:<object attribute>``, ``cp:screencoord="(x, y)"`` and
``cp:size="(w, h)"`` (screen pixels), ``val:value`` and friends, ``act:<action>_desc``.
Limits keep a dump bounded: nodes, children per node (huge tables: only the visible cells, found
through the Table interface), depth and time. With ``prune_hidden`` (default) the children of a
node that is not showing are not walked (closed menus hold most of an application's widgets; an
agent cannot see them and OSWorld's filter drops them anyway).
"""

from __future__ import annotations

import json
import sys
import time
import xml.etree.ElementTree as ET

NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
DEFAULTS = {"max_nodes": 6000, "max_children": 512, "max_depth": 60, "time_s": 20.0, "prune_hidden": True}
TABLE_ROLES = ("table", "tree-table", "spreadsheet")


class Dumper:
    """One walk over the desktop, within the request's limits."""

    def __init__(self, pyatspi, limits: dict) -> None:
        self.pyatspi = pyatspi
        self.limits = {**DEFAULTS, **{k: v for k, v in limits.items() if k in DEFAULTS}}
        self.nodes = 0
        self.deadline = time.monotonic() + float(self.limits["time_s"])
        self.cut = False

    def exhausted(self) -> bool:
        if self.nodes >= self.limits["max_nodes"] or time.monotonic() > self.deadline:
            self.cut = True
        return self.cut

    def node(self, acc, depth: int) -> ET.Element | None:
        """The element for ``acc`` and its subtree (None when the object vanished)."""
        pa = self.pyatspi
        try:
            role = (acc.getRoleName() or "unknown").replace(" ", "-")
            el = ET.Element(role, {"name": acc.name or ""})
        except Exception:
            return None
        self.nodes += 1
        showing = True
        try:
            states = acc.getState().getStates()
            for state in states:
                el.set(f"{{{NS['st']}}}{pa.stateToString(state).replace(' ', '-')}", "true")
            showing = pa.STATE_SHOWING in states
        except Exception:
            pass
        try:
            for kv in acc.getAttributes() or []:
                key, _, value = str(kv).partition(":")
                if key:
                    el.set(f"{{{NS['attr']}}}{key}", value)
        except Exception:
            pass
        desc = getattr(acc, "description", "") or ""
        if desc:
            el.set(f"{{{NS['attr']}}}description", desc)
        try:
            x, y, w, h = acc.queryComponent().getExtents(pa.DESKTOP_COORDS)
            el.set(f"{{{NS['cp']}}}screencoord", f"({x}, {y})")
            el.set(f"{{{NS['cp']}}}size", f"({w}, {h})")
        except Exception:
            pass
        try:
            # to the end (-1) in one D-Bus call, not characterCount first (one of ~15 calls a node costs)
            content = acc.queryText().getText(0, -1)
            if content:
                el.text = content.replace("\ufffc", "").replace("\ufffd", "")
        except Exception:
            pass
        try:
            value = acc.queryValue()
            el.set(f"{{{NS['val']}}}value", str(value.currentValue))
        except Exception:
            pass
        try:
            action = acc.queryAction()
            for i in range(min(action.nActions, 8)):
                name = action.getName(i)
                if name:
                    el.set(f"{{{NS['act']}}}{name.replace(' ', '-')}_desc", action.getDescription(i) or "")
        except Exception:
            pass
        hidden = (
            self.limits["prune_hidden"] and not showing and role not in ("application", "frame", "window")
        )
        if depth < self.limits["max_depth"] and not hidden:
            for child in self.children(acc, role):
                if self.exhausted():
                    break
                sub = self.node(child, depth + 1)
                if sub is not None:
                    el.append(sub)
        return el

    def children(self, acc, role: str):
        """The children to walk: all (capped), or for a huge table only its visible cells."""
        try:
            count = acc.childCount
        except Exception:
            return
        cap = int(self.limits["max_children"])
        if role in TABLE_ROLES and count > cap:
            yield from self.visible_cells(acc)
            return
        for i in range(min(count, cap)):
            try:
                child = acc.getChildAtIndex(i)
            except Exception:
                continue
            if child is not None:
                yield child

    def visible_cells(self, acc):
        """Cells of a huge table (a spreadsheet has millions) row by row while they are showing."""
        pa = self.pyatspi
        try:
            table = acc.queryTable()
        except Exception:
            return
        showing = pa.STATE_SHOWING
        for row in range(min(table.nRows, 500)):
            shown_in_row = 0
            for col in range(min(table.nColumns, 200)):
                try:
                    cell = table.getAccessibleAt(row, col)
                except Exception:
                    break
                if cell is None or not cell.getState().contains(showing):
                    if shown_in_row or col > 64:
                        break
                    continue
                shown_in_row += 1
                yield cell
            if not shown_in_row and row > 0:
                return

    def desktop(self) -> ET.Element:
        """The whole tree: ``desktop-frame`` with one element per application."""
        root = ET.Element("desktop-frame", {"name": "main"})
        desk = self.pyatspi.Registry.getDesktop(0)
        for i in range(desk.childCount):
            if self.exhausted():
                break
            try:
                app = desk.getChildAtIndex(i)
            except Exception:
                continue
            if app is not None:
                el = self.node(app, 1)
                if el is not None:
                    root.append(el)
        if self.cut:
            root.set("truncated", "true")
        return root


def main() -> None:
    """Answer dump requests from stdin until it closes."""
    for prefix, uri in NS.items():
        ET.register_namespace(prefix, uri)
    try:
        import pyatspi
    except Exception as exc:  # no pyatspi for this interpreter: say so once per request
        pyatspi, failure = None, f"pyatspi unavailable: {type(exc).__name__}: {exc}"
    print(json.dumps({"ready": pyatspi is not None}), flush=True)
    for line in sys.stdin:
        try:
            if pyatspi is None:
                raise RuntimeError(failure)
            request = json.loads(line) if line.strip() else {}
            xml = ET.tostring(Dumper(pyatspi, request).desktop(), encoding="unicode")
            answer = {"xml": xml}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
