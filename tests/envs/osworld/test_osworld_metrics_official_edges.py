"""The edge cases where OSWorld's metrics (commit 8942695) decide differently from a "fixed" reading.

Each case is built from a branch of the official function; the score is the one that function
gives (arguably wrong ones included: a leaderboard-comparable score reproduces them).
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from pptx import Presentation
from pptx.dml.color import RGBColor
from pptx.enum.text import PP_ALIGN
from pptx.util import Inches

from rz_agents.envs.osworld.metrics import METRICS
from rz_agents.envs.osworld.metrics.chrome import compare_urls

M = METRICS


# --- URLs (compare_urls) ---------------------------------------------------------------------


def test_compare_urls_keeps_a_trailing_slash_on_a_longer_path():
    assert compare_urls("https://a.org/about/", "https://a.org/about") is False
    assert compare_urls("https://a.org/", "https://a.org") is True


def test_compare_urls_drops_www_anywhere_in_the_host_and_defaults_the_scheme():
    assert compare_urls("https://awww.x.org", "https://ax.org") is True  # str.replace, not a prefix
    assert compare_urls("HTTPS://WWW.A.ORG/P", "https://a.org/P") is True
    assert compare_urls("https://a.org/P", "https://a.org/p") is False  # paths keep their case
    assert compare_urls(None, None) is True and compare_urls(None, "x") is False


def test_is_expected_active_tab_takes_a_url_string_and_rejects_other_rule_types():
    rule = {"type": "url", "url": "https://a.org/x"}
    assert M["is_expected_active_tab"]("https://www.a.org/x", rule) == 1.0
    assert M["is_expected_active_tab"]({"url": "https://a.org/x/"}, rule) == 0.0
    assert M["is_expected_active_tab"]({"url": "https://a.org/x?q=1"}, rule) == 0.0
    assert M["is_expected_active_tab"]({"url": "https://a.org/x"}, {"type": "title", "url": "x"}) == 0.0
    assert M["is_expected_active_tab"](None, rule) == 0.0


def test_is_expected_tabs_needs_equal_counts_but_not_a_multiset():
    rule = {"type": "url", "urls": ["https://a.org", "https://a.org"]}
    assert M["is_expected_tabs"]([{"url": "https://a.org/"}, {"url": "https://b.org"}], rule) == 1.0
    assert M["is_expected_tabs"]([{"url": "https://a.org/"}], rule) == 0.0


# --- cookies, shortcuts, flags ----------------------------------------------------------------


def test_is_cookie_deleted_matches_whole_hosts_not_subdomains():
    rule = {"type": "domains", "domains": [".amazon.com"]}
    assert M["is_cookie_deleted"]([(1, ".amazon.com")], rule) == 0.0
    # subdomain and bare-host cookies remain, yet OSWorld scores the task as done
    assert (
        M["is_cookie_deleted"]([(1, ".smile.amazon.com"), (2, "www.amazon.com"), (3, "amazon.com")], rule)
        == 1.0
    )
    with pytest.raises(TypeError):
        M["is_cookie_deleted"](None, rule)  # no Cookies database: the evaluator scores the error 0


def test_is_shortcut_on_desktop_is_a_substring_test_that_needs_the_newline():
    rule = {"type": "name", "name": "2048"}
    assert M["is_shortcut_on_desktop"]({"a.desktop": "[Desktop Entry]\nName=2048\nExec=x\n"}, rule) == 1.0
    assert M["is_shortcut_on_desktop"]({"a.desktop": "[Desktop Entry]\nExec=x\nName=2048"}, rule) == 0.0
    assert M["is_shortcut_on_desktop"]({"a.desktop": "GenericName=2048\n"}, rule) == 1.0
    assert M["is_shortcut_on_desktop"]({}, rule) == 0.0
    with pytest.raises(ValueError):
        M["is_shortcut_on_desktop"]({"a": "Exec=x\n"}, {"type": "exec", "exec": "x"})


def test_check_enabled_experiments_compares_names_in_order():
    rule = {"type": "names", "names": ["a", "b"]}
    assert M["check_enabled_experiments"](["a@1", "b"], rule) == 1.0
    assert M["check_enabled_experiments"](["b", "a@1"], rule) == 0.0
    assert M["check_enabled_experiments"](["a", "b", "c"], rule) == 0.0


# --- files and images ---------------------------------------------------------------------------


def test_check_moved_jpgs_counts_subdirectories():
    rule = {"expected": ["a.jpg"]}
    tree = {"children": [{"name": "a.jpg", "type": "file"}, {"name": "sub", "type": "directory"}]}
    assert M["check_moved_jpgs"](tree, rule) == 0.0
    assert M["check_moved_jpgs"]({"children": [{"name": "a.jpg", "type": "file"}]}, rule) == 1.0
    assert M["check_moved_jpgs"]({"children": [{"name": "a.jpg"}]}, {"expected": ["a.jpg", "a.jpg"]}) == 0.0


def _png(path, array):
    Image.fromarray(np.asarray(array, dtype=np.uint8)).save(path)
    return str(path)


def test_check_triangle_position_with_two_colours_picks_the_background(tmp_path):
    img = np.full((60, 60, 3), 255)
    img[0:12, 0:12] = (0, 0, 255)  # an off-centre square; the background's centroid is still central
    assert M["check_triangle_position"](_png(tmp_path / "a.png", img)) == 1.0


def test_check_triangle_position_keeps_the_alpha_channel(tmp_path):
    img = np.zeros((60, 60, 4))
    img[..., 3] = 255
    img[0:10, 0:10] = (0, 0, 0, 128)  # off-centre; same RGB as the background, told apart by alpha only
    img[59, 59] = (9, 9, 9, 255)
    assert M["check_triangle_position"](_png(tmp_path / "a.png", img)) == 0.0
    grey = tmp_path / "g.png"
    Image.new("L", (10, 10)).save(grey)
    with pytest.raises(ValueError):
        M["check_triangle_position"](str(grey))


# --- compare_pptx_files ---------------------------------------------------------------------------


def _deck(path, extra_picture=None, extra_text=False, colour=None, align=None, bold=None):
    prs = Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[6])
    box = slide.shapes.add_textbox(Inches(1), Inches(1), Inches(4), Inches(1))
    para = box.text_frame.paragraphs[0]
    para.alignment = align
    run = para.add_run()
    run.text = "Hello"
    run.font.bold = bold
    if colour:
        run.font.color.rgb = RGBColor(*colour)
    if extra_text:
        slide.shapes.add_textbox(Inches(1), Inches(3), Inches(4), Inches(1)).text_frame.text = "More"
    if extra_picture:
        slide.shapes.add_picture(extra_picture, Inches(5), Inches(3))
    prs.save(path)
    return str(path)


def test_compare_pptx_files_ignores_an_extra_picture_but_not_an_extra_text_box(tmp_path):
    pic = _png(tmp_path / "p.png", np.zeros((8, 8, 3)))
    gold = _deck(tmp_path / "gold.pptx")
    assert M["compare_pptx_files"](_deck(tmp_path / "pic.pptx", extra_picture=pic), gold) == 1.0
    assert M["compare_pptx_files"](_deck(tmp_path / "txt.pptx", extra_text=True), gold) == 0.0  # via bullets
    no_bullets = _deck(tmp_path / "txt2.pptx", extra_text=True)
    assert M["compare_pptx_files"](no_bullets, gold, examine_bullets=False) == 1.0


def test_compare_pptx_files_colour_set_on_one_side_only_is_not_compared(tmp_path):
    gold = _deck(tmp_path / "gold.pptx")
    assert M["compare_pptx_files"](_deck(tmp_path / "red.pptx", colour=(255, 0, 0)), gold) == 1.0
    red = _deck(tmp_path / "red2.pptx", colour=(255, 0, 0))
    assert M["compare_pptx_files"](_deck(tmp_path / "blue.pptx", colour=(0, 0, 255)), red) == 0.0


def test_compare_pptx_files_inherited_values_differ_from_explicit_defaults(tmp_path):
    gold = _deck(tmp_path / "gold.pptx")
    assert M["compare_pptx_files"](_deck(tmp_path / "left.pptx", align=PP_ALIGN.LEFT), gold) == 0.0
    assert M["compare_pptx_files"](_deck(tmp_path / "notbold.pptx", bold=False), gold) == 0.0


def test_compare_pptx_files_compares_geometry_exactly(tmp_path):
    gold = _deck(tmp_path / "gold.pptx")
    prs = Presentation(gold)
    prs.slides[0].shapes[0].left += 1  # one EMU
    prs.save(tmp_path / "nudged.pptx")
    assert M["compare_pptx_files"](str(tmp_path / "nudged.pptx"), gold) == 0.0
    assert M["compare_pptx_files"](str(tmp_path / "nudged.pptx"), gold, examine_shape=False) == 1.0


# --- more metrics whose official branches had no test by name ------------------------------------


def test_check_structure_sim_resized_resizes_without_cropping_transparency(tmp_path):
    base = np.zeros((40, 40, 3), np.uint8)
    base[10:30, 10:30] = 255
    tgt = _png(tmp_path / "t.png", base)
    big = np.array(Image.fromarray(base).resize((80, 80), Image.Resampling.NEAREST))
    assert M["check_structure_sim_resized"](_png(tmp_path / "b.png", big), tgt) == 1.0
    rgba = np.zeros((80, 80, 4), np.uint8)
    rgba[..., :3], rgba[..., 3] = big, 255
    assert M["check_structure_sim_resized"](_png(tmp_path / "a.png", rgba), tgt) == 0.0  # 4 vs 3 channels
    assert M["check_structure_sim_resized"](None, tgt) == 0.0


def test_literal_match_compares_text_and_lists():
    assert M["literal_match"](3, "3") == 1.0
    assert M["literal_match"]("A", "a", ignore_case=True) == 1.0
    assert M["literal_match"](None, "None") == 1.0  # no guard, as OSWorld
    assert M["literal_match"](["a", 1], ("a", "1"), type="list") == 1.0
    assert M["literal_match"](["a"], ["a", "b"], type="list") == 0.0
    assert M["literal_match"]("a", ["a"], type="list") == 0.0


def test_diff_text_file_is_a_line_level_ratio(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("x\ny\nz\n")
    b.write_text("x\ny\nw\n")
    assert M["diff_text_file"](str(a), str(b)) == pytest.approx(2 * 2 / 6)
    assert M["diff_text_file"](None, str(b)) == 0.0


def _docx_runs(path, runs, picture=None, second_text=None):
    from docx import Document

    doc = Document()
    para = doc.add_paragraph()
    for text, sub in runs:
        para.add_run(text).font.subscript = sub
    if picture:
        doc.add_paragraph().add_run().add_picture(picture)
    if second_text:
        doc.add_paragraph(second_text)
    doc.save(path)
    return str(path)


def test_docx_subscript_image_and_picture_metrics_pair_runs_in_order(tmp_path):
    gold = _docx_runs(tmp_path / "g.docx", [("H", None), ("2", True), ("O", None)])
    assert (
        M["compare_subscript_contains"](_docx_runs(tmp_path / "a.docx", [("H", None), ("2", True)]), gold)
        == 1.0
    )
    shifted = _docx_runs(tmp_path / "b.docx", [("H", None), ("2", None), ("O", True)])
    assert M["compare_subscript_contains"](shifted, gold) == 0.0  # subscript runs not paired
    pic = _png(tmp_path / "p.png", np.zeros((4, 4, 3)))
    with_pic = _docx_runs(tmp_path / "c.docx", [("x", None)], picture=pic)
    assert (
        M["compare_contains_image"](with_pic, _docx_runs(tmp_path / "d.docx", [("x", None)], picture=pic))
        == 1.0
    )
    text_there = _docx_runs(tmp_path / "e.docx", [("x", None)], second_text="no picture")
    assert M["compare_contains_image"](with_pic, text_there) == 0.0
    unpaired = _docx_runs(tmp_path / "e2.docx", [("x", None), ("y", None)])
    assert M["compare_contains_image"](with_pic, unpaired) == 1.0  # the picture's paragraph has no pair
    assert M["compare_docx_images"](with_pic, str(tmp_path / "d.docx")) == 1.0
    other = _png(tmp_path / "q.png", np.full((4, 4, 3), 9))
    assert (
        M["compare_docx_images"](with_pic, _docx_runs(tmp_path / "f.docx", [("x", None)], picture=other))
        == 0.0
    )


def test_check_one_instance_reads_the_last_matching_line_and_defaults_to_one(tmp_path):
    rc = tmp_path / "vlcrc"
    rc.write_text("#one-instance-when-started-from-file=1\none-instance-when-started-from-file=0\n")
    rule = {"expected_one_instance_when_started_from_file": 0}
    assert M["check_one_instance_when_started_from_file"](str(rc), rule) == 1.0
    rc.write_text("[qt]\n")
    assert M["check_one_instance_when_started_from_file"](str(rc), rule) == 0.0  # default "1"


def test_is_expected_url_pattern_match_without_patterns_passes_even_without_a_url():
    assert M["is_expected_url_pattern_match"]({"url": None}, {"expected": []}) == 1.0
    assert M["is_expected_url_pattern_match"](None, {"expected": []}) == 0.0
    with pytest.raises(TypeError):
        M["is_expected_url_pattern_match"]({"url": None}, {"expected": ["a"]})


# --- found by a differential run against OSWorld's general.py (issue 44: the multi-app metrics) -------


def test_check_json_applies_an_unexpect_rule_to_a_missing_key_as_none(tmp_path):
    """OSWorld: a key path missing from the file is None for an ``unexpect`` rule, and the rule still
    applies (``None != 2`` matches, so the file fails); a regex or ordering on it raises there (0)."""
    path = tmp_path / "s.json"
    path.write_text('{"a": {"b": 1}, "c": "y"}')
    check = METRICS["check_json"]

    def unexpect(method, ref, key=("a", "z")):
        return check(str(path), {"unexpect": [{"key": list(key), "method": method, "ref": ref}]})

    assert unexpect("ne", 2) == 0.0  # None != 2
    assert unexpect("eq", None) == 0.0  # None == None
    assert unexpect("eq", 2) == 1.0  # None == 2 is false: nothing unexpected
    assert unexpect("re", "x") == 0.0  # re.search over None raises there
    assert unexpect("lt", 3) == 0.0  # None < 3 raises there
    assert unexpect("eq", 2, key=("c",)) == 1.0 and unexpect("eq", "y", key=("c",)) == 0.0
    expect = {"expect": [{"key": ["c"], "method": "lt", "ref": 3}]}
    assert check(str(path), expect) == 0.0  # "y" < 3 raises there
    assert check(str(path), {"expect": [{"key": ["a", "b"], "method": "lt", "ref": 3}]}) == 1.0
    assert check(str(path), {"expect": [{"key": ["a", "q"], "method": "eq", "ref": None}]}) == 0.0


def test_check_direct_json_object_string_rule_is_membership_in_a_list_result():
    """OSWorld tests ``expected not in result[key]`` whatever the result is: a list holding the string
    passes; a missing key raises there (0)."""
    check = METRICS["check_direct_json_object"]
    rules = {"expected": {"b": "v"}, "expect_in_result": True}
    assert check({"b": ["v", "w"]}, rules) == 1.0
    assert check("{'b': ['v', 'w'], 'a': null}", rules) == 1.0
    assert check({"b": ["vw"]}, rules) == 0.0  # a list member must equal it
    assert check({"b": "xvx"}, rules) == 1.0 and check({"a": "v"}, rules) == 0.0
