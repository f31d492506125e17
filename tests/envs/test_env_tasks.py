"""env.tasks: a list, a JSONL / JSON / Parquet file, or a packaged name; a bad task is one line naming it."""

from __future__ import annotations

import json

import pytest

from rz_agents.cli.train import RunConfig
from rz_agents.config_io import ConfigError, load_config
from rz_agents.envs.tasks import load_tasks

BASE = "rollout: {limits: {max_turns: 1, max_tokens_per_turn: 4, max_episode_tokens: 100}}\n"
TASKS = [{"id": "t1", "word": "apple"}, {"id": "t2", "word": "pear"}]


def _load(tmp_path, overrides):
    path = tmp_path / "run.yaml"
    path.write_text(BASE)
    return load_config(RunConfig, path, list(overrides))


def test_an_inline_list_is_taken_as_is():
    assert load_tasks(TASKS) == TASKS
    assert load_tasks(None) is None


def test_jsonl_and_json_files_give_their_records(tmp_path):
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(t) for t in TASKS) + "\n\n")
    (tmp_path / "t.json").write_text(json.dumps(TASKS))
    assert load_tasks(str(tmp_path / "t.jsonl")) == TASKS
    assert load_tasks(str(tmp_path / "t.json")) == TASKS


def test_a_parquet_file_gives_its_records(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(TASKS), tmp_path / "t.parquet")
    assert load_tasks(str(tmp_path / "t.parquet")) == TASKS


def test_a_packaged_name_gives_its_normalized_records():
    tasks = load_tasks("gsm8k")
    assert len(tasks) > 100 and set(tasks[0]) == {"id", "question", "answer"}


def test_a_path_in_the_config_loads_and_trains_from_the_file(tmp_path):
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(t) for t in TASKS))
    cfg = _load(tmp_path, [f"env.tasks={tmp_path / 't.jsonl'}", f"env.eval_tasks={tmp_path / 't.jsonl'}"])
    assert cfg.env.tasks == str(tmp_path / "t.jsonl")  # the path is recorded, the file read when built


def test_a_task_that_is_not_a_mapping_names_its_index(tmp_path):
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, ["env.tasks=[apple]"])
    assert str(info.value) == (
        "env.tasks[0]: a task must be a mapping of the env's task fields (e.g. {id: t1, word: apple}), "
        "got str 'apple'"
    )
    (tmp_path / "t.jsonl").write_text('{"id": "a"}\n"pear"\n')
    with pytest.raises(ConfigError, match=r"^env.tasks \(.*t.jsonl\) task\[1\]: a task must be a mapping"):
        _load(tmp_path, [f"env.tasks={tmp_path / 't.jsonl'}"])


def test_a_missing_file_or_unknown_name_is_one_line(tmp_path):
    with pytest.raises(
        ConfigError, match=r"^env.tasks: tasks.jsonl: no such file \(relative paths start at "
    ):
        _load(tmp_path, ["env.tasks=tasks.jsonl"])
    with pytest.raises(
        ConfigError, match=r"^env.eval_tasks: 'gsm8kk' is neither a file nor a packaged task set "
    ):
        _load(tmp_path, ["env.eval_tasks=gsm8kk"])
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n{oops\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: invalid JSON"):
        _load(tmp_path, [f"env.tasks={tmp_path / 'bad.jsonl'}"])
