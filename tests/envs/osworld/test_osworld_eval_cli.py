"""``rz osworld eval`` and ``run_osworld_eval``: success table, policies, failures recorded not fatal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from osworld_cli_helper import rz_osworld

from rz_agents.envs.osworld import LOCAL_TASKS
from rz_agents.envs.osworld.policies import OraclePolicy, load_policy, noop_policy
from rz_agents.eval.osworld import format_table, run_osworld_eval, summarize

TASKS = Path(LOCAL_TASKS)
needs_desktop = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("openbox")), reason="needs xvfb and openbox"
)


def scripted_policy(messages, task):
    """A module:callable policy for the CLI test: solves the rename task through the chat."""
    turn = sum(m["role"] == "assistant" for m in messages)
    if turn == 0:
        assert "following task: Rename the file draft.txt" in messages[0]["content"]
        return (
            "```python\nimport os\nos.rename('/home/user/Desktop/draft.txt', "
            "'/home/user/Desktop/final.txt')\n```"
        )
    return "DONE"


def test_load_policy_specs():
    assert isinstance(load_policy("oracle", TASKS), OraclePolicy)
    assert load_policy("noop", TASKS) is noop_policy
    assert load_policy(f"{__name__}:scripted_policy", TASKS) is scripted_policy
    with pytest.raises(ValueError, match="module:callable"):
        load_policy("gpt", TASKS)
    with pytest.raises(ValueError, match="not a callable"):
        load_policy("json:no_such_thing", TASKS)


def test_oracle_policy_replays_then_says_done():
    policy = OraclePolicy(TASKS / "oracles")
    task = {"id": "rz-os-rename-file"}
    first = policy([{"role": "system", "content": ""}], task)
    assert first.startswith("```python")
    assert policy([{"role": "assistant", "content": first}] * 5, task) == "DONE"
    with pytest.raises(KeyError, match="no oracle"):
        policy([], {"id": "unknown-task"})


def test_summary_excludes_skipped_tasks_and_table_lists_every_task():
    rows = [
        {"id": "a", "domain": "os", "status": "ok", "score": 1.0, "turns": 2, "seconds": 1.0},
        {"id": "b", "domain": "os", "status": "error", "score": 0.0, "error": "SetupError: x"},
        {
            "id": "c",
            "domain": "chrome",
            "status": "skipped",
            "score": None,
            "reasons": ["app not installed: gimp"],
        },
    ]
    s = summarize(rows)
    assert (s["evaluated"], s["skipped"], s["success_rate"]) == (2, 1, 0.5)
    table = format_table(s)
    assert all(name in table for name in ("a ", "b ", "c ", "SetupError: x", "app not installed: gimp"))
    assert "overall    success 0.500 over 2 tasks (1 skipped" in table


@needs_desktop
def test_a_failing_task_is_recorded_and_the_run_goes_on(tmp_path):
    bad = json.loads((TASKS / "os" / "rz-os-rename-file.json").read_text())
    bad["id"] = "needs-download"
    bad["config"] = [
        {
            "type": "download",
            "parameters": {"files": [{"url": "https://example.org/f", "path": "/home/user/f"}]},
        }
    ]
    (tmp_path / "a_bad.json").write_text(json.dumps(bad))
    shutil.copy(TASKS / "os" / "rz-os-rename-file.json", tmp_path / "b_good.json")
    (tmp_path / "c_broken.json").write_text("{")
    skipped = run_osworld_eval(tmp_path, scripted_policy)
    assert [r["status"] for r in skipped["tasks"]] == ["skipped", "ok", "error"]
    assert "needs internet download" in skipped["tasks"][0]["reasons"][0]
    forced = run_osworld_eval(tmp_path, scripted_policy, include_unrunnable=True)
    assert [r["status"] for r in forced["tasks"]] == ["error", "ok", "error"]
    assert "needs internet download" in forced["tasks"][0]["error"]
    assert forced["tasks"][1]["score"] == 1.0


@needs_desktop
def test_cli_eval_prints_the_success_table(capsys):
    task = TASKS / "os" / "rz-os-rename-file.json"
    assert rz_osworld("eval", "--tasks", str(task), "--policy", "oracle") == 0
    out = capsys.readouterr().out
    assert "rz-os-rename-file" in out and "1.00" in out
    assert "overall    success 1.000 over 1 tasks" in out


def test_cli_eval_bad_policy_or_path_exits_2(tmp_path, capsys):
    assert rz_osworld("eval", "--tasks", str(TASKS), "--policy", "nonsense") == 2
    assert "module:callable" in capsys.readouterr().err
    assert rz_osworld("eval", "--tasks", str(tmp_path / "missing"), "--policy", "noop") == 2
    assert "no task file" in capsys.readouterr().err


def test_benchmark_figure_counts_tasks_not_run_as_failures():
    """OSWorld scores the whole task list: a listed task that cannot run here is a failure in the
    benchmark figure, while the per-domain success over tasks run is reported beside it."""
    rows = [
        {"id": "a", "domain": "os", "status": "ok", "score": 1.0},
        {"id": "b", "domain": "os", "status": "skipped", "score": None, "reasons": ["needs internet"]},
        {"id": "c", "domain": "gimp", "status": "ok", "score": 0.0},
        {"id": "d", "domain": "multi_apps", "status": "ok", "score": 1.0},
        {"id": "e", "domain": "multi_apps", "status": "missing", "score": None, "reasons": ["no file"]},
        {"id": "f", "domain": "multi_apps", "status": "error", "score": 0.0, "error": "SetupError: x"},
    ]
    s = summarize(rows, benchmark=True)
    assert (s["evaluated"], s["skipped"], s["missing"], s["success_rate"]) == (4, 1, 1, 0.5)
    assert s["benchmark"] == {
        "listed": 6, "evaluated": 4, "not_run": 2, "score_sum": 2.0, "success_rate": 2.0 / 6,
        "groups": {"Office": {"evaluated": 0, "success_rate": 0.0},
                   "Daily": {"evaluated": 0, "success_rate": 0.0},
                   "Professional": {"evaluated": 1, "success_rate": 0.0}},
    }  # fmt: skip
    ma = s["by_domain"]["multi_apps"]
    counts = (ma["listed"], ma["evaluated"], ma["not_run"], ma["success_rate"], ma["benchmark_success_rate"])
    assert counts == (3, 2, 1, 0.5, 1 / 3)
    table = format_table(s)
    assert "benchmark  success 0.333 over all 6 listed tasks (2 not run here: 1 cannot run, 1 missing" in (
        table
    )
    assert "multi_apps          success 0.500 over   2 run; benchmark 0.333 over   3 listed" in table
    plain = summarize(rows)  # without a task list: no benchmark figure, as before
    assert "benchmark" not in plain and set(plain["by_domain"]["os"]) == {
        "evaluated",
        "score_sum",
        "success_rate",
    }


def test_task_list_selects_listed_tasks_and_reports_missing_ones(tmp_path, capsys):
    """With OSWorld's test_all.json next to the folder, only listed tasks (a file named after the id in
    its domain's folder) run; listed ids without a file are rows, never dropped."""
    examples = tmp_path / "examples"
    (examples / "os").mkdir(parents=True)
    task = json.loads((TASKS / "os" / "rz-os-rename-file.json").read_text())
    task["config"] = [{"type": "download", "parameters": {"files": [{"url": "https://example.org/f",
                                                                      "path": "/home/user/f"}]}}]  # fmt: skip
    for name in ("listed", "unlisted"):
        (examples / "os" / f"{name}.json").write_text(json.dumps({**task, "id": name}))
    (examples / "os" / "listed-win.json").write_text(json.dumps({**task, "id": "listed"}))
    (tmp_path / "test_all.json").write_text(json.dumps({"os": ["listed"], "multi_apps": ["gone"]}))
    s = run_osworld_eval(examples, "noop", subset={"os": ["listed"], "multi_apps": ["gone"]})
    assert [(r["domain"], r["id"], r["status"]) for r in s["tasks"]] == [
        ("os", "listed", "skipped"),
        ("multi_apps", "gone", "missing"),
    ]
    assert s["benchmark"]["listed"] == 2 and s["benchmark"]["not_run"] == 2
    assert rz_osworld("eval", "--tasks", str(examples), "--policy", "noop") == 0  # finds test_all.json
    out = capsys.readouterr().out
    assert "benchmark  success 0.000 over all 2 listed tasks" in out and "unlisted" not in out
