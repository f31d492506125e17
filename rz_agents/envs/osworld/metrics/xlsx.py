"""Read what ``compare_table`` compares from an .xlsx file: values, styles, charts, pivots and more.

Each reader mirrors one of OSWorld's (``metrics/utils.py``): the values a rule compares are
built the same way for the result and the expected workbook, so equal documents compare equal.
openpyxl is imported where a workbook is read (importing this module stays cheap for
``rz osworld validate``).
"""

from __future__ import annotations

import itertools
import os
import posixpath
import re
import zipfile
from typing import Any
from xml.etree import ElementTree as ET

from rz_agents.envs.osworld.metrics.excel_formula import FormulaError, compare, evaluate, truthy

NS = {
    "m": "http://schemas.openxmlformats.org/spreadsheetml/2006/main",
    "r": "http://schemas.openxmlformats.org/officeDocument/2006/relationships",
    "rel": "http://schemas.openxmlformats.org/package/2006/relationships",
    "x14": "http://schemas.microsoft.com/office/spreadsheetml/2009/9/main",
    "xm": "http://schemas.microsoft.com/office/excel/2006/main",
}


# --- raw cell values, read from the XML as OSWorld's read_cell_value does -----------------------


def _sheet_part(z: zipfile.ZipFile, sheet_name: str) -> str | None:
    """The zip member holding ``sheet_name`` (through the workbook's relationships)."""
    wb = ET.fromstring(z.read("xl/workbook.xml"))
    rels = ET.fromstring(z.read("xl/_rels/workbook.xml.rels"))
    targets = {r.get("Id"): r.get("Target") for r in rels.findall("rel:Relationship", NS)}
    for sheet in wb.findall("m:sheets/m:sheet", NS):
        if sheet.get("name") == sheet_name:
            target = targets.get(sheet.get(f"{{{NS['r']}}}id"), "")
            return (
                target.lstrip("/")
                if target.startswith("/")
                else posixpath.normpath(posixpath.join("xl", target))
            )
    return None


def _shared_strings(z: zipfile.ZipFile) -> list[str]:
    try:
        root = ET.fromstring(z.read("xl/sharedStrings.xml"))
    except KeyError:
        return []
    return ["".join(t.text or "" for t in si.iter(f"{{{NS['m']}}}t")) for si in root.findall("m:si", NS)]


def raw_cell_values(path: str, sheet_name: str) -> dict[str, Any]:
    """``{coordinate: value}`` as stored: numbers as float, text as str, booleans as bool."""
    try:
        with zipfile.ZipFile(path) as z:
            part = _sheet_part(z, sheet_name)
            if part is None:
                return {}
            shared = _shared_strings(z)
            root = ET.fromstring(z.read(part))
    except (OSError, KeyError, zipfile.BadZipFile, ET.ParseError):
        return {}
    out: dict[str, Any] = {}
    for c in root.iter(f"{{{NS['m']}}}c"):
        kind, v = c.get("t", "n"), c.find("m:v", NS)
        text = v.text if v is not None else None
        try:
            if kind == "n" and text is not None:
                out[c.get("r")] = float(text)
            elif kind == "s" and text is not None:
                out[c.get("r")] = shared[int(text)]
            elif kind == "str":
                out[c.get("r")] = text or ""
            elif kind == "inlineStr":
                out[c.get("r")] = "".join(t.text or "" for t in c.iter(f"{{{NS['m']}}}t"))
            elif kind == "b" and text is not None:
                out[c.get("r")] = text == "1"
        except (ValueError, IndexError):
            continue
    return out


# --- the value grid, as pandas.read_excel sees a sheet -----------------------------------------


NA = float("nan")
# pandas' default ``na_values``: text read as missing.
NA_STRINGS = frozenset(
    ["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>", "N/A",
     "NA", "NULL", "NaN", "None", "n/a", "nan", "null"]
)  # fmt: skip
TRUE_STRINGS, FALSE_STRINGS = frozenset(["True", "TRUE", "true"]), frozenset(["False", "FALSE", "false"])
INT_TEXT = re.compile(r"^\s*[+-]?\d+\s*$")


def value_grid(ws: Any) -> list[list[Any]]:
    """Rows of cached values as pandas' openpyxl reader returns them (before parsing).

    Empty cells are ``""``, error cells NaN, integral floats ints; trailing empty cells and rows
    dropped, rows padded with ``""`` to one width.
    """
    rows: list[list[Any]] = []
    last = -1
    for i, row in enumerate(ws.iter_rows()):
        values = []
        for cell in row:
            v = cell.value
            if v is None:
                v = ""
            elif cell.data_type == "e":
                v = NA
            elif isinstance(v, float) and v.is_integer():
                v = int(v)
            values.append(v)
        while values and values[-1] == "":
            values.pop()
        if values:
            last = i
        rows.append(values)
    rows = rows[: last + 1]
    width = max((len(r) for r in rows), default=0)
    return [r + [""] * (width - len(r)) for r in rows]


def _is_na(v: Any) -> bool:
    return isinstance(v, float) and v != v


def _column(values: list[Any]) -> tuple[str, list[Any]]:
    """A data column as ``pandas`` types it: ``(kind, values)``, kind int/float/bool/object.

    Text that is a number becomes that number, pandas' ``maybe_convert_numeric``: a column of
    ``"1"`` (number stored as text) and ``2`` is the integers ``[1, 2]``. Missing text (``NA_STRINGS``)
    is NaN; a column with a NaN is float. Otherwise all-``True``/``False`` (or their text) is bool,
    and anything else stays object (its missing text NaN, its numbers as they are).
    """
    values = [NA if isinstance(v, str) and v in NA_STRINGS else v for v in values]
    nums: list[Any] = []
    for v in values:
        if isinstance(v, bool):
            break
        if isinstance(v, (int, float)):
            nums.append(v)
        elif isinstance(v, str):
            if "_" in v:
                break
            try:
                nums.append(int(v) if INT_TEXT.match(v) else float(v))
            except ValueError:
                break
        else:
            break
    else:
        if all(isinstance(v, int) for v in nums) and nums:
            return "int", nums
        return "float", [float(v) for v in nums]
    if all(v is True or v is False or v in TRUE_STRINGS or v in FALSE_STRINGS for v in values):
        return "bool", [v is True or v in TRUE_STRINGS for v in values]
    return "object", values


def _header(row: list[Any]) -> list[Any]:
    """Column names from the header row: ``Unnamed: i`` for empty cells, ``name.1`` for repeats."""
    names: list[Any] = []
    seen: dict[Any, int] = {}
    for i, v in enumerate(row):
        name = f"Unnamed: {i}" if v == "" else v
        n = seen.get(name, 0)
        seen[name] = n + 1
        names.append(f"{name}.{n}" if n else name)
    return names


def sheet_frame(ws: Any) -> tuple[list[Any], list[tuple[str, list[Any]]]]:
    """The sheet as ``pandas.read_excel(book, sheet)`` sees it: column names and typed columns.

    The first row is the header; one-column sheets lose their blank rows (pandas' parser skips
    a line holding one empty string, not a wider row of them).
    """
    grid = [r for r in value_grid(ws) if not (len(r) == 1 and isinstance(r[0], str) and not r[0].strip())]
    if not grid:
        return [], []
    names, body = _header(grid[0]), grid[1:]
    return names, [_column([row[j] for row in body]) for j in range(len(names))]


def frames_equal(a: Any, b: Any, precision: int) -> bool:
    """``DataFrame.round(precision).equals``: names, row count, each column's type and values.

    Only int/float columns are rounded (an object column's 1.23456 is not), with numpy's
    rounding; an int column never equals a float one (``[1, 2]`` vs ``[1.0, 2.0000001]``);
    NaN equals NaN. Object columns compare with ``==`` (``1 == 1.0``).
    """
    import numpy as np

    (names1, cols1), (names2, cols2) = a, b
    if len(names1) != len(names2) or any(not _same(x, y) for x, y in zip(names1, names2, strict=True)):
        return False
    for (k1, v1), (k2, v2) in zip(cols1, cols2, strict=True):
        if k1 != k2 or len(v1) != len(v2):
            return False
        if k1 == "float":
            v1 = np.round(np.array(v1, dtype=float), precision).tolist()
            v2 = np.round(np.array(v2, dtype=float), precision).tolist()
        if any(not _same(x, y) for x, y in zip(v1, v2, strict=True)):
            return False
    return True


def _same(x: Any, y: Any) -> bool:
    return (_is_na(x) and _is_na(y)) or x == y


def csv_lines(book_path: str, sheet_name: str) -> list[str] | None:
    """The lines of ``<book without extension>-<sheet>.csv`` (LibreOffice's per-sheet CSV export), stripped,
    trailing blank lines dropped; None when there is no such file."""
    name = f"{os.path.splitext(book_path)[0]}-{sheet_name}.csv"
    for encoding in ("utf-8-sig", "latin-1"):
        try:
            with open(name, encoding=encoding) as f:
                lines = [line.strip() for line in f.read().splitlines()]
            break
        except UnicodeDecodeError:
            continue
        except OSError:
            return None
    while lines and not lines[-1]:
        lines.pop()
    return lines


# --- cell styles (and conditional formatting) ---------------------------------------------------

STYLE_PROPS = (
    "number_format", "font_name", "font_family", "font_color", "font_bold", "font_italic",
    "font_underline", "font_size", "fill_type", "bgcolor", "fgcolor", "hyperlink", "merge",
)  # fmt: skip


def _rgb(color: Any) -> Any:
    return getattr(color, "rgb", None) if color is not None else None


def cell_style(prop: str, cell: Any, dxf: Any = None) -> Any:
    """One style property of a cell (or of the differential style ``dxf`` a conditional format applies)."""
    has_value = cell.value is not None
    src = dxf if dxf is not None else cell
    font = getattr(src, "font", None)
    if prop == "number_format":
        if not (has_value and cell.data_type == "n"):
            return None
        return (
            getattr(getattr(dxf, "numFmt", None), "formatCode", None)
            if dxf is not None
            else cell.number_format
        )
    if prop.startswith("font_"):
        if not has_value or font is None:
            return None
        attr = {"font_name": "name", "font_family": "family", "font_bold": "bold", "font_italic": "italic",
                "font_underline": "underline", "font_size": "size"}.get(prop)  # fmt: skip
        return _rgb(font.color) if prop == "font_color" else getattr(font, attr)
    if prop == "fill_type":
        fill = getattr(src, "fill", None)
        return getattr(fill, "tagname", None)
    if prop in ("bgcolor", "fgcolor"):
        fill = getattr(src, "fill", None)
        if fill is None:
            return None
        return (
            _rgb(getattr(fill, "bgColor", None)) if dxf is not None else _rgb(getattr(fill, "fgColor", None))
        )
    if prop == "hyperlink":
        return (cell.hyperlink.target if cell.hyperlink else "") if has_value else None
    if prop == "merge":
        from openpyxl.cell.cell import MergedCell

        return isinstance(cell, MergedCell)
    raise ValueError(f"unsupported style property {prop!r}; expected one of {', '.join(STYLE_PROPS)}")


_CELL_IS = {"equal": "=", "notEqual": "<>", "greaterThan": ">", "lessThan": "<",
            "greaterThanOrEqual": ">=", "lessThanOrEqual": "<="}  # fmt: skip


def _rule_applies(rule: Any, read: Any, origin: tuple[int, int], at: tuple[int, int], value: Any) -> bool:
    """Does conditional-format ``rule`` paint the cell at ``at``? (``expression`` and ``cellIs`` rules)."""
    if rule.type == "expression":
        return truthy(evaluate(rule.formula[0], read, origin, at))
    if rule.type == "cellIs":
        args = [evaluate(f, read, origin, at) for f in rule.formula]
        if rule.operator in _CELL_IS:
            return compare(_CELL_IS[rule.operator], value, args[0])
        if rule.operator in ("between", "notBetween"):
            lo, hi = sorted(args[:2], key=lambda v: (isinstance(v, str), v))
            inside = compare(">=", value, lo) and compare("<=", value, hi)
            return inside if rule.operator == "between" else not inside
    raise FormulaError(f"conditional format type {rule.type!r} ({rule.operator}) is not supported")


def sheet_styles(ws: Any, values: Any, props: list[str]) -> dict[str, list[Any]]:
    """``{coordinate: [prop values]}`` for every cell, conditional formats applied on top.

    ``values`` is the data-only sheet (the cached values conditions are evaluated on).
    """
    out = {c.coordinate: [cell_style(p, c) for p in props] for col in ws.iter_cols() for c in col}

    def read(row: int, col: int) -> Any:
        return values.cell(row=row, column=col).value

    for cf in ws.conditional_formatting:
        for rule in cf.rules:
            for rng in cf.cells.ranges:
                origin = (rng.min_row, rng.min_col)
                blanks = 0
                for row, col in rng.cells:
                    value = read(row, col)
                    if value is None:
                        blanks += 1  # OSWorld stops a range after 50 empty cells in a row
                        if blanks > 50:
                            break
                        continue
                    blanks = 0
                    if _rule_applies(rule, read, origin, (row, col), value):
                        cell = ws.cell(row=row, column=col)
                        out[cell.coordinate] = [cell_style(p, cell, rule.dxf) for p in props]
    return out


# --- charts, pivot tables, rows/columns, filters, sparklines, panes ----------------------------


def _title_text(title: Any) -> str | None:
    try:
        return title.tx.rich.p[0].r[0].t
    except (AttributeError, IndexError, TypeError):
        return None


def _ref(data: Any) -> str:
    for kind in ("numRef", "strRef"):
        ref = getattr(data, kind, None)
        if ref is not None and getattr(ref, "f", None):
            return ref.f
    return ""


def sheet_charts(ws: Any, props: list[str]) -> dict[str, dict[str, Any]]:
    """``{series refs: {prop: value}}`` for the sheet's charts (props: title, legend, anchor, width,
    height, type, direction, xtitle, ytitle, ztitle)."""
    out: dict[str, dict[str, Any]] = {}
    for ch in getattr(ws, "_charts", []):
        key = ";".join(f"{_ref(s.val)},{_ref(s.cat)}" for s in ch.series)
        info: dict[str, Any] = {}
        for p in props:
            if p == "title":
                info[p] = _title_text(ch.title)
            elif p == "legend":
                info[p] = ch.legend.position if ch.legend is not None else None
            elif p == "anchor":
                a = ch.anchor
                info[p] = [getattr(a, "editAs", None), a._from.col, a.to.row, a.to.col, a.to.row]
            elif p in ("width", "height"):
                info[p] = getattr(ch, p)
            elif p == "type":
                info[p] = ch.tagname
            elif p == "direction":
                info[p] = getattr(ch, "barDir", None)
            elif p in ("xtitle", "ytitle", "ztitle"):
                axis = getattr(ch, f"{p[0]}_axis", None)
                info[p] = _title_text(getattr(axis, "title", None))
            else:
                raise ValueError(f"unsupported chart property {p!r}")
        out[key] = info
    return out


def sheet_pivots(ws: Any, props: list[str]) -> dict[str, dict[str, Any]]:
    """``{source: {prop: value}}`` for the sheet's pivot tables, fields indexed from the first used one
    (so a pivot over B:D equals one over A:C with the same layout)."""
    from openpyxl.utils import coordinate_to_tuple

    out: dict[str, dict[str, Any]] = {}
    for pvt in getattr(ws, "_pivots", []):
        raw = [[(item.h, item.x) for item in f.items if item.x is not None] for f in pvt.pivotFields]
        trimmed = list(itertools.dropwhile(lambda r: not r, raw))
        left = len(raw) - len(trimmed)
        selection = list(itertools.dropwhile(lambda r: not r, reversed(trimmed)))[::-1]
        right = len(trimmed) - len(selection)
        src = pvt.cache.cacheSource
        a, b = src.worksheetSource.ref.split(":")
        (r1, c1), (r2, c2) = coordinate_to_tuple(a), coordinate_to_tuple(b)
        key = f"{src.type};{(r1, c1 + left)}:{(r2, c2 - right)};{src.worksheetSource.sheet}"
        info: dict[str, Any] = {}
        simple = {"name": "name", "show_total": "visualTotals", "show_empty_row": "showEmptyRow",
                  "show_empty_col": "showEmptyCol", "show_headers": "showHeaders",
                  "location": "location"}  # fmt: skip
        for p, attr in simple.items():
            if p in props:
                info[p] = getattr(pvt, attr)
        if "filter" in props or "selection" in props:
            info["selection"] = selection if "ordered" in props else [set(r) for r in selection]
        if "filter" in props:
            info["filter_fields"] = {f.fld for f in pvt.pageFields}
        if "col_fields" in props:
            info["col_fields"] = [f.x - left for f in pvt.colFields]
        if "row_fields" in props:
            info["row_fields"] = [f.x - left for f in pvt.rowFields]
        if "data_fields" in props:
            named = "data_fields_name" in props
            info["data_fields"] = [
                f"{f.fld - left};{f.name if named else ''};{f.subtotal};{f.showDataAs}"
                for f in pvt.dataFields
            ]
        out[key] = info
    return out


def rows_or_cols(ws: Any, obj: str, props: list[str]) -> dict[Any, dict[str, Any]]:
    """``{row number or column letter: {prop: value}}`` (rows: hidden, collapsed, height; columns also
    width, auto_size, min, max)."""
    dims = ws.row_dimensions if obj == "row" else ws.column_dimensions
    return {key: {p: getattr(d, p) for p in props} for key, d in dims.items()}


def sheet_filters(ws: Any) -> dict[str, Any]:
    """The auto-filter: range, per-column filters and the sort state."""
    af = ws.auto_filter
    columns = []
    for fc in af.filterColumn:
        col: dict[str, Any] = {
            "col_id": fc.colId,
            "hidden_button": fc.hiddenButton,
            "show_button": fc.showButton,
        }
        if fc.filters is not None:
            col["filters_blank"] = fc.filters.blank
            col["filters"] = set(fc.filters.filter)
        if fc.customFilters is not None:
            col["custom_filters_op"] = fc.customFilters._and
            col["custom_filters"] = {(f.operator, f.val) for f in fc.customFilters.customFilter}
        columns.append(col)
    out: dict[str, Any] = {"ref": af.ref, "filter_column": sorted(columns, key=lambda d: d["col_id"])}
    if af.sortState is not None:
        s = af.sortState
        out["sort_state"] = {
            "sort": s.columnSort, "case": s.caseSensitive, "method": s.sortMethod, "ref": s.ref,
            "condition": [{"descending": c.descending, "key": c.sortBy, "ref": c.ref,
                           "custom_list": c.customList, "dxf_id": c.dxfId, "icon": c.iconSet,
                           "iconid": c.iconId} for c in s.sortCondition],
        }  # fmt: skip
    return out


def sheet_sparklines(path: str, sheet_name: str) -> dict[str, str]:
    """``{target cell: data range}`` of the sheet's sparklines (Excel 2010 extension XML)."""
    try:
        with zipfile.ZipFile(path) as z:
            part = _sheet_part(z, sheet_name)
            root = ET.fromstring(z.read(part)) if part else None
    except (OSError, KeyError, zipfile.BadZipFile, ET.ParseError):
        return {}
    if root is None:
        return {}
    out = {}
    for sp in root.iter(f"{{{NS['x14']}}}sparkline"):
        f, sqref = sp.find("xm:f", NS), sp.find("xm:sqref", NS)
        if f is not None and sqref is not None:
            out[sqref.text] = f.text
    return out


def freeze_key(ws: Any) -> tuple[Any, ...]:
    """Where the panes are frozen: (``frozen``, columns, rows), independent of scrolling."""
    pane = ws.sheet_view.pane
    if pane is None:
        return ("none",)
    xs, ys = int(pane.xSplit or 0), int(pane.ySplit or 0)
    if (pane.state or "").lower() in ("frozen", "frozensplit"):
        return ("frozen", xs, ys)
    return ("other", xs, ys, pane.topLeftCell)


def coordinate(row: int, col: int) -> str:
    """``A1`` from (row, column)."""
    from openpyxl.utils import get_column_letter

    return f"{get_column_letter(col)}{row}"


def range_cells(ranges: list[str] | str) -> list[str]:
    """Coordinates covered by a list of A1 ranges, in order."""
    from openpyxl.worksheet.cell_range import CellRange

    out = []
    for rng in ranges if isinstance(ranges, list) else [ranges]:
        for part in str(rng).split():
            out += [coordinate(r, c) for r, c in CellRange(part).cells]
    return out
