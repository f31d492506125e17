"""General file metrics (JSON, CSV, lists, SQLite, accessibility tree), the rule language and PDFs."""

from __future__ import annotations

import json
import sqlite3

import pytest

from rz_agents.envs.osworld.metrics import METRICS
from rz_agents.envs.osworld.metrics.rules import RuleError, match_value_to_rule


def write(path, text):
    path.write_text(text)
    return str(path)


def make_pdf(path, pages: list[str]) -> str:
    """A minimal valid PDF with one line of Helvetica text per page."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages)))
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>")
    objects.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, text in enumerate(pages):
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Contents {5 + 2 * i} 0 R /Resources << "
            "/Font << /F1 3 0 R >> >> >>"
        )
        stream = f"BT /F1 12 Tf 20 100 Td ({text}) Tj ET"
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    out, offsets = b"%PDF-1.4\n", []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{n} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{o:010d} 00000 n \n" for o in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    path.write_bytes(out)
    return str(path)


def test_rule_methods():
    assert match_value_to_rule(3, {"method": "lt", "ref": 4}) and not match_value_to_rule(
        None, {"method": "lt", "ref": 4}
    )
    assert match_value_to_rule("Anonym\nXYZ Lab", {"method": "re.S", "ref": "Anonym.+XYZ Lab"})
    assert not match_value_to_rule("Anonym\nXYZ Lab", {"method": "re", "ref": "Anonym.+XYZ Lab"})
    assert match_value_to_rule("191.66671", {"method": "approx:0.001", "ref": 191.6667})
    assert match_value_to_rule(2, {"method": "range.te", "ref": [1, 2]}) and not match_value_to_rule(
        1, {"method": "range.te", "ref": [1, 2]}
    )
    assert match_value_to_rule('"b,a"', {"method": "str_set_eq", "ref": ["a", "b"]})
    assert not match_value_to_rule('"b,a"', {"method": "str_list_eq", "ref": ["a", "b"]})
    with pytest.raises(RuleError):
        match_value_to_rule(1, {"method": "roughly", "ref": 1})


def test_json_settings_keybindings_and_key_paths(tmp_path):
    settings = write(tmp_path / "settings.json", json.dumps({"editor.wordWrapColumn": 50, "x": 1}))
    assert METRICS["check_json_settings"](settings, {"expected": {"editor.wordWrapColumn": 50}}) == 1.0
    assert METRICS["check_json_settings"](settings, {"expected": {"editor.wordWrapColumn": 80}}) == 0.0
    assert METRICS["check_json_settings"](None, {"expected": {}}) == 0.0
    binding = {"key": "ctrl+j", "command": "focus"}
    keys = write(tmp_path / "keybindings.json", "// Place your key bindings here\n" + json.dumps([binding]))
    assert METRICS["check_json_keybindings"](keys, {"expected": binding}) == 1.0
    assert METRICS["check_json_keybindings"](keys, {"expected": {**binding, "key": "ctrl+k"}}) == 0.0
    doc = write(tmp_path / "d.json", json.dumps({"a": {"b": [10, 20]}}))
    rules = {
        "expect": [{"key": ["a", "b", 1], "method": "eq", "ref": 20}],
        "unexpect": [{"key": ["a", "c"], "method": "eq", "ref": 1}],
    }
    assert METRICS["check_json"](doc, rules) == 1.0
    rules["expect"][0]["ref"] = 10
    assert METRICS["check_json"](doc, rules) == 0.0


def test_check_list_and_check_csv(tmp_path):
    listing = write(tmp_path / "ls", "COMPANY.msf\nCOMPANY\nA Test E-mail.eml\n")
    assert METRICS["check_list"](listing, {"expect": [r"\bCOMPANY\.msf\b", r"A Test E-mail.*\.eml"]}) == 1.0
    assert METRICS["check_list"](listing, {"expect": [r"UNIVERSITY"]}) == 0.0
    assert METRICS["check_list"](listing, {"unexpect": [r"\.eml$"]}) == 0.0
    accounts = write(tmp_path / "a.csv", "url,user,password\nimap://x,me@x,p$1\nsmtp://x,me@x,p$1\n")
    want = {
        "expect": [
            {"url": "imap://x", "user": "me@x", "password": "p$1"},
            {"url": "smtp://x", "user": "me@x"},
        ]
    }
    assert METRICS["check_csv"](accounts, want) == 1.0
    assert METRICS["check_csv"](accounts, {"unexpect": [{"url": "imap://x"}]}) == 0.0
    assert METRICS["check_csv"](None, want) == 0.0


def test_run_sqlite3_returns_the_first_value(tmp_path):
    db = tmp_path / "places.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE t (v INTEGER)")
        con.execute("INSERT INTO t VALUES (1)")
    assert METRICS["run_sqlite3"](str(db), {"sql": "SELECT COUNT(*) FROM t WHERE v = 1"}) == 1.0
    assert METRICS["run_sqlite3"](str(db), {"sql": "SELECT v FROM t WHERE v = 2"}) == 0.0
    assert METRICS["run_sqlite3"](str(db), {"sql": "SELECT nonsense"}) == 0.0


TREE = """<desktop-frame xmlns:attr="https://accessibility.ubuntu.example.org/ns/attributes">
<application name="Thunderbird"><page-tab-list attr:id="tabmail-tabs">
<page-tab name="About Profiles">About Profiles</page-tab><page-tab name="Inbox">Inbox</page-tab>
</page-tab-list></application></desktop-frame>"""


def test_check_accessibility_tree_with_css_and_xpath():
    css = [
        {
            "selectors": [
                'application[name=Thunderbird] '
                'page-tab-list[attr|id="tabmail-tabs"]>page-tab[name="About Profiles"]'
            ]
        }
    ]
    assert METRICS["check_accessibility_tree"](TREE, css) == 1.0
    assert METRICS["check_accessibility_tree"](TREE, [{"selectors": ['page-tab[name="Settings"]']}]) == 0.0
    assert METRICS["check_accessibility_tree"](TREE, [{"xpath": "//page-tab", "text": "Inbox"}]) == 1.0
    fuzzy = METRICS["check_accessibility_tree"](
        TREE, [{"xpath": "//page-tab", "text": "Inbix", "exact": False}]
    )
    assert 0.7 < fuzzy < 1.0


def test_pdf_pages_and_text_similarity(tmp_path):
    one = make_pdf(tmp_path / "one.pdf", ["Quarterly report"])
    two = make_pdf(tmp_path / "two.pdf", ["Quarterly report", "Appendix"])
    assert METRICS["check_pdf_pages"](one, {"relation": "eq", "ref_value": 1}) == 1.0
    assert METRICS["check_pdf_pages"](two, {"relation": "eq", "ref_value": 1}) == 0.0
    assert (
        METRICS["check_pdf_pages"](write(tmp_path / "x.pdf", "junk"), {"relation": "eq", "ref_value": 1})
        == 0.0
    )
    assert METRICS["compare_pdfs"](one, make_pdf(tmp_path / "same.pdf", ["Quarterly report"])) == 1.0
    assert 0.5 < METRICS["compare_pdfs"](one, make_pdf(tmp_path / "near.pdf", ["Quarterly reports"])) < 1.0
    assert METRICS["compare_pdfs"](None, one) == 0.0
