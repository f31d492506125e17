"""OSWorld's node filter for the text agent (``judge_node`` of its ``heuristic_retrieve.py``, ubuntu).

One definition for both sides: the host's ``a11y.linearize`` applies it to a tree's XML, and the
desktop's tree helper (``atspi_tree.py``, run by the SYSTEM Python) applies it while walking, to
fetch only what the agent's table needs. So this file imports nothing but the standard library.

A node is kept when its role is one the agent reads, it is showing and visible, it can be acted on
(enabled, editable, expandable or checkable), it has a name or text, and it lies on screen.
"""

from __future__ import annotations

KEPT_SUFFIXES = ("item", "button", "heading", "label", "scrollbar", "searchbox", "textbox", "link",
                 "tabelement", "textfield", "textarea", "menu")  # fmt: skip
KEPT_TAGS = frozenset({"alert", "canvas", "check-box", "combo-box", "entry", "icon", "image", "paragraph",
                       "scroll-bar", "section", "slider", "static", "table-cell", "terminal",
                       "text"})  # fmt: skip
ACTIONABLE_STATES = ("enabled", "editable", "expandable", "checkable")


def role_kept(tag: str) -> bool:
    """Whether a node of this role (the XML tag: ``push-button``) can be in the agent's table."""
    return tag.startswith("document") or tag.endswith(KEPT_SUFFIXES) or tag in KEPT_TAGS


def states_kept(states: set[str] | frozenset[str]) -> bool:
    """Whether a node with these states (``showing``, ``visible``, ...) can be in the agent's table."""
    return "showing" in states and "visible" in states and any(s in states for s in ACTIONABLE_STATES)


def content_kept(name: str, text: str | None) -> bool:
    """A name, or text (OSWorld tests the text as it is: whitespace counts)."""
    return name != "" or (text is not None and len(text) > 0)


def geometry_kept(x: float, y: float, w: float, h: float) -> bool:
    """On screen: a non-negative position and a positive size (a node without geometry has neither)."""
    return x >= 0 and y >= 0 and w > 0 and h > 0
