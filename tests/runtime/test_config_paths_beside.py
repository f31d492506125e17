"""A config's relative data-file paths are found beside the YAML file when the working directory lacks them:
a packaged config (terminal-tiny's demos) runs from any directory."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from rz_agents.cli.configs import resolve_config
from rz_agents.cli.train import load_run_config
from rz_agents.config_io import paths_beside


def test_a_path_beside_the_yaml_is_made_absolute_and_one_from_the_working_directory_keeps_its_meaning(
    tmp_path, monkeypatch
):
    cfg_dir, work = tmp_path / "cfg", tmp_path / "work"
    cfg_dir.mkdir()
    work.mkdir()
    (cfg_dir / "demos.jsonl").write_text("{}\n")
    (work / "mine.jsonl").write_text("{}\n")
    monkeypatch.chdir(work)
    data = {"a": "demos.jsonl", "b": ["mine.jsonl", "missing.jsonl"], "c": "local", "d": "http://x/y.json"}
    out = paths_beside(data, cfg_dir)
    assert out["a"] == str((cfg_dir / "demos.jsonl").resolve())
    assert out["b"] == ["mine.jsonl", "missing.jsonl"]  # from the working directory / not found: as written
    assert out["c"] == "local" and out["d"] == "http://x/y.json"


def test_the_packaged_terminal_config_finds_its_demos_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_run_config("terminal-tiny", validate=False)
    episodes = Path(cfg.warm_start.episodes)
    assert episodes.is_absolute() and episodes.is_file(), episodes
    # the packaged YAML names it relative to itself (today's main named configs/..., found only from the repo)
    raw = yaml.safe_load(resolve_config("terminal-tiny").read_text())
    assert not os.path.isabs(raw["warm_start"]["episodes"])
