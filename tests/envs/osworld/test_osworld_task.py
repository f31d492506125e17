"""The task loader parses OSWorld's JSON format and names the field when a file is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rz_agents.envs.osworld import LOCAL_TASKS
from rz_agents.envs.osworld.task import TaskFormatError, load_task, load_tasks, parse_task

# shared/ lies beside the repository checkout (CI clones elsewhere with a copy of shared/ beside it).
SHARED = next(
    (
        p
        for p in (
            Path(__file__).resolve().parents[3].parent / "shared/data/osworld/examples",
            Path("/work/shared/data/osworld/examples"),
        )
        if p.is_dir()
    ),
    Path("/work/shared/data/osworld/examples"),
)


def _task(**over):
    base = {
        "id": "t1",
        "snapshot": "os",
        "instruction": "do it",
        "config": [{"type": "execute", "parameters": {"command": "true", "shell": True}}],
        "related_apps": ["os"],
        "evaluator": {
            "func": "exact_match",
            "result": {"type": "rule", "rules": {}},
            "expected": {"type": "rule", "rules": {"expected": 1}},
        },
    }
    base.update(over)
    return base


def test_single_metric_is_broadcast_to_lists():
    t = parse_task(_task())
    assert t.evaluator.funcs == ["exact_match"]
    assert t.evaluator.conj == "and"
    assert t.evaluator.results[0]["type"] == "rule" and t.evaluator.options == [{}]
    assert t.config[0].type == "execute" and t.config[0].parameters["shell"] is True


def test_metric_list_with_conj_options_and_postconfig():
    ev = {
        "func": ["exact_match", "check_include_exclude"],
        "conj": "or",
        "result": [{"type": "rule", "rules": {}}, {"type": "vm_command_line", "command": "ls"}],
        "expected": [{"type": "rule", "rules": {}}, {"type": "rule", "rules": {}}],
        "options": [{}, {"ignore_case": True}],
        "postconfig": [{"type": "sleep", "parameters": {"seconds": 1}}],
    }
    t = parse_task(_task(evaluator=ev))
    assert t.evaluator.conj == "or" and t.evaluator.options[1] == {"ignore_case": True}
    assert t.evaluator.postconfig[0].type == "sleep"


def test_placeholder_evaluators_parse_to_no_metrics():
    assert parse_task(_task(evaluator="evaluation_dir")).evaluator.funcs == []
    assert parse_task(_task(evaluator={"func": "", "result": {}, "expected": {}})).evaluator.funcs == []


def test_infeasible_task_is_flagged():
    assert parse_task(_task(evaluator={"func": "infeasible"})).evaluator.is_infeasible


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"id": ""}, "'id'"),
        ({"instruction": 3}, "'instruction'"),
        ({"related_apps": "os"}, "related_apps"),
        ({"config": [{"parameters": {}}]}, "config[0]"),
        ({"evaluator": {"func": ["a", "b"], "result": [{"type": "rule"}]}}, "evaluator.result"),
        ({"evaluator": {"func": "a", "conj": "xor"}}, "evaluator.conj"),
        ({"evaluator": {"func": 5}}, "evaluator.func"),
    ],
)
def test_bad_fields_raise_with_the_field_named(override, field):
    with pytest.raises(TaskFormatError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_task(_task(**override))


def test_unreadable_json_is_an_error_entry_not_a_crash(tmp_path):
    (tmp_path / "good.json").write_text(json.dumps(_task()))
    (tmp_path / "bad.json").write_text("{not json")
    loaded = dict((p.name, t) for p, t in load_tasks(tmp_path))
    assert loaded["good.json"].id == "t1"
    assert isinstance(loaded["bad.json"], TaskFormatError)
    with pytest.raises(TaskFormatError, match="cannot read JSON"):
        load_task(tmp_path / "bad.json")


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no task file"):
        load_tasks(tmp_path / "nope")


def test_local_task_set_parses_and_skips_oracles():
    loaded = load_tasks(LOCAL_TASKS)
    assert len(loaded) >= 10
    assert all(not isinstance(t, Exception) for _p, t in loaded)
    assert {t.domain for _p, t in loaded} == {"os", "chrome"}


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared OSWorld examples not present")
def test_every_shared_example_parses():
    loaded = load_tasks(SHARED)
    assert len(loaded) > 300
    errors = [(str(p), str(t)) for p, t in loaded if isinstance(t, Exception)]
    assert errors == []
