"""Dump the desktop's AT-SPI accessibility tree as OSWorld's XML. Runs under the SYSTEM Python.

Debian's ``python3-pyatspi`` (with ``gir1.2-atspi-2.0``) exists only for ``/usr/bin/python3``, not
for the interpreter rz_agents runs on, so this file imports nothing of rz_agents but its two
neighbours ``agent_filter`` and ``atspi_search`` (standard library and GLib only, found beside it):
the desktop's server starts it as
``/usr/bin/python3 atspi_tree.py`` inside the sandbox (the session bus and the AT-SPI bus are the
desktop's own) and keeps it running. Protocol: one JSON request per line on stdin (``{"view",
"collect", "max_nodes", "max_children", "max_depth", "time_s", "prune_hidden"}``, all optional), one
JSON answer per line on stdout: ``{"xml": ...}`` or ``{"error": ...}``.

XML form (as OSWorld's VM server writes it): one element per node, named by role with spaces as
dashes (``push-button``), ``name`` attribute, the node's text as element text, and namespaced
attributes: ``st:<state>="true"``, ``attr:<object attribute>``, ``cp:screencoord="(x, y)"`` and
``cp:size="(w, h)"`` (screen pixels), ``val:value`` and friends, ``act:<action>_desc``.
Limits keep a dump bounded: nodes, children per node (huge tables: only the visible cells, found
through the Table interface), depth and time. With ``prune_hidden`` (default) the children of a
node that is not showing are not walked (closed menus hold most of an application's widgets; an
agent cannot see them and OSWorld's filter drops them anyway).

Views. ``full`` (default) is the whole tree above. ``agent`` holds only the nodes OSWorld's text
agent keeps (``agent_filter``), flat under ``desktop-frame``, each with what its table reads (role,
name, text, states, ``attr:class``, ``attr:description``, geometry). Chromium (and apps built on
it) is searched, not walked (``atspi_search.py``: one Collection search inside the application,
then pipelined calls on its own socket, each match checked to be where the walk would reach it);
other applications are walked, asking text, geometry and attributes only of nodes whose role and
states pass. The root's ``searched`` attribute counts the applications searched. ``linearize`` of
the agent view equals ``linearize`` of the full view (tested), except where the full walk is cut
by its node, time or children-per-node budget (the search is not). ``"collect": false`` walks
every application: the reference the search is tested against.

Nothing is cached between requests: libatspi's cache would need the applications' events to stay
current, and Chromium sends no children-changed events for its window and not every state change
(measured), so a cached tree goes stale (a page's document never appears).
"""

from __future__ import annotations

import json
import sys
import time
import xml.etree.ElementTree as ET

from agent_filter import content_kept, geometry_kept, role_kept, states_kept
from atspi_search import AgentSearch, Bus

NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
DEFAULTS = {
    "max_nodes": 6000,
    "max_children": 512,
    "max_depth": 60,
    "time_s": 20.0,
    "prune_hidden": True,
    "view": "full",
    "collect": True,
}
VIEWS = ("full", "agent")
TABLE_ROLES = ("table", "tree-table", "spreadsheet")
UNPRUNED_ROLES = ("application", "frame", "window")
# Applications whose agent view comes from one Collection search instead of a walk: Chromium (and
# apps built on it) answers it from its own tree in ~2 ms. Not LibreOffice: a search there would
# visit every cell of a spreadsheet.
COLLECTION_TOOLKITS = ("Chromium",)


def describe(
    el: ET.Element, states: list[str], attributes: list[tuple[str, str]], description: str, text, box
) -> None:
    """Write states, attributes, description, geometry and text onto ``el`` as OSWorld's XML does."""
    for state in states:
        el.set(f"{{{NS['st']}}}{state}", "true")
    for key, value in attributes:
        el.set(f"{{{NS['attr']}}}{key}", value)
    if description:
        el.set(f"{{{NS['attr']}}}description", description)
    if box is not None:
        x, y, w, h = box
        el.set(f"{{{NS['cp']}}}screencoord", f"({x}, {y})")
        el.set(f"{{{NS['cp']}}}size", f"({w}, {h})")
    if text is not None:
        el.text = text


_BUS: list = []


def search_bus() -> Bus:
    """The accessibility bus connection the searches share (made at the first search, and again
    when it has closed)."""
    if not _BUS or _BUS[0].bus.is_closed():
        _BUS[:] = [Bus()]
    return _BUS[0]


_STATE_NAMES: dict[int, str] = {}


def state_names(pyatspi) -> dict[int, str]:
    """State number -> OSWorld's attribute name (``STATE_MULTI_LINE`` -> ``multi-line``)."""
    if not _STATE_NAMES:
        from gi.repository import Atspi

        for number in range(int(Atspi.StateType.LAST_DEFINED) + 1):
            _STATE_NAMES[number] = pyatspi.stateToString(Atspi.StateType(number)).replace(" ", "-")
    return _STATE_NAMES


class Dumper:
    """One walk over the desktop, within the request's limits."""

    def __init__(self, pyatspi, limits: dict) -> None:
        self.pyatspi = pyatspi
        self.limits = {**DEFAULTS, **{k: v for k, v in limits.items() if k in DEFAULTS}}
        if self.limits["view"] not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}, got {self.limits['view']!r}")
        self.agent = self.limits["view"] == "agent"
        self.nodes = 0
        self.deadline = time.monotonic() + float(self.limits["time_s"])
        self.cut = False
        self.kept: list[ET.Element] = []  # the agent view's nodes, in document order
        self.state_memo: dict[object, tuple[list[str], bool]] = {}
        self.searched = 0  # applications whose agent view came from a search
        self.state_names = state_names(pyatspi)

    def exhausted(self) -> bool:
        if self.nodes >= self.limits["max_nodes"] or time.monotonic() > self.deadline:
            self.cut = True
        return self.cut

    # -- one property each (a vanished object answers with an exception: the property is left out)
    def states(self, acc) -> tuple[list[str], bool]:
        """(state names, showing); showing is assumed when the states cannot be read. Asked once
        per object and dump (a search meets ancestors again)."""
        key = acc  # the object itself: libatspi keeps one per (application, path) while it is referenced
        if key not in self.state_memo:
            try:
                # Atspi's own list, not pyatspi's getStates (64 field reads in Python: ~70 us a node)
                states = acc.get_state_set().get_states()
                names = [self.state_name(int(s)) for s in states]
            except Exception:
                return [], True
            self.state_memo[key] = (names, self.pyatspi.STATE_SHOWING in states)
        return self.state_memo[key]

    @staticmethod
    def attributes(acc) -> list[tuple[str, str]]:
        try:
            pairs = [str(kv).partition(":") for kv in acc.getAttributes() or []]
        except Exception:
            return []
        return [(key, value) for key, _, value in pairs if key]

    @staticmethod
    def description(acc) -> str:
        return getattr(acc, "description", "") or ""

    def extents(self, acc) -> tuple[int, int, int, int] | None:
        try:
            return tuple(acc.queryComponent().getExtents(self.pyatspi.DESKTOP_COORDS))
        except Exception:
            return None

    @staticmethod
    def text(acc) -> str | None:
        try:
            # to the end (-1) in one D-Bus call, not characterCount first
            content = acc.queryText().getText(0, -1)
        except Exception:
            return None
        return content.replace("\ufffc", "").replace("\ufffd", "") if content else None

    # -- the walk
    def node(self, acc, depth: int) -> ET.Element | None:
        """The element for ``acc`` and its subtree (None when the object vanished, or in the agent
        view, where kept nodes go to ``self.kept`` instead)."""
        try:
            role = (acc.getRoleName() or "unknown").replace(" ", "-")
            name = acc.name or ""
        except Exception:
            return None
        self.nodes += 1
        states, showing = self.states(acc)
        el = (
            self.agent_node(acc, role, name, states)
            if self.agent
            else self.full_node(acc, role, name, states)
        )
        hidden = self.limits["prune_hidden"] and not showing and role not in UNPRUNED_ROLES
        if depth < self.limits["max_depth"] and not hidden:
            for child in self.children(acc, role):
                if self.exhausted():
                    break
                sub = self.node(child, depth + 1)
                if sub is not None and el is not None:
                    el.append(sub)
        return el

    def full_node(self, acc, role: str, name: str, states: list[str]) -> ET.Element:
        el = ET.Element(role, {"name": name})
        describe(el, states, self.attributes(acc), self.description(acc), self.text(acc), self.extents(acc))
        try:
            value = acc.queryValue()
            el.set(f"{{{NS['val']}}}value", str(value.currentValue))
        except Exception:
            pass
        try:
            action = acc.queryAction()
            for i in range(min(action.nActions, 8)):
                label = action.getName(i)
                if label:
                    el.set(f"{{{NS['act']}}}{label.replace(' ', '-')}_desc", action.getDescription(i) or "")
        except Exception:
            pass
        return el

    def agent_node(self, acc, role: str, name: str, states: list[str]) -> None:
        """Keep ``acc`` when the agent's filter would; ask for text, geometry, attributes only then."""
        if not (role_kept(role) and states_kept(set(states))):
            return None
        text = self.text(acc)
        if not content_kept(name, text):
            return None
        box = self.extents(acc)
        if box is None or not geometry_kept(*box):
            return None
        el = ET.Element(role, {"name": name})
        describe(el, states, self.attributes(acc), self.description(acc), text, box)
        self.kept.append(el)
        return None

    def collect(self, app) -> bool:
        """The agent view of one Chromium application by one Collection search and pipelined D-Bus
        calls (``atspi_search.py``) instead of a walk; False when the application is another or
        cannot be searched (it is walked then)."""
        try:
            if (app.toolkitName or "") not in COLLECTION_TOOLKITS:
                return False
            bus_name = app.app.bus_name
            search = AgentSearch(search_bus(), self.limits, self.state_name, describe)
            kept = search.kept(bus_name)
        except Exception:  # SearchError, or a bus or application that went away: walk instead
            return False
        self.nodes += 1 + len(kept)
        self.kept.extend(kept)
        self.searched += 1
        return True

    def state_name(self, number: int) -> str:
        """OSWorld's name of a state number (``multi-line``)."""
        name = self.state_names.get(number)
        if name is None:
            from gi.repository import Atspi

            name = self.pyatspi.stateToString(Atspi.StateType(number)).replace(" ", "-")
        return name

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
        """The whole tree: ``desktop-frame`` with one element per application (the agent view: the
        kept nodes, in document order)."""
        root = ET.Element("desktop-frame", {"name": "main"})
        desk = self.pyatspi.Registry.getDesktop(0)
        for i in range(desk.childCount):
            if self.exhausted():
                break
            try:
                app = desk.getChildAtIndex(i)
            except Exception:
                continue
            if app is None:
                continue
            if self.agent and self.limits["collect"] and self.collect(app):
                continue
            el = self.node(app, 1)
            if el is not None:
                root.append(el)
        root.extend(self.kept)
        if self.agent:
            root.set("searched", str(self.searched))
        if self.cut:
            root.set("truncated", "true")
        return root


def answer(pyatspi, line: str) -> dict:
    """The answer to one request line."""
    try:
        request = json.loads(line) if line.strip() else {}
        return {"xml": ET.tostring(Dumper(pyatspi, request).desktop(), encoding="unicode")}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


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
        reply = answer(pyatspi, line) if pyatspi is not None else {"error": failure}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
