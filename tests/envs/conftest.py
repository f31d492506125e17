"""Helpers shared by the env tests."""

import json

import pytest


@pytest.fixture
def train_then_eval(tmp_path, capsys):
    """``run(config_text)``: ``rz train`` the config for its steps (every episode must finish), then
    ``rz eval RUN/config.yaml --checkpoint RUN/final_model --k 2 --json``; returns (train summary, eval
    result)."""
    from rz_agents.cli import main

    def run(config_text: str) -> tuple[dict, dict]:
        path = tmp_path / "run.yaml"
        path.write_text(config_text)
        run_dir = tmp_path / "run"
        assert main(["train", str(path), "--run-dir", str(run_dir), "--no-progress"]) == 0
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["episodes"]["failed"] == 0 and summary["episodes"]["finished"] >= 4
        capsys.readouterr()
        argv = ["eval", str(run_dir / "config.yaml"), "--checkpoint", str(run_dir / "final_model")]
        assert main([*argv, "--num-threads", "1", "--quiet", "--k", "2", "--json"]) == 0
        return summary, json.loads(capsys.readouterr().out)

    return run
