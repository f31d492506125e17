"""Chrome metrics: tabs and URLs, bookmarks, settings, history and cookies."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from typing import Any


def normalize_url(url: str) -> str:
    """Scheme and host lowercased, ``www.`` and a trailing ``/`` dropped, so equal pages compare equal."""
    parsed = urllib.parse.urlparse(url.strip())
    host = (parsed.hostname or "").lower().removeprefix("www.")
    netloc = host + (f":{parsed.port}" if parsed.port else "")
    path = parsed.path.rstrip("/")
    return urllib.parse.urlunparse((parsed.scheme.lower(), netloc, path, "", parsed.query, parsed.fragment))


def _url_of(tab: Any) -> str | None:
    if isinstance(tab, dict):
        return tab.get("url")
    return tab if isinstance(tab, str) else None


def is_expected_active_tab(active_tab_info: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when the active tab shows ``rule["url"]`` (``rule["type"] == "url"``)."""
    actual = _url_of(active_tab_info)
    if actual is None or rule.get("type", "url") != "url":
        return 0.0
    return float(normalize_url(actual) == normalize_url(rule["url"]))


def is_expected_tabs(open_tabs: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when the open tabs' URLs are exactly ``rule["urls"]`` (as a multiset).

    Order is ignored, as in OSWorld: CDP lists targets in no guaranteed tab-strip order.
    """
    if not open_tabs or rule.get("type", "url") != "url":
        return 0.0
    actual = sorted(normalize_url(_url_of(t) or "") for t in open_tabs)
    return float(actual == sorted(normalize_url(u) for u in rule["urls"]))


def is_expected_url_pattern_match(result: Any, rules: dict[str, Any], **_: Any) -> float:
    """1 when the (active tab's) URL matches every regex in ``rules["expected"]``."""
    url = _url_of(result)
    if url is None:
        return 0.0
    return float(all(re.search(p, url) for p in rules["expected"]))


def _bookmark_bar(bookmarks: Any) -> list[dict[str, Any]]:
    if not isinstance(bookmarks, dict):
        return []
    return bookmarks.get("bookmark_bar", {}).get("children", [])


def is_expected_bookmarks(bookmarks: Any, rule: dict[str, Any], **_: Any) -> float:
    """Bookmark bar checks: folder names (``bookmark_bar_folders_names``) or site URLs."""
    bar = _bookmark_bar(bookmarks)
    if rule["type"] == "bookmark_bar_folders_names":
        return float({b["name"] for b in bar if b.get("type") == "folder"} == set(rule["names"]))
    if rule["type"] == "bookmark_bar_websites_urls":
        return float({b["url"] for b in bar if b.get("type") == "url"} == set(rule["urls"]))
    raise ValueError(f"is_expected_bookmarks: rule type {rule['type']!r} not supported")


def check_font_size(font_size: Any, rule: dict[str, Any], **_: Any) -> float:
    """The default font size equals ``rule["value"]`` or lies strictly inside ``(min, max)``."""
    if not isinstance(font_size, dict):
        return 0.0
    size = font_size.get("default_font_size")
    if rule["type"] == "value":
        return float(size == rule["value"])
    return float(rule["min"] < size < rule["max"])


def check_enabled_experiments(enabled_experiments: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when the enabled ``chrome://flags`` entries are exactly ``rule["names"]``."""
    if enabled_experiments is None:
        return 0.0
    names = {e.split("@")[0] for e in enabled_experiments}
    return float(names == set(rule["names"]))


def is_shortcut_on_desktop(shortcuts: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when a Desktop launcher has ``Name=<name>`` (type ``name``) or ``Exec=<exec>`` (type ``exec``)."""
    if not shortcuts:
        return 0.0
    key = {"name": "Name=", "exec": "Exec="}.get(rule["type"])
    if key is None:
        raise ValueError(f"is_shortcut_on_desktop: rule type {rule['type']!r} not supported")
    want = key + rule[rule["type"]]
    return float(any(want in content.splitlines() for content in shortcuts.values()))


def check_history_deleted(history: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when no history URL contains any of ``rule["keywords"]``."""
    if history is None:
        return 1.0  # no History database: nothing was kept
    return float(not any(kw in row[0] for row in history for kw in rule["keywords"]))


def is_cookie_deleted(cookie_data: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when no cookie's host ends with one of ``rule["domains"]``."""
    if cookie_data is None:
        return 1.0
    return float(not any(str(row[1]).endswith(d) for row in cookie_data for d in rule["domains"]))


METRICS: dict[str, Callable[..., float]] = {
    "is_expected_active_tab": is_expected_active_tab,
    "is_expected_tabs": is_expected_tabs,
    "is_expected_url_pattern_match": is_expected_url_pattern_match,
    "is_expected_bookmarks": is_expected_bookmarks,
    "check_font_size": check_font_size,
    "check_enabled_experiments": check_enabled_experiments,
    "is_shortcut_on_desktop": is_shortcut_on_desktop,
    "check_history_deleted": check_history_deleted,
    "is_cookie_deleted": is_cookie_deleted,
}
