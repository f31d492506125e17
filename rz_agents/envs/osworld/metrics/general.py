"""General metrics: literal and list matches, JSON/CSV/list files, SQLite, the accessibility tree.

Semantics follow OSWorld's evaluators (``desktop_env/evaluators/metrics/general.py`` and friends):
a ``None`` result (the getter found nothing) scores 0; the score is in [0, 1].
"""

from __future__ import annotations

import csv
import datetime
import difflib
import json
import operator
import os
import re
import sqlite3
from collections.abc import Callable
from typing import Any

from rz_agents.envs.osworld.metrics.rules import match_record, match_value_to_rule


def lcs_length(a: str, b: str) -> int:
    """Length of the longest common subsequence (bit-parallel, Hyyrö 2004)."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return 0
    masks: dict[str, int] = {}
    for i, ch in enumerate(a):
        masks[ch] = masks.get(ch, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for ch in b:
        u = v & masks.get(ch, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - bin(v).count("1")


def fuzz_ratio(a: str, b: str) -> float:
    """rapidfuzz's ``fuzz.ratio``: 100 * 2 * LCS / total length (100 for two empty strings).

    The normalised Indel similarity, computed exactly (difflib's ratio is a heuristic that can differ).
    """
    if not a and not b:
        return 100.0
    return 100.0 * 2 * lcs_length(a, b) / (len(a) + len(b))


def exact_match(result: Any, rules: dict[str, Any], **_: Any) -> float:
    """1 when the result equals ``rules["expected"]`` (a missing result equals an expected ``None``, as
    OSWorld)."""
    return float(result == rules["expected"])


def check_include_exclude(result: Any, rules: dict[str, Any], **_: Any) -> float:
    """1 when every ``include`` item is in the result and no ``exclude`` item is (``in``, as OSWorld)."""
    if result is None:
        return 0.0
    include, exclude = rules.get("include", []), rules.get("exclude", [])
    return float(all(s in result for s in include) and not any(s in result for s in exclude))


def is_in_list(result: Any, rules: dict[str, Any], **_: Any) -> float:
    """1 when ``rules["expected"]`` is an element (or substring) of the result."""
    return float(result is not None and rules["expected"] in result)


def match_in_list(result: Any, rules: dict[str, Any], **_: Any) -> float:
    """1 when the result is one of ``rules["expected"]``."""
    return float(result is not None and result in rules["expected"])


def literal_match(result: Any, expected: Any, **options: Any) -> float:
    """1 when result and expected are equal as strings (``type: str``) or as lists of strings (``list``).

    No guard for a missing result, as OSWorld: ``None`` compares as the text ``"None"``.
    """
    fold = (lambda s: str(s).lower()) if options.get("ignore_case") else str
    kind = options.get("type", "str")
    if kind == "str":
        return float(fold(result) == fold(expected))
    if kind == "list":
        if not isinstance(result, (list, tuple)) or not isinstance(expected, (list, tuple)):
            return 0.0
        return float([fold(s) for s in result] == [fold(s) for s in expected])
    raise ValueError(f"literal_match: type {kind!r} not supported")


def fuzzy_match(result: Any, rules: dict[str, Any], **_: Any) -> float:
    """Similarity of the result to ``rules["expected"]`` in [0, 1]."""
    if result is None:
        return 0.0
    return fuzz_ratio(str(result), str(rules["expected"])) / 100.0


def read_text(path: str | None, encoding: str = "utf-8") -> str | None:
    """A text file's content (undecodable bytes replaced), None when missing."""
    if not path:
        return None
    try:
        with open(path, encoding=encoding, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def compare_text_file(
    file1: str | None, file2: str | None, ignore_blanks: bool = False, ignore_case: bool = False, **_: Any
) -> float:
    """1 when the two text files match (optionally ignoring whitespace runs and case)."""
    a, b = read_text(file1), read_text(file2)
    if a is None or b is None:
        return 0.0
    if ignore_blanks:
        a, b = re.sub(r"\s+", " ", a).strip(), re.sub(r"\s+", " ", b).strip()
    if ignore_case:
        a, b = a.lower(), b.lower()
    return float(a == b)


def diff_text_file(result: str | None, expected: str | None, **_: Any) -> float:
    """Line-level similarity of two text files in [0, 1]."""
    a, b = read_text(result), read_text(expected)
    if a is None or b is None:
        return 0.0
    return difflib.SequenceMatcher(a=a.splitlines(), b=b.splitlines()).ratio()


def check_direct_json_object(result: Any, rules: dict[str, Any], **_: Any) -> float:
    """Compare a JSON object (or its text, single quotes allowed) with ``rules["expected"]``.

    Plain mode: every expected key has an equal value (``ignore_list_order`` in the expected object
    compares lists sorted). ``expect_in_result``: a string value must occur in the result's
    string, a list value is a set of alternatives of which one must be in (or equal) the result's.
    """
    if isinstance(result, str):
        try:
            result = json.loads(result.strip().replace("'", '"'))
        except json.JSONDecodeError:
            return 0.0
    if not isinstance(result, dict):
        return 0.0
    expected = rules["expected"]
    if not rules.get("expect_in_result", False):
        for key, want in expected.items():
            got = result.get(key)
            if expected.get("ignore_list_order", False):
                try:
                    if sorted(want) != sorted(got):
                        return 0.0
                except TypeError:
                    return 0.0
            elif want != got:
                return 0.0
        return 1.0
    for key, want in expected.items():
        got = result.get(key)
        if isinstance(want, list):
            if not any(
                (isinstance(got, list) and w in got) or (isinstance(got, str) and w == got) for w in want
            ):
                return 0.0
        elif isinstance(want, str):
            # OSWorld tests `want not in got` whatever got is: a list result passes when it holds the
            # string, a missing one raises (caught there: 0)
            try:
                if want not in got:
                    return 0.0
            except TypeError:
                return 0.0
        else:
            return 0.0
    return 1.0


def _load_json(path: str | None) -> Any:
    text = read_text(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def check_json_settings(actual: str | None, expected: dict[str, Any], **_: Any) -> float:
    """1 when the JSON file holds every key of ``expected["expected"]`` with an equal value."""
    data = _load_json(actual)
    if not isinstance(data, dict):
        return 0.0
    return float(all(k in data and data[k] == v for k, v in expected["expected"].items()))


def check_json_keybindings(actual: str | None, expected: dict[str, Any], **_: Any) -> float:
    """1 when the keybindings list (a JSON list, possibly after a comment line) holds
    ``expected["expected"]``."""
    text = read_text(actual)
    if text is None:
        return 0.0
    for candidate in (text, text.split("\n", 1)[1] if "\n" in text else ""):
        try:
            data = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(data, list):
            return float(expected["expected"] in data)
    return 0.0


def check_json(result: str | None, rules: dict[str, Any], is_yaml: bool = False, **_: Any) -> float:
    """Key paths of a JSON (or YAML) file against rules: every ``expect`` matches, no ``unexpect`` does."""
    text = read_text(result)
    if text is None:
        return 0.0
    if is_yaml:
        import yaml

        data = yaml.safe_load(text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return 0.0

    def lookup(keys: list[Any]) -> Any:
        value = data
        for k in keys:
            value = value[k]  # KeyError: the caller's; TypeError/IndexError raise there too (0)
        return value

    def matches(value: Any, rule: dict[str, Any]) -> bool:
        # OSWorld's rule match raises on a regex over a non-string (a missing key's None) and on an
        # ordering of None: the evaluation fails (0) where match_value_to_rule would say "no match".
        method = str(rule["method"])
        if method.startswith("re") and not isinstance(value, str):
            raise TypeError(f"regex rule on {type(value).__name__}")
        if method in ("lt", "le", "gt", "ge"):
            return bool(getattr(operator, method)(value, rule["ref"]))  # None < 1, "a" < 1: TypeError
        return match_value_to_rule(value, rule)

    try:
        for rule in rules.get("expect", []):
            try:
                value = lookup(rule["key"])
            except KeyError:
                return 0.0
            if not matches(value, rule):
                return 0.0
        for rule in rules.get("unexpect", []):
            try:
                value = lookup(rule["key"])
            except KeyError:
                value = None  # as OSWorld: a missing key is None, and the rule is still applied to it
            if matches(value, rule):
                return 0.0
    except (TypeError, IndexError):
        return 0.0
    return 1.0


def check_list(result: str | None, rules: dict[str, Any], **_: Any) -> float:
    """Lines of a text file: each ``expect`` regex matches some line, no ``unexpect`` regex any line."""
    text = read_text(result)
    if text is None:
        return 0.0
    lines = text.splitlines(keepends=True)
    expect = [re.compile(p) for p in rules.get("expect", [])]
    unexpect = [re.compile(p) for p in rules.get("unexpect", [])]
    if not all(any(p.search(line) for line in lines) for p in expect):
        return 0.0
    return float(not any(p.search(line) for p in unexpect for line in lines))


def check_csv(result: str | None, rules: dict[str, Any], **_: Any) -> float:
    """CSV records (with a header): each ``expect`` record is matched by a row, no ``unexpect`` one is."""
    text = read_text(result)
    if text is None:
        return 0.0
    rows = list(csv.DictReader(text.splitlines()))
    expect, unexpect = rules.get("expect", []), rules.get("unexpect", [])
    if not all(any(match_record(r, row) for row in rows) for r in expect):
        return 0.0
    return float(not any(match_record(r, row) for r in unexpect for row in rows))


def run_sqlite3(result: str | None, rules: dict[str, Any], **_: Any) -> float:
    """The first column of the first row ``rules["sql"]`` returns on the database (0 when empty or
    failing)."""
    if not result:
        return 0.0
    try:
        with sqlite3.connect(f"file:{result}?mode=ro", uri=True) as db:
            row = db.execute(rules["sql"]).fetchone()
    except sqlite3.Error:
        return 0.0
    return float((row[0] if row else 0) or 0)


# OSWorld's accessibility-tree namespaces (its Ubuntu tree; ours uses the same).
A11Y_NAMESPACES = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}


def check_accessibility_tree(result: str | None, rules: list[dict[str, Any]], **_: Any) -> float:
    """Each rule selects nodes (``xpath`` or CSS ``selectors``); with ``text`` the best node's text must
    match.

    The score is the product over rules: 1 per exact match, the fuzzy ratio with ``exact: false``,
    0 when a rule selects nothing.
    """
    if not result:
        return 0.0
    import lxml.etree
    from lxml.cssselect import CSSSelector

    root = lxml.etree.fromstring(result.encode() if isinstance(result, str) else result)
    total = 1.0
    for rule in rules:
        if "xpath" in rule:
            nodes = root.xpath(rule["xpath"], namespaces=A11Y_NAMESPACES)
        elif "selectors" in rule:
            nodes = CSSSelector(", ".join(rule["selectors"]), namespaces=A11Y_NAMESPACES)(root)
        else:
            raise ValueError("check_accessibility_tree: a rule needs 'xpath' or 'selectors'")
        if not nodes:
            return 0.0
        if "text" in rule:
            if rule.get("exact", True):
                score = float(any((n.text or "") == rule["text"] for n in nodes))
            else:
                score = max(fuzz_ratio(rule["text"], n.text or "") / 100.0 for n in nodes)
            total *= score
    return total


def check_moved_jpgs(directory_list: Any, rule: dict[str, Any], **_: Any) -> float:
    """1 when the directory's entries (files and folders alike) are exactly the expected names.

    As OSWorld: every child counts, so an extra subdirectory fails the task, and the counts must
    match too (an expected list with a repeated name never passes).
    """
    names = [child["name"] for child in directory_list["children"]]  # None raises: scored 0
    expected = rule["expected"]
    return float(len(names) == len(expected) and set(names) == set(expected))


def file_contains(file_path: str | None, config: dict[str, Any], **_: Any) -> float:
    """1 when the text file contains every string of ``config["expected"]``."""
    if not file_path:
        return 0.0
    try:
        with open(file_path) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return 0.0
    return float(all(item in text for item in config["expected"]))


TIME_OF_DAY = re.compile(r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)")


def check_line_number(file_path: str | None, line_number: dict[str, Any], **_: Any) -> float:
    """1 when the number of lines holding an ``HH:MM:SS`` time equals ``int(expected)``."""
    if file_path is None or not os.path.isfile(file_path):
        return 0.0
    try:
        with open(file_path) as f:
            count = sum(1 for line in f if TIME_OF_DAY.search(line))
        return float(count == int(line_number["expected"]))
    except (OSError, UnicodeDecodeError, ValueError):
        return 0.0


def compare_python_pure_text(py_file_path: str | None, gold_file_path: str | None, **_: Any) -> float:
    """1 when the two files are equal once every whitespace character is removed."""
    if not py_file_path or not gold_file_path:
        return 0.0
    with open(py_file_path) as f1, open(gold_file_path) as f2:
        return float("".join(f1.read().split()) == "".join(f2.read().split()))


def compare_time_in_speedtest_results(speedtest_result_path: str | None, time_diff: Any, **_: Any) -> float:
    """1 when the time (``HH:MM``, the last 5 characters of the second CSV row's second field) is
    within ``time_diff`` minutes of now; any unreadable file or field scores 0. Clock times only:
    across midnight the difference is nearly a day, as in OSWorld."""
    if not speedtest_result_path:
        return 0.0
    try:
        with open(speedtest_result_path) as f:
            date = None
            for i, line in enumerate(f):
                if i == 1:
                    date = line.split(",")[1]
                    break
        fmt = "%H:%M"
        now = datetime.datetime.strptime(datetime.datetime.now().strftime(fmt), fmt)
        then = datetime.datetime.strptime(date[-5:], fmt)
        return float(abs((then - now).total_seconds()) / 60 < int(time_diff))
    except Exception:
        return 0.0


def fuzzy_place_math(result_file_path: str | None, rules: dict[str, Any], **_: Any) -> float:
    """Mean, over the document's whitespace-separated words, of each word's best fuzz ratio against
    the expected answers; exactly 3 words are required (else 0)."""
    if result_file_path is None:
        return 0.0
    from docx import Document

    words = [w for para in Document(result_file_path).paragraphs for w in para.text.split()]
    if len(words) != 3:
        return 0.0
    return sum(max([0.0] + [fuzz_ratio(w, ans) / 100 for ans in rules["expected"]]) for w in words) / 3


METRICS: dict[str, Callable[..., float]] = {
    "exact_match": exact_match,
    "check_include_exclude": check_include_exclude,
    "is_in_list": is_in_list,
    "match_in_list": match_in_list,
    "literal_match": literal_match,
    "fuzzy_match": fuzzy_match,
    "compare_text_file": compare_text_file,
    "diff_text_file": diff_text_file,
    "check_direct_json_object": check_direct_json_object,
    "check_json_settings": check_json_settings,
    "check_json_keybindings": check_json_keybindings,
    "check_json": check_json,
    "check_list": check_list,
    "check_csv": check_csv,
    "run_sqlite3": run_sqlite3,
    "check_accessibility_tree": check_accessibility_tree,
    "check_moved_jpgs": check_moved_jpgs,
    "file_contains": file_contains,
    "check_line_number": check_line_number,
    "compare_python_pure_text": compare_python_pure_text,
    "compare_time_in_speedtest_results": compare_time_in_speedtest_results,
    "fuzzy_place_math": fuzzy_place_math,
}
