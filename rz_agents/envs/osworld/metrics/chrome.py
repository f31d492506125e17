"""Chrome metrics: tabs and URLs, bookmarks, settings, history and cookies."""

from __future__ import annotations

import itertools
import re
import urllib.parse
from collections.abc import Callable
from typing import Any


def normalize_url(url: str) -> str:
    """OSWorld's URL normalisation (``compare_urls`` of its metrics' utils).

    The scheme defaults to ``http`` and is lowercased; the network location is lowercased with
    every ``www.`` removed (anywhere in it, as OSWorld's ``str.replace``); a path of exactly ``/``
    becomes empty. Nothing else changes: ``/about/`` and ``/about`` differ, queries and fragments
    count, and a bare host (``example.com``, no scheme) parses as a path. Kept as OSWorld has it so
    scores are comparable with its leaderboard.
    """
    parsed = urllib.parse.urlparse(url)
    path = "" if parsed.path == "/" else parsed.path
    return urllib.parse.urlunparse(
        parsed._replace(
            scheme=(parsed.scheme or "http").lower(),
            netloc=parsed.netloc.lower().replace("www.", ""),
            path=path,
        )
    )


def compare_urls(url1: str | None, url2: str | None) -> bool:
    """Equal after ``normalize_url``; a missing URL equals only another missing one."""
    if url1 is None or url2 is None:
        return url1 == url2
    return normalize_url(url1) == normalize_url(url2)


def is_expected_active_tab(active_tab_info: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when the active tab (its info dict or its URL) shows ``rule["url"]`` (``compare_urls``).

    Only ``rule["type"] == "url"`` exists; any other type scores 0, as in OSWorld.
    """
    if not active_tab_info or rule["type"] != "url":
        return 0.0
    actual = active_tab_info.get("url") if isinstance(active_tab_info, dict) else active_tab_info
    return float(compare_urls(rule["url"], actual))


def is_expected_tabs(open_tabs: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when there are as many open tabs as ``rule["urls"]`` and each expected URL matches some tab.

    OSWorld's ``are_lists_equal``: lengths equal and every expected URL found among the tabs, so
    order is ignored and duplicates are not counted (``[a, a]`` matches tabs ``[a, b]``).
    """
    if rule["type"] != "url":
        return 0.0
    actual = [tab["url"] for tab in open_tabs]  # no tabs (None) raises: the evaluator scores 0
    expected = rule["urls"]
    if len(actual) != len(expected):
        return 0.0
    return float(all(any(compare_urls(e, a) for a in actual) for e in expected))


def is_expected_url_pattern_match(result: Any, rules: dict[str, Any], **_: Any) -> float:
    """1 when the (active tab's) URL matches every regex in ``rules["expected"]`` (``re.search``).

    As OSWorld: a falsy result scores 0; a tab dict's ``url`` is used as it is (an empty pattern
    list passes even when the URL is missing; a pattern against a missing URL raises, scored 0).
    """
    if not result:
        return 0.0
    url = result["url"] if isinstance(result, dict) else result
    return float(all(re.search(p, url) for p in rules["expected"]))


def _bookmark_bar(bookmarks: dict[str, Any]) -> list[dict[str, Any]]:
    return bookmarks["bookmark_bar"]["children"]


def is_expected_bookmarks(bookmarks: Any, rule: dict[str, Any], **_: Any) -> float:
    """Bookmark bar checks: folder names, site URLs (as sets), or a ``Liked Authors`` folder.

    ``liked_authors_websites_urls``: the folder's URLs equal (as a set) one choice per entry of
    ``rule["urls"]`` (an entry is a URL or a list of acceptable URLs).
    """
    if not bookmarks:
        return 0.0
    kind = rule["type"]
    if kind == "bookmark_bar_folders_names":
        return float(
            {b["name"] for b in _bookmark_bar(bookmarks) if b["type"] == "folder"} == set(rule["names"])
        )
    if kind == "bookmark_bar_websites_urls":
        return float({b["url"] for b in _bookmark_bar(bookmarks) if b["type"] == "url"} == set(rule["urls"]))
    if kind == "liked_authors_websites_urls":
        folder = next(
            (b for b in _bookmark_bar(bookmarks) if b["type"] == "folder" and b["name"] == "Liked Authors"),
            None,
        )
        if folder is None:
            return 0.0
        urls = {b["url"] for b in folder["children"] if b["type"] == "url"}
        choices = [[u] if isinstance(u, str) else list(u) for u in rule["urls"]]
        return float(any(set(combo) == urls for combo in itertools.product(*choices)))
    raise ValueError(f"is_expected_bookmarks: rule type {kind!r} not supported")


def check_font_size(font_size: Any, rule: dict[str, Any], **_: Any) -> float:
    """The default font size equals ``rule["value"]`` or lies strictly inside ``(min, max)``."""
    size = font_size["default_font_size"]
    if rule["type"] == "value":
        return float(size == rule["value"])
    if rule["type"] == "range":
        return float(rule["min"] < size < rule["max"])
    raise ValueError(f"check_font_size: rule type {rule['type']!r} not supported")


def check_enabled_experiments(enabled_experiments: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when the enabled ``chrome://flags`` names (``@<option>`` dropped) equal ``rule["names"]``.

    Compared as lists, in order, as OSWorld does: the same flags in another order score 0.
    """
    if rule["type"] != "names":
        raise ValueError(f"check_enabled_experiments: rule type {rule['type']!r} not supported")
    names = [e.split("@")[0] for e in enabled_experiments]  # None raises: the evaluator scores 0
    return float(names == list(rule["names"]))


def is_shortcut_on_desktop(shortcuts: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when some Desktop launcher's text contains ``Name=<name>`` followed by a newline.

    OSWorld's substring test: a last line without its newline does not count, and
    ``GenericName=<name>`` does. Only the ``name`` rule exists (``url``/``id`` raise, as there).
    """
    if rule["type"] != "name":
        raise ValueError(f"is_shortcut_on_desktop: rule type {rule['type']!r} not supported")
    want = "Name=" + rule["name"] + "\n"
    return float(any(want in content for content in shortcuts.values()))


def check_history_deleted(history: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when no history URL contains any of ``rule["keywords"]`` (no database raises: scored 0)."""
    if rule["type"] != "keywords":
        raise ValueError(f"check_history_deleted: rule type {rule['type']!r} not supported")
    return float(not any(kw in row[0] for row in history for kw in rule["keywords"]))


def is_cookie_deleted(cookie_data: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when no cookie's host equals (``compare_urls``) one of ``rule["domains"]``.

    OSWorld compares hosts whole, not by suffix (a scheme-less host parses as a path, so not even
    ``www.`` is dropped): with ``domains: [".amazon.com"]`` cookies of ``amazon.com``,
    ``www.amazon.com`` or ``.smile.amazon.com`` do not count, and the task passes while they remain.
    Arguably wrong; kept for leaderboard comparability.
    """
    if rule["type"] != "domains":
        raise ValueError(f"is_cookie_deleted: rule type {rule['type']!r} not supported")
    hosts = [row[1] for row in cookie_data]  # no database (None) raises: the evaluator scores 0
    return float(not any(compare_urls(d, h) for d in rule["domains"] for h in hosts))


def is_expected_installed_extensions(installed_extensions: Any, expected: dict[str, Any], **_: Any) -> float:
    """1 when every expected extension name is among the installed ones (a subset test)."""
    return float(set(expected["expected"]) <= set(installed_extensions))


def is_expected_search_query(active_tab_info: Any, rules: dict[str, Any], **_: Any) -> float:
    """1 when the active tab's URL matches ``rules["expect"]["pattern"]`` (``re.search``)."""
    return float(re.search(rules["expect"]["pattern"], active_tab_info["url"]) is not None)


def is_added_to_steam_cart(active_tab_info: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when every item name occurs in the page's content."""
    content = active_tab_info["content"]
    return float(all(item in content for item in rule["items"]))


# bs4's multi-valued attributes (whitespace-separated lists) under its default HTML builder.
_MULTI_VALUED = {
    "class", "rel", "rev", "accept-charset", "headers", "accesskey", "dropzone", "archive", "sizes",
}  # fmt: skip
_OWN_STRINGS = {"script", "style", "template"}


def _html_nodes(path: str) -> list[Any]:
    """The document in ``BeautifulSoup(f, "lxml").recursiveChildGenerator()`` order: each element as
    ``(tag, text, attrs)``, each text node (comments included) as its string."""
    from lxml import etree

    with open(path, encoding="utf-8") as f:
        root = etree.fromstring(f.read().encode(), etree.HTMLParser())
    out: list[Any] = []
    if root is None:
        return out

    def attrs(el: Any) -> dict[str, Any]:
        return {k: (v.split() if k in _MULTI_VALUED else v) for k, v in el.attrib.items()}

    def strings(el: Any, top: bool) -> list[str]:
        # bs4 keeps script/style/template strings out of an enclosing tag's text
        if not top and el.tag in _OWN_STRINGS:
            return []
        parts = [el.text] if el.text else []
        for child in el:
            if isinstance(child.tag, str):
                parts += strings(child, False)
            if child.tail:
                parts.append(child.tail)
        return parts

    def text(el: Any) -> str:
        return "".join(strings(el, True))

    def walk(el: Any) -> None:
        if not isinstance(el.tag, str):  # a comment or processing instruction: a string in bs4
            out.append(el.text or "")
            return
        out.append((el.tag, text(el).strip(), attrs(el)))
        if el.text:
            out.append(el.text)
        for child in el:
            walk(child)
            if child.tail:
                out.append(child.tail)

    walk(root)
    return out


def compare_htmls(html_path1: str, html_path2: str, **_: Any) -> float:
    """1 when the two documents' nodes agree pairwise: elements by name, stripped text and attributes,
    text nodes by value. As OSWorld (``zip``), nodes past the shorter document are not compared."""
    for a, b in zip(_html_nodes(html_path1), _html_nodes(html_path2), strict=False):
        if a != b:
            return 0.0
    return 1.0


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
    "is_expected_installed_extensions": is_expected_installed_extensions,
    "is_expected_search_query": is_expected_search_query,
    "is_added_to_steam_cart": is_added_to_steam_cart,
    "compare_htmls": compare_htmls,
}
