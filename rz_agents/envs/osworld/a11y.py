"""Turn the desktop's accessibility XML into the table an LLM agent reads, as OSWorld's text agent does.

The XML follows OSWorld's tree: one element per node, tagged by role (``push-button``,
``table-cell``, ...), with ``name``, the node's text as element text, and namespaced attributes
(``st:`` states, ``attr:`` object attributes, ``cp:`` geometry, ``val:`` values). ``linearize``
keeps the nodes OSWorld's filter keeps (``agent_filter``: interactive or textual roles, showing
and visible, enabled, editable, expandable or checkable, on screen, with a name or text) and
writes one tab-separated line per node::

    tag  name  text  class  description  position (top-left x&y)  size (w&h)

In a tree without state attributes (the X11/Chromium fallback, when AT-SPI is unavailable)
every node with a name or text is kept. ``trim`` cuts the table to a token budget.
"""

from __future__ import annotations

import ast
import xml.etree.ElementTree as ET
from collections.abc import Callable

from rz_agents.envs.osworld.agent_filter import content_kept, geometry_kept, role_kept, states_kept

STATE_NS = "https://accessibility.ubuntu.example.org/ns/state"
ATTR_NS = "https://accessibility.ubuntu.example.org/ns/attributes"
COMPONENT_NS = "https://accessibility.ubuntu.example.org/ns/component"
VALUE_NS = "https://accessibility.ubuntu.example.org/ns/value"
TEXT_NS = "https://accessibility.ubuntu.example.org/ns/text"
ACTION_NS = "https://accessibility.ubuntu.example.org/ns/action"
DOC_NS = "https://accessibility.ubuntu.example.org/ns/document"
NAMESPACES = {
    "st": STATE_NS,
    "attr": ATTR_NS,
    "cp": COMPONENT_NS,
    "val": VALUE_NS,
    "txt": TEXT_NS,
    "act": ACTION_NS,
    "doc": DOC_NS,
}

HEADER = "tag\tname\ttext\tclass\tdescription\tposition (top-left x&y)\tsize (w&h)"
TRUNCATED = "[...]"


def _pair(value: str | None) -> tuple[float, float]:
    try:
        x, y = ast.literal_eval(value) if value else (-1, -1)
        return float(x), float(y)
    except (ValueError, SyntaxError, TypeError):
        return -1.0, -1.0


def _geometry(node: ET.Element) -> tuple[str, str]:
    pos = node.get(f"{{{COMPONENT_NS}}}screencoord", node.get("screencoord", ""))
    size = node.get(f"{{{COMPONENT_NS}}}size", node.get("size", ""))
    return pos, size


def keep_node(node: ET.Element, atspi: bool = True) -> bool:
    """OSWorld's filter for one node of an AT-SPI tree (``agent_filter``); in the fallback tree
    (``atspi=False``, no states) a name or text is enough."""
    name = node.get("name", "")
    if not atspi:
        return bool(name or (node.text or "").strip() or node.get("text")) and node.tag != "desktop-frame"
    if not role_kept(node.tag):
        return False
    prefix = f"{{{STATE_NS}}}"
    states = {k[len(prefix) :] for k, v in node.attrib.items() if k.startswith(prefix) and v == "true"}
    if not (states_kept(states) and content_kept(name, node.text)):
        return False
    pos, size = _geometry(node)
    (x, y), (w, h) = _pair(pos), _pair(size)
    return geometry_kept(x, y, w, h)


def _cell(value: str) -> str:
    value = value.replace("\t", " ").replace("\n", "\\n")
    return f'"{value.replace(chr(34), chr(34) * 2)}"' if '"' in value else value


def linearize(xml: str | None) -> str:
    """The filtered table of the tree (header line first); an explanatory line if there is no tree."""
    if not xml:
        return "(no accessibility tree)"
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        return f"(accessibility tree unreadable: {exc})"
    atspi = any(n.get(f"{{{STATE_NS}}}showing") is not None for n in root.iter())
    lines = [HEADER]
    for node in root.iter():
        if not keep_node(node, atspi):
            continue
        text = (node.text or "").strip() or node.get("text", "")
        pos, size = _geometry(node)
        lines.append(
            "\t".join(
                (
                    node.tag,
                    _cell(node.get("name", "")),
                    _cell(text) if text else '""',
                    node.get(f"{{{ATTR_NS}}}class", ""),
                    _cell(node.get(f"{{{ATTR_NS}}}description", "")),
                    pos,
                    size,
                )
            )
        )
    return "\n".join(lines)


def approx_tokens(text: str) -> int:
    """A cheap, generous token estimate (3 characters per token: trees are digit- and symbol-heavy)."""
    return (len(text) + 2) // 3


def trim(table: str, max_tokens: int, count: Callable[[str], int] = approx_tokens) -> str:
    """``table`` cut at a line boundary to at most ``max_tokens`` (by ``count``), marked when cut."""
    if count(table) <= max_tokens:
        return table
    lines = table.split("\n")
    lo, hi = 1, len(lines)  # binary search on the number of lines kept
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count("\n".join(lines[:mid]) + "\n" + TRUNCATED) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return "\n".join(lines[:lo]) + "\n" + TRUNCATED
