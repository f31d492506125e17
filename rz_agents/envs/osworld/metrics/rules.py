"""OSWorld's small rule language: ``{"method": ..., "ref": ...}`` matched against one value.

Methods: ``eq ne lt le gt ge`` (Python's operators), ``re`` with optional flags (``re.S``,
``re.I.M``: ``re.search(ref, value, flags)``), ``approx:T`` (``|float(value) - ref| <= T``),
``range.XY`` (``ref[0] <X value <Y ref[1]`` with X, Y in ``t`` = strict, ``e`` = or equal),
``str_list_eq`` / ``str_set_eq`` (a comma-separated string against a list, as list or set) and
``spreadsheet_range`` (a cell range set between ``ref[0]`` and ``ref[1]``).
"""

from __future__ import annotations

import functools
import operator
import re
from typing import Any

_COMPARE = {
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}
_RANGE_SIDE = {"t": operator.lt, "e": operator.le}


class RuleError(ValueError):
    """The rule's method is not one OSWorld defines."""


def _regex_flags(method: str) -> int:
    names = method.split(".")[1:]
    try:
        return functools.reduce(operator.or_, (getattr(re, n) for n in names), 0)
    except AttributeError as exc:
        raise RuleError(f"unknown regex flag in {method!r}") from exc


def _ranges(ranges: Any) -> list[tuple[int, int, int, int]]:
    """(min_row, min_col, max_row, max_col) of each range in a space-separated A1 list."""
    from openpyxl.worksheet.cell_range import MultiCellRange

    multi = ranges if isinstance(ranges, MultiCellRange) else MultiCellRange(str(ranges))
    return [(r.min_row, r.min_col, r.max_row, r.max_col) for r in multi.ranges]


def _within(inner: Any, outer: Any) -> bool:
    """Every range of ``inner`` lies inside one range of ``outer`` (no cell enumeration: D2:D1048576 is
    fine)."""
    boxes = _ranges(outer)
    return all(
        any(o[0] <= i[0] and o[1] <= i[1] and i[2] <= o[2] and i[3] <= o[3] for o in boxes)
        for i in _ranges(inner)
    )


def match_value_to_rule(value: Any, rule: dict[str, Any]) -> bool:
    """True when ``value`` satisfies ``rule``; ``RuleError`` for an unknown method."""
    method = str(rule["method"])
    ref = rule.get("ref")
    if method.startswith("re"):
        return value is not None and re.search(ref, str(value), _regex_flags(method)) is not None
    if method in _COMPARE:
        try:
            return bool(_COMPARE[method](value, ref))
        except TypeError:
            return False  # e.g. None < 3: the value is not what the rule expects
    if method.startswith("approx:"):
        try:
            return abs(float(value) - float(ref)) <= float(method.split(":", 1)[1])
        except (TypeError, ValueError):
            return False
    if method.startswith("range.") and len(method) == 8:
        left, right = _RANGE_SIDE.get(method[6]), _RANGE_SIDE.get(method[7])
        if left is None or right is None:
            raise RuleError(f"unknown range method {method!r}")
        try:
            return left(ref[0], value) and right(value, ref[1])
        except TypeError:
            return False
    if method in ("str_list_eq", "str_set_eq"):
        kind = list if method == "str_list_eq" else set
        items = str(value).strip("\"'").split(",") if value is not None else []
        return kind(items) == kind(ref)
    if method == "spreadsheet_range":
        return _within(ref[0], value) and _within(value, ref[1])
    raise RuleError(f"unknown rule method {method!r}")


def match_record(pattern: dict[str, Any], record: dict[str, Any]) -> bool:
    """True when every key of ``pattern`` is in ``record`` with an equal value."""
    return all(k in record and record[k] == v for k, v in pattern.items())
