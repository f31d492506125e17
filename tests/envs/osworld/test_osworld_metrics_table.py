"""compare_table (each rule type), compare_csv and the formula evaluator, on workbooks the tests write."""

from __future__ import annotations

import datetime as dt

import openpyxl
import pytest
from openpyxl.chart import BarChart, LineChart, Reference
from openpyxl.formatting.rule import CellIsRule, FormulaRule
from openpyxl.styles import Font, PatternFill
from openpyxl.worksheet.datavalidation import DataValidation

from rz_agents.envs.osworld.metrics import METRICS, option_problem
from rz_agents.envs.osworld.metrics.excel_formula import FormulaError, evaluate

compare_table, compare_csv = METRICS["compare_table"], METRICS["compare_csv"]


def book(path, rows, title="Sheet1", edit=None):
    """Write a one-sheet workbook with ``rows`` and optional extra edits; returns its path as str."""
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = title
    for row in rows:
        ws.append(row)
    if edit:
        edit(wb, ws)
    wb.save(path)
    return str(path)


ROWS = [("Name", "Score"), ("ann", 1.00001), ("bob", 2)]


def test_sheet_data_rounds_numbers_and_ignores_trailing_blanks(tmp_path):
    gold = book(tmp_path / "gold.xlsx", ROWS)
    same = book(tmp_path / "same.xlsx", [("Name", "Score"), ("ann", 1.00002), ("bob", 2.0), (None, None)])
    off = book(tmp_path / "off.xlsx", [("Name", "Score"), ("ann", 1.001), ("bob", 2)])
    rule = {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}
    assert compare_table(same, gold, **rule) == 1.0
    assert compare_table(off, gold, **rule) == 0.0  # beyond 4 decimals
    assert compare_table(off, gold, rules=[{**rule["rules"][0], "precision": 2}]) == 1.0
    by_name = {"rules": [{"type": "sheet_data", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1"}]}
    assert compare_table(same, gold, **by_name) == 1.0
    missing = {"rules": [{"type": "sheet_data", "sheet_idx0": "RNNope", "sheet_idx1": "ENSheet1"}]}
    assert compare_table(same, gold, **missing) == 0.0
    (tmp_path / "broken.xlsx").write_text("not a zip")
    assert compare_table(str(tmp_path / "broken.xlsx"), gold, **rule) == 0.0
    assert compare_table(None, gold, **rule) == 0.0


def test_sheet_data_reads_numbers_stored_as_text_as_numbers(tmp_path):
    # pandas.read_excel converts a column whose text is numeric: "2" is 2, so these compare equal.
    gold = book(tmp_path / "gold.xlsx", ROWS)
    text = book(tmp_path / "text.xlsx", [("Name", "Score"), ("ann", "1.00001"), ("bob", "2")])
    rule = {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}
    assert compare_table(text, gold, **rule) == 1.0
    words = book(tmp_path / "words.xlsx", [("Name", "Score"), ("ann", "1.00001"), ("bob", "two")])
    assert compare_table(words, gold, **rule) == 0.0  # one non-number keeps the column text


def test_sheet_data_int_column_never_equals_a_float_column(tmp_path):
    # DataFrame.equals compares dtypes: [1, 2] (int64) vs [1.00001, 2] rounded to [1.0, 2.0] (float64).
    ints = book(tmp_path / "ints.xlsx", [("Name", "Score"), ("ann", 1), ("bob", 2)])
    gold = book(tmp_path / "gold.xlsx", ROWS)
    rule = {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}
    assert compare_table(ints, gold, **rule) == 0.0
    assert compare_table(ints, ints, **rule) == 1.0


def test_sheet_data_missing_text_and_blank_rows_as_pandas_reads_them(tmp_path):
    rule = {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}
    na = book(tmp_path / "na.xlsx", [("A", "B"), ("x", "N/A"), ("y", 3)])
    blank = book(tmp_path / "blank.xlsx", [("A", "B"), ("x", None), ("y", 3)])
    assert compare_table(na, blank, **rule) == 1.0  # "N/A" is a missing value, like an empty cell
    one_col = book(tmp_path / "one.xlsx", [("A",), (None,), ("x",)])
    one_col_packed = book(tmp_path / "packed.xlsx", [("A",), ("x",)])
    assert compare_table(one_col, one_col_packed, **rule) == 1.0  # pandas skips a blank one-cell line
    two_col = book(tmp_path / "two.xlsx", [("A", "B"), (None, None), ("x", 1)])
    two_col_packed = book(tmp_path / "two_packed.xlsx", [("A", "B"), ("x", 1)])
    assert compare_table(two_col, two_col_packed, **rule) == 0.0  # a wider blank row is a NaN row
    unrounded = book(tmp_path / "obj.xlsx", [("A",), ("x",), (1.234561,)])
    rounded = book(tmp_path / "obj2.xlsx", [("A",), ("x",), (1.23456,)])
    assert compare_table(unrounded, rounded, **rule) == 0.0  # object columns are not rounded


def test_sheet_name_and_sheet_print_read_the_csv_exports(tmp_path):
    gold = book(tmp_path / "gold.xlsx", ROWS, edit=lambda wb, ws: wb.create_sheet("Notes"))
    res = book(tmp_path / "res.xlsx", ROWS)
    assert compare_table(res, gold, rules=[{"type": "sheet_name"}]) == 0.0
    (tmp_path / "res-Sheet1.csv").write_text("Name,Score\nann,0000001\n\n")
    (tmp_path / "gold-Sheet1.csv").write_text("name,score\nann,0000001\n")
    rule = {"type": "sheet_print", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1"}
    assert compare_table(res, gold, rules=[rule]) == 0.0  # case differs
    assert compare_table(res, gold, rules=[{**rule, "ignore_case": True}]) == 1.0
    (tmp_path / "res-Sheet1.csv").unlink()
    assert compare_table(res, gold, rules=[{**rule, "ignore_case": True}]) == 0.0  # no export: fails


def test_check_cell_reads_stored_values_and_styles(tmp_path):
    def style(wb, ws):
        ws["A1"].fill = PatternFill("solid", fgColor="FF0000FF")
        ws["A1"].font = Font(color="FFFFFFFF", bold=True)

    res = book(tmp_path / "res.xlsx", [("Demographic Profile", 191.66671)], "Sheet2", style)
    props = {
        "bgcolor": {"method": "eq", "ref": "FF0000FF"},
        "font_color": {"method": "eq", "ref": "FFFFFFFF"},
        "font_bold": {"method": "eq", "ref": True},
        "value": {"method": "eq", "ref": "Demographic Profile"},
    }
    assert (
        compare_table(
            res, rules=[{"type": "check_cell", "sheet_idx": "RNSheet2", "coordinate": "A1", "props": props}]
        )
        == 1.0
    )
    props["font_bold"]["ref"] = False
    assert (
        compare_table(
            res, rules=[{"type": "check_cell", "sheet_idx": "RNSheet2", "coordinate": "A1", "props": props}]
        )
        == 0.0
    )
    near = {"value": {"method": "approx:0.001", "ref": 191.6667}}
    assert (
        compare_table(res, rules=[{"type": "check_cell", "sheet_idx": 0, "coordinate": "B1", "props": near}])
        == 1.0
    )
    far = {"value": {"method": "approx:0.001", "ref": 191.6}}
    assert (
        compare_table(res, rules=[{"type": "check_cell", "sheet_idx": 0, "coordinate": "B1", "props": far}])
        == 0.0
    )


DATA = [("Rate",), (3,), (9,), (5,)]
GREEN = Font(color="FF00FF00")


def test_style_applies_conditional_formats_so_either_way_of_painting_matches(tmp_path):
    def conditional(wb, ws):
        ws.conditional_formatting.add("A2:A4", FormulaRule(formula=["A2=MAX($A$2:$A$4)"], font=GREEN))

    def direct_max(wb, ws):
        ws["A3"].font = GREEN

    def direct_wrong(wb, ws):
        ws["A2"].font = GREEN

    gold = book(tmp_path / "gold.xlsx", DATA, edit=conditional)
    rule = {"rules": [{"type": "style", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": ["font_color"]}]}
    assert compare_table(book(tmp_path / "a.xlsx", DATA, edit=direct_max), gold, **rule) == 1.0
    assert compare_table(book(tmp_path / "b.xlsx", DATA, edit=direct_wrong), gold, **rule) == 0.0
    assert compare_table(book(tmp_path / "c.xlsx", DATA), gold, **rule) == 0.0

    def cell_is(wb, ws):
        ws.conditional_formatting.add("A2:A4", CellIsRule(operator="greaterThan", formula=["8"], font=GREEN))

    assert (
        compare_table(
            book(tmp_path / "d.xlsx", DATA, edit=direct_max),
            book(tmp_path / "e.xlsx", DATA, edit=cell_is),
            **rule,
        )
        == 1.0
    )


def test_weekend_condition_with_weekday_over_dates(tmp_path):
    days = [("Day",), *[(dt.datetime(2024, 1, d),) for d in range(5, 9)]]  # Fri..Mon
    red = PatternFill(bgColor="FFFF0000")

    def conditional(wb, ws):
        ws.conditional_formatting.add("A2:A5", FormulaRule(formula=["WEEKDAY(A2,2)>5"], fill=red))

    def direct(wb, ws):
        for c in ("A3", "A4"):  # Saturday, Sunday
            ws[c].fill = PatternFill("solid", fgColor="FFFF0000")

    rule = {"rules": [{"type": "style", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": ["bgcolor"]}]}
    assert (
        compare_table(
            book(tmp_path / "r.xlsx", days, edit=direct),
            book(tmp_path / "g.xlsx", days, edit=conditional),
            **rule,
        )
        == 1.0
    )


def test_chart_freeze_zoom_rows_and_validation(tmp_path):
    def chart(kind, title):
        def edit(wb, ws):
            ch = kind()
            ch.title = title
            ch.add_data(Reference(ws, min_col=1, min_row=1, max_row=4), titles_from_data=True)
            ws.add_chart(ch, "C2")

        return edit

    gold = book(tmp_path / "g.xlsx", DATA, edit=chart(BarChart, "Rates"))
    rule = {"type": "chart", "sheet_idx0": 0, "sheet_idx1": "EI0", "chart_props": ["type", "title"]}
    assert (
        compare_table(book(tmp_path / "a.xlsx", DATA, edit=chart(BarChart, "Rates")), gold, rules=[rule])
        == 1.0
    )
    assert (
        compare_table(book(tmp_path / "b.xlsx", DATA, edit=chart(LineChart, "Rates")), gold, rules=[rule])
        == 0.0
    )
    assert (
        compare_table(book(tmp_path / "c.xlsx", DATA, edit=chart(BarChart, "Other")), gold, rules=[rule])
        == 0.0
    )

    def frozen(wb, ws):
        ws.freeze_panes = "B2"
        ws.sheet_view.zoomScale = 150
        ws.row_dimensions[3].hidden = True
        dv = DataValidation(type="list", formula1='"Pass,Fail,Held"')
        dv.add("D2:D29")
        ws.add_data_validation(dv)

    res, plain = book(tmp_path / "f.xlsx", DATA, edit=frozen), book(tmp_path / "p.xlsx", DATA)
    freeze = {"type": "freeze", "sheet_idx0": 0, "sheet_idx1": "EI0"}
    assert compare_table(res, book(tmp_path / "f2.xlsx", DATA, edit=frozen), rules=[freeze]) == 1.0
    assert compare_table(res, plain, rules=[freeze]) == 0.0
    assert compare_table(res, rules=[{"type": "zoom", "sheet_idx": 0, "method": "lt", "ref": 260}]) == 1.0
    assert compare_table(res, rules=[{"type": "zoom", "sheet_idx": 0, "method": "lt", "ref": 120}]) == 0.0
    rows = {"type": "row_props", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": ["hidden"]}
    assert compare_table(res, plain, rules=[rows]) == 0.0
    dv_rule = {
        "type": "data_validation",
        "sheet_idx": 0,
        "dv_props": [
            {
                "ranges": {"method": "spreadsheet_range", "ref": ["D2:D29", "D2:D1048576"]},
                "type": {"method": "eq", "ref": "list"},
                "formula1": {"method": "str_set_eq", "ref": ["Pass", "Fail", "Held"]},
            }
        ],
    }
    assert compare_table(res, rules=[dv_rule]) == 1.0
    dv_rule["dv_props"][0]["formula1"]["ref"] = ["Pass", "Fail"]
    assert compare_table(res, rules=[dv_rule]) == 0.0
    assert compare_table(plain, rules=[dv_rule]) == 0.0  # no validation at all


def _pivot(filter_field: int):
    from openpyxl.pivot.cache import CacheDefinition, CacheField, CacheSource, SharedItems, WorksheetSource
    from openpyxl.pivot.table import (
        DataField,
        FieldItem,
        Location,
        PageField,
        PivotField,
        RowColField,
        TableDefinition,
    )

    def edit(wb, ws):
        items = [FieldItem(x=0), FieldItem(x=1), FieldItem(t="default")]
        fields = [PivotField(), PivotField(), PivotField(dataField=True)]
        fields[0] = PivotField(axis="axisRow", items=items)
        fields[1] = PivotField(axis="axisPage", items=list(items))
        pvt = TableDefinition(
            name="P1", cacheId=1, dataCaption="Values",
            location=Location(ref="A1:B3", firstHeaderRow=1, firstDataRow=1, firstDataCol=1),
            pivotFields=fields, rowFields=[RowColField(x=0)], pageFields=[PageField(fld=filter_field)],
            dataFields=[DataField(name="Sum", fld=2, subtotal="sum")],
        )  # fmt: skip
        pvt.cache = CacheDefinition(
            cacheSource=CacheSource(
                type="worksheet", worksheetSource=WorksheetSource(ref="A1:C4", sheet="Sheet1")
            ),
            cacheFields=[CacheField(name=n, sharedItems=SharedItems()) for n in ("Region", "Item", "Sales")],
        )
        wb.create_sheet("Sheet2")._pivots.append(pvt)

    return edit


def test_pivot_tables_compare_fields_and_source(tmp_path):
    rows = [("Region", "Item", "Sales"), ("N", "a", 1), ("S", "b", 2), ("N", "b", 3)]
    rule = {"type": "pivot_table", "sheet_idx0": "RNSheet2", "sheet_idx1": "ENSheet2",
            "pivot_props": ["col_fields", "filter", "row_fields", "data_fields"]}  # fmt: skip
    gold = book(tmp_path / "g.xlsx", rows, edit=_pivot(1))
    assert compare_table(book(tmp_path / "a.xlsx", rows, edit=_pivot(1)), gold, rules=[rule]) == 1.0
    assert compare_table(book(tmp_path / "b.xlsx", rows, edit=_pivot(0)), gold, rules=[rule]) == 0.0
    assert compare_table(book(tmp_path / "c.xlsx", rows), gold, rules=[rule]) == 0.0  # no pivot at all


def test_sheet_fuzzy_normalises_then_matches(tmp_path):
    res = book(tmp_path / "r.xlsx", [("12 Main Rd",), ("(+1) 555",)])
    gold = book(tmp_path / "g.xlsx", [("12 Main Road",), ("+1 555",)])
    rules = [
        {"range": ["A1"], "type": "exact_match", "normalization": [["Rd", "Road"]]},
        {"range": ["A2"], "type": "exact_match", "ignore_chars": "()", "trim_leadings": " "},
    ]
    rule = {"type": "sheet_fuzzy", "sheet_idx0": "RI0", "sheet_idx1": "EI0", "rules": rules}
    assert compare_table(res, gold, rules=[rule]) == 1.0
    rules[0]["normalization"] = []
    assert compare_table(res, gold, rules=[rule]) == 0.0
    fuzzy = {**rule, "rules": [{"range": ["A1"], "type": "fuzzy_match", "threshold": 85}]}
    assert compare_table(res, gold, rules=[fuzzy]) == 1.0


def test_unsupported_rules_are_reported_for_runnability():
    assert option_problem("compare_table", {"rules": [{"type": "sheet_data"}]}) is None
    assert "sheet_magic" in option_problem("compare_table", {"rules": [{"type": "sheet_magic"}]})
    assert "colour" in option_problem("compare_table", {"rules": [{"type": "style", "props": ["colour"]}]})


def test_compare_csv_strict_and_alternatives(tmp_path):
    res, a, b = tmp_path / "r.csv", tmp_path / "a.csv", tmp_path / "b.csv"
    res.write_text("x,y \n1,2\n")
    a.write_text("\ufeffx,y\n1,2\n")
    b.write_text("X,Y \n1,2\n")
    assert compare_csv(str(res), str(a)) == 0.0  # strict: the trailing space counts
    assert compare_csv(str(res), str(a), strict=False) == 1.0  # (the BOM never counts)
    assert compare_csv(str(res), [str(a), str(b)], ignore_case=True) == 1.0
    assert compare_csv(None, str(a)) == 0.0


def test_formula_evaluator_follows_excel():
    cells = {(1, 1): 3.0, (2, 1): 7.0, (3, 1): None, (1, 2): "Abc"}

    def read(r, c):
        return cells.get((r, c))

    assert evaluate("=A1=MAX($A$1:$A$3)", read, (1, 1), (2, 1)) is True  # A1 shifts to A2
    assert evaluate("-2^2", read) == 4.0 and evaluate("2+3*4", read) == 14.0
    assert evaluate('B1="abc"', read) is True  # text compares case-insensitively
    assert evaluate("A3=0", read) is True and evaluate('A3=""', read) is True  # an empty cell
    assert evaluate('"x"&A1&TRUE', read) == "x3TRUE"
    assert evaluate("WEEKDAY(45297,2)", read) == 6.0  # 2024-01-06, a Saturday
    assert (
        evaluate("ROUND(2.5,0)+MOD(-7,3)", read) == 5.0
    )  # half away from zero; MOD takes the divisor's sign
    with pytest.raises(FormulaError, match="not supported"):
        evaluate("VLOOKUP(A1,B1:B2,1)", read)
    with pytest.raises(FormulaError, match="DIV/0"):
        evaluate("A1/0", read)
