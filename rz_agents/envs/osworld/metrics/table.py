"""Spreadsheet metrics: ``compare_table`` (OSWorld's rule list over two workbooks) and ``compare_csv``.

``compare_table(result, expected, rules=[...])`` passes when every rule passes, in order. Sheets
are named by ``sheet_idx``: an int (the result's n-th sheet), ``RI<n>``/``RN<name>`` (result by
index/name) or ``EI<n>``/``EN<name>`` (expected). Rule types:

- ``sheet_name``: the two workbooks' sheet names are equal;
- ``sheet_data``: cached cell values equal, numbers rounded to ``precision`` (default 4) decimals;
- ``sheet_print``: LibreOffice's CSV exports (``<book>-<sheet>.csv`` next to each book) equal,
  line by line (``ignore_case``);
- ``sheet_fuzzy``: per cell range, ``exact_match``/``includes``/``included_by``/``fuzzy_match``
  after the rule's normalisations;
- ``check_cell``: one cell's ``value`` (as stored) or style properties against rules;
- ``style``: the listed style properties of every cell, conditional formats applied;
- ``chart``, ``pivot_table``, ``row_props``, ``col_props``, ``filter``, ``sparkline``, ``freeze``:
  those objects compared property by property;
- ``zoom``: the sheet's zoom against a rule; ``data_validation``: each validation matches one of
  ``dv_props``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rz_agents.envs.osworld.metrics import xlsx
from rz_agents.envs.osworld.metrics.general import fuzz_ratio, read_text
from rz_agents.envs.osworld.metrics.rules import match_value_to_rule

RULE_TYPES = (
    "sheet_name", "sheet_data", "sheet_print", "sheet_fuzzy", "check_cell", "style", "chart",
    "pivot_table", "row_props", "col_props", "filter", "sparkline", "freeze", "zoom", "data_validation",
)  # fmt: skip


class Books:
    """The result and expected workbooks, each loaded once and only as far as rules need."""

    def __init__(self, result: str, expected: str | None) -> None:
        self.paths = {"R": result, "E": expected}
        self._cache: dict[tuple[str, bool], Any] = {}

    def workbook(self, which: str, data_only: bool) -> Any:
        """openpyxl workbook: formulas and styles (``data_only=False``) or cached values."""
        key = (which, data_only)
        if key not in self._cache:
            import openpyxl

            path = self.paths[which]
            if path is None:
                raise ValueError("this rule needs an expected workbook")
            self._cache[key] = openpyxl.load_workbook(path, data_only=data_only)
        return self._cache[key]

    def sheet_names(self, which: str) -> list[str]:
        """The sheet names of one workbook, in order."""
        return self.workbook(which, True).sheetnames

    def resolve(self, idx: int | str) -> tuple[str, str]:
        """``(R|E, sheet name)`` for a ``sheet_idx`` (an unknown index gives an empty name)."""
        if isinstance(idx, int):
            which, spec = "R", f"I{idx}"
        else:
            which, spec = idx[0], idx[1:]
            if which not in "RE" or spec[:1] not in ("I", "N"):
                raise ValueError(f"unrecognised sheet index {idx!r}")
        if spec.startswith("N"):
            return which, spec[1:]
        names = self.sheet_names(which)
        i = int(spec[1:])
        return which, names[i] if 0 <= i < len(names) else ""

    def sheet(self, idx: int | str, data_only: bool) -> Any:
        """The openpyxl worksheet for ``idx``, or None when the workbook has no such sheet."""
        which, name = self.resolve(idx)
        wb = self.workbook(which, data_only)
        return wb[name] if name in wb.sheetnames else None


def _fuzzy_values(a: str, b: str, rule: dict[str, Any]) -> bool:
    for old, new in rule.get("normalization", []):
        a, b = a.replace(old, new), b.replace(old, new)
    if "trim_leadings" in rule:
        a, b = a.lstrip(rule["trim_leadings"]), b.lstrip(rule["trim_leadings"])
    if "trim_trailings" in rule:
        a, b = a.rstrip(rule["trim_trailings"]), b.rstrip(rule["trim_trailings"])
    if "ignore_chars" in rule:
        drop = set(rule["ignore_chars"])
        a, b = "".join(c for c in a if c not in drop), "".join(c for c in b if c not in drop)
    if rule.get("ignore_case", False):
        a, b = a.lower(), b.lower()
    kind = rule["type"]
    if kind == "includes":
        return b in a
    if kind == "included_by":
        return a in b
    if kind == "fuzzy_match":
        return fuzz_ratio(a, b) >= rule.get("threshold", 85.0)
    if kind == "exact_match":
        return a == b
    raise ValueError(f"sheet_fuzzy: unknown match type {kind!r}")


def _check_rule(books: Books, r: dict[str, Any]) -> bool:
    """One compare_table rule; False also when a named sheet is missing."""
    kind = r["type"]
    if kind == "sheet_name":
        return books.sheet_names("R") == books.sheet_names("E")
    if kind == "sheet_data":
        s1, s2 = books.sheet(r["sheet_idx0"], True), books.sheet(r["sheet_idx1"], True)
        if s1 is None or s2 is None:
            return False
        return xlsx.frames_equal(xlsx.sheet_frame(s1), xlsx.sheet_frame(s2), int(r.get("precision", 4)))
    if kind == "sheet_print":
        (w1, n1), (w2, n2) = books.resolve(r["sheet_idx0"]), books.resolve(r["sheet_idx1"])
        l1, l2 = xlsx.csv_lines(books.paths[w1], n1), xlsx.csv_lines(books.paths[w2], n2)
        if l1 is None or l2 is None:
            return False
        if r.get("ignore_case", False):
            l1, l2 = [x.lower() for x in l1], [x.lower() for x in l2]
        return l1 == l2
    if kind == "sheet_fuzzy":
        (w1, n1), (w2, n2) = books.resolve(r["sheet_idx0"]), books.resolve(r["sheet_idx1"])
        v1, v2 = xlsx.raw_cell_values(books.paths[w1], n1), xlsx.raw_cell_values(books.paths[w2], n2)
        return all(
            _fuzzy_values(str(v1.get(c)), str(v2.get(c)), rule)
            for rule in r["rules"]
            for c in xlsx.range_cells(rule["range"])
        )
    if kind == "check_cell":
        sheet = books.sheet(r["sheet_idx"], False)
        if sheet is None:
            return False
        cell = sheet[r["coordinate"]]
        for prop, rule in r["props"].items():
            if prop == "value":
                which, name = books.resolve(r["sheet_idx"])
                value = xlsx.raw_cell_values(books.paths[which], name).get(r["coordinate"])
            else:
                value = xlsx.cell_style(prop, cell)
            if not match_value_to_rule(value, rule):
                return False
        return True
    if kind == "style":
        sides = []
        for idx in (r["sheet_idx0"], r["sheet_idx1"]):
            ws, values = books.sheet(idx, False), books.sheet(idx, True)
            sides.append({} if ws is None else xlsx.sheet_styles(ws, values, r.get("props", [])))
        return sides[0] == sides[1]
    if kind in ("chart", "pivot_table", "row_props", "col_props", "filter", "freeze"):
        read: Callable[[Any], Any] = {
            "chart": lambda ws: xlsx.sheet_charts(ws, r.get("chart_props", [])),
            "pivot_table": lambda ws: xlsx.sheet_pivots(ws, r.get("pivot_props", [])),
            "row_props": lambda ws: xlsx.rows_or_cols(ws, "row", r.get("props", [])),
            "col_props": lambda ws: xlsx.rows_or_cols(ws, "column", r.get("props", [])),
            "filter": xlsx.sheet_filters,
            "freeze": xlsx.freeze_key,
        }[kind]
        s1, s2 = books.sheet(r["sheet_idx0"], False), books.sheet(r["sheet_idx1"], False)
        if s1 is None or (kind == "freeze" and s2 is None):
            return False
        return read(s1) == (read(s2) if s2 is not None else {})
    if kind == "sparkline":
        (w1, n1), (w2, n2) = books.resolve(r["sheet_idx0"]), books.resolve(r["sheet_idx1"])
        return xlsx.sheet_sparklines(books.paths[w1], n1) == xlsx.sheet_sparklines(books.paths[w2], n2)
    if kind == "zoom":
        sheet = books.sheet(r["sheet_idx"], False)
        return sheet is not None and match_value_to_rule(sheet.sheet_view.zoomScale or 100.0, r)
    if kind == "data_validation":
        sheet = books.sheet(r["sheet_idx"], False)
        if sheet is None:
            return False
        validations = sheet.data_validations.dataValidation
        if len(validations) < len(r["dv_props"]):
            return False
        return all(
            any(
                all(match_value_to_rule(getattr(dv, attr), rule) for attr, rule in props.items())
                for props in r["dv_props"]
            )
            for dv in validations
        )
    raise ValueError(f"compare_table: rule type {kind!r} is not supported")


def compare_table(result: str | None, expected: str | None = None, **options: Any) -> float:
    """1 when every rule in ``options["rules"]`` passes for the two workbooks (see the module doc)."""
    if not result or not os.path.isfile(result):
        return 0.0
    books = Books(result, expected)
    try:
        books.workbook("R", True)
    except Exception:
        return 0.0  # not a workbook: the agent did not save a valid file
    return float(all(_check_rule(books, r) for r in options["rules"]))


def compare_table_options(options: dict[str, Any]) -> str | None:
    """Why these compare_table rules cannot be checked here (None when they can)."""
    for r in options.get("rules", []):
        if r.get("type") not in RULE_TYPES:
            return f"rule type {r.get('type')!r}"
        props = r.get("props", []) if r["type"] == "style" else []
        bad = [p for p in props if p not in xlsx.STYLE_PROPS]
        if bad:
            return f"style property {bad[0]!r}"
    return None


def compare_csv(result: str | None, expected: str | list[str] | None, **options: Any) -> float:
    """1 when the result CSV's lines equal one expected file's (``strict: false`` strips lines,
    ``ignore_case`` lowercases them)."""
    text = read_text(result, "utf-8-sig")
    if text is None:
        return 0.0

    def lines(t: str) -> list[str]:
        out = t.splitlines()
        if not options.get("strict", True):
            out = [x.strip() for x in out]
        if options.get("ignore_case", False):
            out = [x.lower() for x in out]
        return out

    for candidate in expected if isinstance(expected, list) else [expected]:
        other = read_text(candidate, "utf-8-sig")
        if other is not None and lines(text) == lines(other):
            return 1.0
    return 0.0


def compare_conference_city_in_order(
    actual_city_list_path: str, expected_city: dict[str, Any], **_: Any
) -> float:
    """1 when each cell of C2:C22 of the active sheet contains its expected city (a string, or any of
    a list of spellings), in order. As OSWorld: all 21 cells are checked, so a shorter expected
    list, an empty cell or a formula's cell (the workbook is read with formulas, not values) scores 0.
    """
    import openpyxl

    expected = expected_city["expected"]
    ws = openpyxl.load_workbook(actual_city_list_path).active
    actual = [cell.value for row in ws["C2:C22"] for cell in row]
    try:
        for i, value in enumerate(actual):
            want = expected[i]
            if isinstance(want, str):
                if want not in value:
                    return 0.0
            elif isinstance(want, list):
                if not any(option in value for option in want):
                    return 0.0
            else:
                raise TypeError("an expected city is a string or a list of strings")
    except Exception:
        return 0.0
    return 1.0


METRICS: dict[str, Callable[..., float]] = {
    "compare_table": compare_table,
    "compare_csv": compare_csv,
    "compare_conference_city_in_order": compare_conference_city_in_order,
}
OPTION_CHECKS = {"compare_table": compare_table_options}
