"""The agent view of a Chromium application: one Collection search and pipelined D-Bus calls.

Runs under the SYSTEM Python, beside ``atspi_tree.py`` (which uses it for the ``agent`` view):
imports nothing but the standard library, ``agent_filter`` and GLib's Gio.

A walk through pyatspi asks each property of each object in its own blocking D-Bus round trip:
~130 us of this process and ~170 us of Chromium's browser process a call, measured. Here the
calls go to the application's own peer-to-peer socket (``GetApplicationBusAddress``, as libatspi
does) and are sent in batches, every call of a batch before the first answer is read, which
Chromium answers in one wake-up: ~70 us and ~40 us a call. The work:

1. ``Collection.GetMatches`` on the application's root: every showing, visible object, in tree
   order (one call; Chromium searches its own tree);
2. for each match its role and states, then for those that pass, its properties (name, parent,
   description: one ``GetAll``), text, geometry and attributes (two batches);
3. for each kept node, where the walk of ``atspi_tree.py`` would reach it: its ancestors, level
   by level, each showing (or an application, frame or window) and within the depth limit.

Role numbers are named with libatspi's own table (as pyatspi names them), states as OSWorld's
server names them. Any failure of the connection raises ``SearchError``: the caller walks instead.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from agent_filter import content_kept, geometry_kept, role_kept, states_kept

ROOT = "/org/a11y/atspi/accessible/root"
NULL = "/org/a11y/atspi/null"
ACCESSIBLE = "org.a11y.atspi.Accessible"
PROPERTIES = "org.freedesktop.DBus.Properties"
MATCH_ALL = 1
SORT_CANONICAL = 1
COORDS_SCREEN = 0
STATE_SHOWING, STATE_VISIBLE = 25, 30  # AtspiStateType numbers


def _string(reply) -> str:  # (s)
    return reply.get_child_value(0).get_string()


def _uint(reply) -> int:  # (u)
    return reply.get_child_value(0).get_uint32()


def _words(reply) -> tuple[int, int]:  # (au): a state set
    words = reply.get_child_value(0)
    return words.get_child_value(0).get_uint32(), words.get_child_value(1).get_uint32()


def _prop_path(reply) -> str:  # (v) holding (so): the object's path
    return reply.get_child_value(0).get_variant().get_child_value(1).get_string()


def _accessible(reply) -> tuple[str, str | None, str]:  # (a{sv}): name, parent's path, description
    props = reply.get_child_value(0)
    name, parent, description = (props.lookup_value(key, None) for key in ("Name", "Parent", "Description"))
    return (
        name.get_string() if name is not None else "",
        parent.get_child_value(1).get_string() if parent is not None else None,
        description.get_string() if description is not None else "",
    )


def _paths(reply) -> list[str]:  # (a(so))
    refs = reply.get_child_value(0)
    return [refs.get_child_value(i).get_child_value(1).get_string() for i in range(refs.n_children())]


def _box(reply) -> tuple[int, int, int, int]:  # ((iiii))
    box = reply.get_child_value(0)
    return tuple(box.get_child_value(i).get_int32() for i in range(4))


def _attributes(reply) -> dict[str, str]:  # (a{ss})
    return reply.get_child_value(0).unpack()


class SearchError(RuntimeError):
    """The application could not be searched (no peer connection, no Collection interface)."""


class Bus:
    """This desktop's accessibility bus and a peer-to-peer connection per application."""

    def __init__(self) -> None:
        from gi.repository import Atspi, Gio, GLib

        self.Gio, self.GLib, self.Atspi = Gio, GLib, Atspi
        session = Gio.bus_get_sync(Gio.BusType.SESSION, None)
        reply = session.call_sync(
            "org.a11y.Bus", "/org/a11y/bus", "org.a11y.Bus", "GetAddress", None, None, 0, 5000, None
        )
        flags = Gio.DBusConnectionFlags.AUTHENTICATION_CLIENT | Gio.DBusConnectionFlags.MESSAGE_BUS_CONNECTION
        self.bus = Gio.DBusConnection.new_for_address_sync(reply.unpack()[0], flags, None, None)
        self.peers: dict[str, object] = {}
        self.role_names = {n: Atspi.role_get_name(Atspi.Role(n)) for n in range(int(Atspi.Role.LAST_DEFINED))}
        self.state_names = {}

    def peer(self, bus_name: str):
        """A peer-to-peer connection to the application ``bus_name`` (its own socket)."""
        conn = self.peers.get(bus_name)
        if conn is not None and not conn.is_closed():
            return conn
        # applications come and go (a reset restarts Chromium): forget the connections that closed
        self.peers = {name: c for name, c in self.peers.items() if not c.is_closed()}
        try:
            reply = self.bus.call_sync(
                bus_name,
                ROOT,
                "org.a11y.atspi.Application",
                "GetApplicationBusAddress",
                None,
                None,
                0,
                5000,
                None,
            )
            address = reply.unpack()[0]
            if not address:
                raise SearchError(f"{bus_name} has no peer-to-peer address")
            conn = self.Gio.DBusConnection.new_for_address_sync(
                address, self.Gio.DBusConnectionFlags.AUTHENTICATION_CLIENT, None, None
            )
        except self.GLib.Error as exc:
            raise SearchError(f"{bus_name}: {exc.message}") from exc
        self.peers[bus_name] = conn
        return conn

    def batch(self, conn, calls: list[tuple], timeout_ms: int) -> list:
        """Send every ``(path, interface, method, args, decode)`` call, then collect the answers in
        order: ``decode(reply)``, or None for a call that failed (a vanished object, a missing
        interface). Decoders read the reply's values directly (GLib's generic ``unpack`` costs
        more than the call)."""
        results: list = [None] * len(calls)
        pending = [len(calls)]
        error = self.GLib.Error

        def done(source, result, index: int) -> None:
            try:
                results[index] = calls[index][4](source.call_finish(result))
            except (error, ValueError, TypeError, IndexError):
                results[index] = None
            pending[0] -= 1

        for index, (path, interface, method, args, _decode) in enumerate(calls):
            conn.call(None, path, interface, method, args, None, 0, timeout_ms, None, done, index)
        context = self.GLib.MainContext.default()
        while pending[0]:
            context.iteration(True)
        if conn.is_closed():
            raise SearchError("the application's connection closed")
        return results

    def role_name(self, role: int | None) -> str | None:
        """libatspi's name for a role number (None: unknown here, ask the application)."""
        if role is None or role == int(self.Atspi.Role.EXTENDED):
            return None
        return self.role_names.get(role)

    def state_names_of(self, words: list[int], to_name) -> list[str]:
        """State names, in state order, of a state set's two 32-bit words."""
        bits = (words[0] & 0xFFFFFFFF) | ((words[1] & 0xFFFFFFFF) << 32) if len(words) >= 2 else 0
        names = []
        for number in range(64):
            if bits >> number & 1:
                if number not in self.state_names:
                    self.state_names[number] = to_name(number)
                names.append(self.state_names[number])
        return names


def _rule(GLib) -> object:
    """GetMatches' arguments: every showing and visible object, in tree order. Roles are filtered
    here, not in the rule: its role set holds numbers below 128 and a kept role (``push button
    menu``) is 129."""
    states = [(1 << STATE_SHOWING) | (1 << STATE_VISIBLE), 0]
    rule = (states, MATCH_ALL, {}, MATCH_ALL, [0, 0, 0, 0], MATCH_ALL, [], MATCH_ALL, False)
    return GLib.Variant("((aiia{ss}iaiiasib)uib)", (rule, SORT_CANONICAL, 0, True))


class AgentSearch:
    """The kept nodes of one Chromium application, as ``Dumper.agent_node`` would write them."""

    def __init__(self, bus: Bus, limits: dict, to_state_name, describe) -> None:
        self.bus = bus
        self.limits = limits
        self.to_state_name = to_state_name
        self.describe = describe  # (el, states, attributes, description, text, box) -> None
        self.timeout_ms = int(1000 * min(10.0, float(limits["time_s"])))
        v = bus.GLib.Variant
        self.rule = _rule(bus.GLib)
        self.args = {  # built once: a Variant costs more to make than to send
            "Accessible": v("(s)", (ACCESSIBLE,)),
            "Parent": v("(ss)", (ACCESSIBLE, "Parent")),
            "text": v("(ii)", (0, -1)),
            "screen": v("(u)", (COORDS_SCREEN,)),
        }

    def kept(self, bus_name: str) -> list[ET.Element]:
        """The elements of ``bus_name``'s kept nodes, in tree order."""
        conn = self.bus.peer(bus_name)
        matches, top = self._matches(conn, bus_name)
        nodes = self._nodes(conn, self._passing(conn, matches), top)
        reached = self.reached(conn, {node[3] for node in nodes if node[3]}, top)
        out = []
        for role, name, states, parent, text, box, attributes, description in nodes:
            if parent is None or reached.get(parent) is None:
                continue
            el = ET.Element(role, {"name": name})
            self.describe(el, states, sorted((attributes or {}).items()), description or "", text, box)
            out.append(el)
        return out

    def _matches(self, conn, bus_name: str) -> tuple[list[str], set[str]]:
        """The Collection search's matches (tree order) and the application's top-level windows."""
        matches, windows = self.bus.batch(
            conn,
            [
                (ROOT, "org.a11y.atspi.Collection", "GetMatches", self.rule, _paths),
                (ROOT, ACCESSIBLE, "GetChildren", None, _paths),
            ],
            30000,
        )
        if matches is None or windows is None:
            raise SearchError(f"{bus_name}: no Collection search")
        return matches, set(windows)  # the walk's second level, whatever their Parent says

    def _passing(self, conn, matches: list[str]) -> list[tuple[str, str, list[str]]]:
        """(path, role tag, state names) of the matches whose role and states the walk keeps."""
        batch = self.bus.batch
        first = batch(
            conn,
            [
                call
                for path in matches
                for call in (
                    (path, ACCESSIBLE, "GetRole", None, _uint),
                    (path, ACCESSIBLE, "GetState", None, _words),
                )
            ],
            self.timeout_ms,
        )
        roles = {path: self.bus.role_name(role) for path, role in zip(matches, first[::2], strict=True)}
        unnamed = [
            path
            for path, role in zip(matches, first[::2], strict=True)
            if role is not None and roles[path] is None
        ]
        if unnamed:  # extended or unknown roles: the application names them
            for path, name in zip(
                unnamed,
                batch(
                    conn, [(p, ACCESSIBLE, "GetRoleName", None, _string) for p in unnamed], self.timeout_ms
                ),
                strict=True,
            ):
                roles[path] = name or "unknown"
        passing = []  # (path, role, states)
        for path, role, words in zip(matches, first[::2], first[1::2], strict=True):
            if role is None or words is None:
                continue  # vanished
            role_tag = roles[path].replace(" ", "-")
            if not role_kept(role_tag):
                continue
            states = self.bus.state_names_of(words, self.to_state_name)
            if states_kept(set(states)):
                passing.append((path, role_tag, states))
        return passing

    def _nodes(self, conn, passing: list[tuple[str, str, list[str]]], top: set[str]) -> list[tuple]:
        """(role, name, states, parent, text, box, attributes, description) of the passing objects whose
        content and geometry the walk keeps (a top-level window's parent is the root)."""
        args = self.args
        second = self.bus.batch(
            conn,
            [
                call
                for path, _role, _states in passing
                for call in (
                    (path, PROPERTIES, "GetAll", args["Accessible"], _accessible),
                    (path, "org.a11y.atspi.Text", "GetText", args["text"], _string),
                    (path, "org.a11y.atspi.Component", "GetExtents", args["screen"], _box),
                    (path, ACCESSIBLE, "GetAttributes", None, _attributes),
                )
            ],
            self.timeout_ms,
        )
        nodes = []
        for i, (path, role, states) in enumerate(passing):
            props, text, box, attributes = second[4 * i : 4 * i + 4]
            if props is None:
                continue  # vanished
            name, parent, description = props
            text = text.replace("\ufffc", "").replace("\ufffd", "") if text else None
            if not content_kept(name, text) or box is None or not geometry_kept(*box):
                continue
            parent = ROOT if path in top else parent
            nodes.append((role, name, states, parent, text, box, attributes, description))
        return nodes

    def reached(self, conn, parents: set[str], top: set[str]) -> dict[str, int | None]:
        """For each object in ``parents`` (and their ancestors): the depth at which the walk descends
        into it, or None when it does not (a hidden ancestor, too deep). Resolved level by level,
        one batch a level (states and parent; the role only of those not showing); ``top`` are the
        application's windows. An object whose ancestors do not lead to the root raises SearchError."""
        info: dict[str, list] = {}  # path -> [parent, showing, role tag]
        todo = {p for p in parents if p != ROOT}
        while todo:
            paths = sorted(todo)
            answers = self.bus.batch(
                conn,
                [
                    call
                    for path in paths
                    for call in (
                        (path, ACCESSIBLE, "GetState", None, _words),
                        (path, PROPERTIES, "Get", self.args["Parent"], _prop_path),
                    )
                ],
                self.timeout_ms,
            )
            todo = set()
            for path, words, parent in zip(paths, answers[::2], answers[1::2], strict=True):
                showing = (
                    True if words is None else bool(words[0] >> STATE_SHOWING & 1)
                )  # unreadable: as the walk
                parent = ROOT if path in top else parent
                if parent is None or parent == NULL:
                    raise SearchError(f"{path}: its ancestors do not lead to the application")
                info[path] = [parent, showing, ""]
                if parent != ROOT and parent not in info:
                    todo.add(parent)
        prune = self.limits["prune_hidden"]
        hidden = [path for path, (_parent, showing, _role) in info.items() if not showing] if prune else []
        if hidden:  # not showing: pruned unless an application, frame or window
            roles = self.bus.batch(
                conn, [(p, ACCESSIBLE, "GetRole", None, _uint) for p in hidden], self.timeout_ms
            )
            unnamed = []
            for path, role in zip(hidden, roles, strict=True):
                name = self.bus.role_name(role)
                info[path][2] = (name or "").replace(" ", "-")
                if role is not None and name is None:
                    unnamed.append(path)
            if unnamed:
                names = self.bus.batch(
                    conn, [(p, ACCESSIBLE, "GetRoleName", None, _string) for p in unnamed], self.timeout_ms
                )
                for path, name in zip(unnamed, names, strict=True):
                    info[path][2] = (name or "").replace(" ", "-")
        depth: dict[str, int | None] = {ROOT: 1}
        for path in parents:
            chain = []
            while path not in depth:
                chain.append(path)
                path = info[path][0]
            d = depth[path]
            for node in reversed(chain):
                _parent, showing, role = info[node]
                pruned = prune and not showing and role not in ("application", "frame", "window")
                d = None if d is None or pruned or d + 1 >= self.limits["max_depth"] else d + 1
                depth[node] = d
        return depth
