"""Renamed config fields and flags: the old name still loads for one release, with a one-line deprecation
warning naming the new one (config_io's ``RENAMED_FIELDS``, cli/flags.py); old and new together are an
error; a resume compares an old run directory's config under the new names."""

from __future__ import annotations

import dataclasses
import warnings
from typing import ClassVar

import pytest
import yaml

from rz_agents.cli import build_parser
from rz_agents.cli.resume import check_same_run, config_for_resume
from rz_agents.cli.train import RunConfig, load_run_config
from rz_agents.config_io import ConfigError, from_dict, rename_fields, to_dict
from rz_agents.eval.math_config import load_eval_config


@dataclasses.dataclass
class _Inner:
    size: int = 1
    depth: int = 2


@dataclasses.dataclass
class _Toy:
    RENAMED_FIELDS: ClassVar[dict[str, str]] = {
        "slots": "size_cap",
        "old_inner": "inner",
        "flat": "inner.depth",
    }

    size_cap: int = 4
    inner: _Inner = dataclasses.field(default_factory=_Inner)


def _renames(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, DeprecationWarning)]


def test_an_old_field_name_loads_into_the_new_field_with_a_one_line_warning():
    data = {"slots": 9, "old_inner": {"size": 3}, "flat": 7}
    with pytest.warns(DeprecationWarning) as record:
        toy = from_dict(_Toy, data)
    assert toy == _Toy(size_cap=9, inner=_Inner(size=3, depth=7))
    messages = _renames(record)
    assert "config key slots is renamed size_cap; the old name is accepted for one release" in messages
    assert any("old_inner is renamed inner" in m for m in messages)
    assert any("flat is renamed inner.depth" in m for m in messages)
    assert all("\n" not in m for m in messages)
    assert data == {"slots": 9, "old_inner": {"size": 3}, "flat": 7}  # the caller's mapping is untouched


def test_the_new_names_load_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert from_dict(_Toy, {"size_cap": 2, "inner": {"depth": 5}}) == _Toy(2, _Inner(1, 5))


def test_old_and_new_name_together_is_an_error_naming_both():
    with pytest.raises(
        ConfigError, match=r"^slots: renamed to size_cap, which is set too; keep only size_cap$"
    ):
        from_dict(_Toy, {"slots": 1, "size_cap": 2})
    with pytest.raises(ConfigError, match=r"flat: renamed to inner.depth, which is set too"):
        from_dict(_Toy, {"flat": 1, "inner": {"depth": 2}})


def test_rename_fields_renames_at_every_depth_of_a_raw_config():
    with pytest.warns(DeprecationWarning):
        raw = rename_fields(RunConfig, {"engine": {"num_slots": 3}, "placement": {"engines": 2}, "steps": 1})
    assert raw == {"engine": {"max_running": 3}, "actors": {"engines": 2}, "steps": 1}


def test_a_run_config_with_num_slots_and_placement_loads_under_the_new_names(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("runtime: ray\nengine: {num_slots: 7}\nplacement: {engines: 2}\n")
    with pytest.warns(DeprecationWarning) as record:
        cfg = load_run_config(str(path), ["engine.max_len=1024"])
    assert cfg.engine.max_running == 7 and cfg.actors.engines == 2 and cfg.engine.max_len == 1024
    messages = _renames(record)
    assert any("config key engine.num_slots is renamed engine.max_running" in m for m in messages)
    assert any("config key placement is renamed actors" in m for m in messages)
    with pytest.warns(DeprecationWarning, match="engine.num_slots is renamed engine.max_running"):
        assert load_run_config("demo", ["engine.num_slots=5"]).engine.max_running == 5  # an override too
    with pytest.warns(DeprecationWarning):  # two overrides of one field: the later wins, as always
        assert load_run_config("demo", ["engine.num_slots=5", "engine.max_running=6"]).engine.max_running == 6
    path.write_text("engine: {num_slots: 7, max_running: 8}\n")  # both in one file: which one is meant?
    with pytest.raises(
        ConfigError, match="engine.num_slots: renamed to engine.max_running, which is set too"
    ):
        load_run_config(str(path))


def test_the_eval_section_takes_num_slots_too(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text("eval: {benchmark: gsm8k, num_slots: 3, checkpoint: x}\n")
    with pytest.warns(DeprecationWarning, match="eval.num_slots is renamed eval.max_running"):
        assert load_eval_config(path).max_running == 3
    with pytest.warns(DeprecationWarning):  # a flag given beside the old key in the file wins, no conflict
        assert load_eval_config(path, {"max_running": 5}).max_running == 5


def test_a_resume_of_a_run_dir_with_the_old_names_sees_no_change(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # config.yaml as a run before the renames wrote it (every field, the old names)
    old = to_dict(from_dict(RunConfig, {"runtime": "ray", "engine": {"max_running": 8}, "steps": 2}))
    old["engine"]["num_slots"] = old["engine"].pop("max_running")
    old["placement"] = old.pop("actors")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(old))
    with pytest.warns(DeprecationWarning):
        recorded, _ = config_for_resume(RunConfig, run_dir, ["steps=4", "actors.engines=3"])
        assert recorded.engine.max_running == 8 and recorded.actors.engines == 3 and recorded.steps == 4
        same = dataclasses.replace(recorded, actors=dataclasses.replace(recorded.actors, engines=2), steps=2)
        assert check_same_run(same, run_dir) is not None  # the new spelling agrees with the old file
        with pytest.raises(ConfigError, match="differs from its config.yaml in engine.max_running;"):
            check_same_run(
                dataclasses.replace(same, engine=dataclasses.replace(same.engine, max_running=9)), run_dir
            )
    with pytest.raises(ConfigError, match="cannot change engine.max_running"):
        config_for_resume(RunConfig, run_dir, ["engine.max_running=9"])


def test_an_old_flag_is_the_new_one_with_a_warning():
    parser = build_parser()
    with pytest.warns(DeprecationWarning, match="--num-slots is renamed --max-running"):
        args = parser.parse_args(["serve", "demo", "--num-slots", "3"])
    assert args.max_running == 3
    assert parser.parse_args(["serve", "demo", "--max-running", "4"]).max_running == 4
    with pytest.warns(DeprecationWarning, match="--num-slots is renamed --max-running"):
        assert parser.parse_args(["eval", "--num-slots", "2"]).max_running == 2
