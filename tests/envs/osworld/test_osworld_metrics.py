"""Metrics and OSWorld's scoring rules (infeasible tasks, FAIL, and/or conjunction)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rz_agents.envs.osworld.evaluate import evaluate_episode
from rz_agents.envs.osworld.metrics import METRICS
from rz_agents.envs.osworld.task import parse_evaluator

m = SimpleNamespace(**METRICS)


def test_exact_match_and_include_exclude():
    assert m.exact_match("100\n", {"expected": "100\n"}) == 1.0
    assert m.exact_match("99\n", {"expected": "100\n"}) == 0.0
    assert m.exact_match(None, {"expected": None}) == 1.0  # None == None, as OSWorld
    assert m.exact_match(None, {"expected": "x"}) == 0.0
    rules = {"include": ["43 132"], "exclude": ["error"]}
    assert m.check_include_exclude("43 132\n", rules) == 1.0
    assert m.check_include_exclude("43 132 error", rules) == 0.0
    assert m.check_include_exclude(None, rules) == 0.0


def test_compare_text_file_options(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("Buy  milk\n")
    b.write_text("buy milk")
    assert m.compare_text_file(str(a), str(b)) == 0.0
    assert m.compare_text_file(str(a), str(b), ignore_blanks=True, ignore_case=True) == 1.0
    assert m.compare_text_file(None, str(b)) == 0.0


def test_url_metrics_normalise_host_case_www_and_a_bare_slash_path():
    tab = {"url": "https://www.Example.com/", "title": "Home"}
    assert m.is_expected_active_tab(tab, {"type": "url", "url": "https://example.com"}) == 1.0
    assert m.is_expected_active_tab(tab, {"type": "url", "url": "https://example.com/contact"}) == 0.0
    tabs = [{"url": "file:///b"}, {"url": "file:///a"}]
    assert m.is_expected_tabs(tabs, {"type": "url", "urls": ["file:///a", "file:///b"]}) == 1.0
    assert m.is_expected_tabs(tabs, {"type": "url", "urls": ["file:///a"]}) == 0.0
    assert (
        m.is_expected_url_pattern_match({"url": "x/results.html?q=zebra"}, {"expected": [r"q=zebra$"]}) == 1.0
    )
    assert m.is_expected_url_pattern_match("x/results.html?q=zebras", {"expected": [r"q=zebra$"]}) == 0.0


def test_check_direct_json_object_exact_and_contained():
    assert m.check_direct_json_object({"a": "x", "b": 1}, {"expected": {"a": "x"}}) == 1.0
    assert m.check_direct_json_object({"a": "x "}, {"expected": {"a": "x"}}) == 0.0  # exact, as OSWorld
    assert m.check_direct_json_object("{'a': 'x'}", {"expected": {"a": "x"}}) == 1.0  # JSON text, ' quotes
    assert m.check_direct_json_object({"a": "y"}, {"expected": {"a": "x"}}) == 0.0
    alternatives = {"expected": {"q": ["flights", "trains"]}, "expect_in_result": True}
    assert m.check_direct_json_object({"q": "trains"}, alternatives) == 1.0
    assert m.check_direct_json_object({"q": ["buses", "flights"]}, alternatives) == 1.0
    assert m.check_direct_json_object({"q": "cheap trains"}, alternatives) == 0.0  # a list: equality
    assert (
        m.check_direct_json_object(
            {"q": "cheap flights"}, {"expected": {"q": "flights"}, "expect_in_result": True}
        )
        == 1.0
    )
    assert m.check_direct_json_object(None, {"expected": {}}) == 0.0


def test_check_moved_jpgs_compares_top_level_names():
    tree = {"children": [{"name": "a.jpg", "type": "file"}, {"name": "b.jpg", "type": "file"}]}
    assert m.check_moved_jpgs(tree, {"expected": ["b.jpg", "a.jpg"]}) == 1.0
    assert m.check_moved_jpgs(tree, {"expected": ["a.jpg"]}) == 0.0


def test_bookmarks_history_cookies_font_size():
    bm = {
        "bookmark_bar": {
            "children": [{"type": "folder", "name": "Work"}, {"type": "url", "url": "https://a.org/"}]
        }
    }
    assert m.is_expected_bookmarks(bm, {"type": "bookmark_bar_folders_names", "names": ["Work"]}) == 1.0
    assert (
        m.is_expected_bookmarks(bm, {"type": "bookmark_bar_websites_urls", "urls": ["https://b.org/"]}) == 0.0
    )
    assert (
        m.check_history_deleted(
            [("https://amazon.com/x", "t", 1)], {"type": "keywords", "keywords": ["amazon"]}
        )
        == 0.0
    )
    assert m.is_cookie_deleted([(0, ".amazon.com")], {"type": "domains", "domains": [".amazon.com"]}) == 0.0
    assert m.check_font_size({"default_font_size": 20}, {"type": "range", "min": 16, "max": 24}) == 1.0


def _ev(**kw):
    return parse_evaluator(kw)


def _rule_metric(score):
    """An exact_match metric that scores ``score`` from rule getters alone (no desktop touched)."""
    return {
        "result": {"type": "rule", "rules": "x" if score else "y"},
        "expected": {"type": "rule", "rules": {"expected": "x"}},
    }


def test_infeasible_scores_one_only_when_the_last_action_is_fail():
    ev = _ev(func="infeasible")
    assert evaluate_episode(None, ev, ["pyautogui.click(1, 1)", "FAIL"]).score == 1.0
    assert evaluate_episode(None, ev, ["FAIL", "DONE"]).score == 0.0
    assert evaluate_episode(None, ev, []).score == 0.0


def test_feasible_task_scores_zero_after_fail_even_if_state_matches():
    ev = _ev(func="exact_match", **_rule_metric(1))
    assert evaluate_episode(None, ev, ["DONE"]).score == 1.0
    assert evaluate_episode(None, ev, ["FAIL"]).score == 0.0


@pytest.mark.parametrize(
    ("conj", "scores", "expected"),
    [("and", [1, 1], 1.0), ("and", [1, 0], 0.0), ("or", [0, 1], 1.0), ("or", [0, 0], 0.0)],
)
def test_conjunction_of_metrics(conj, scores, expected):
    parts = [_rule_metric(s) for s in scores]
    ev = _ev(
        func=["exact_match"] * len(scores),
        conj=conj,
        result=[p["result"] for p in parts],
        expected=[p["expected"] for p in parts],
    )
    assert evaluate_episode(None, ev, ["DONE"]).score == expected


def test_unknown_metric_or_getter_scores_zero_with_the_reason():
    ev = _ev(func="no_such_metric", result={"type": "rule", "rules": 1})
    out = evaluate_episode(None, ev, ["DONE"])
    assert out.score == 0.0 and "metric not implemented: no_such_metric" in out.errors[0]
    ev = _ev(
        func="exact_match",
        result={"type": "no_such_getter"},
        expected={"type": "rule", "rules": {"expected": 1}},
    )
    out = evaluate_episode(None, ev, ["DONE"])
    assert out.score == 0.0 and "getter not implemented: no_such_getter" in out.errors[0]


def test_placeholder_evaluator_scores_zero_with_reason():
    out = evaluate_episode(None, _ev(func=""), ["DONE"])
    assert out.score == 0.0 and "no evaluator" in out.errors[0]
