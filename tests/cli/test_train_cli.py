"""`rz train`: configs load and validate with clear errors; a short run writes its run directory."""

import json
from pathlib import Path

import pytest
import torch

from rz_agents.cli import main
from rz_agents.cli.train import RunConfig
from rz_agents.config_io import ConfigError, load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads(path):
    cfg = load_config(RunConfig, path)
    assert cfg.steps > 0


def test_wrong_field_name_gets_one_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  max_lagg: 3\n")
    with pytest.raises(ConfigError, match=r"rollout\.max_lagg: unknown field \(did you mean max_lag\?\)"):
        load_config(RunConfig, bad)
    bad.write_text("learner:\n  optim:\n    lr: fast\n")
    with pytest.raises(ConfigError, match=r"learner\.optim\.lr: expected float, got 'fast'"):
        load_config(RunConfig, bad)


def test_cli_reports_config_error_and_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("stepz: 3\n")
    assert main(["train", str(bad), "--run-dir", str(tmp_path / "run")]) == 2
    assert "stepz: unknown field (did you mean steps?)" in capsys.readouterr().err


def test_short_training_run_writes_summary_report_and_metrics(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(
        "steps: 2\nnum_threads: 1\nrollout:\n  group_size: 2\n  groups_per_batch: 2\n"
        "  max_concurrent_episodes: 4\n  limits: {max_turns: 2, max_tokens_per_turn: 8, max_episode_tokens: 200}\n"
        "engine: {num_slots: 8, max_len: 256}\nenv:\n  kwargs: {latency_s: 0.0}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["train", str(cfg), "--run-dir", str(run_dir), "--no-progress", "seed=3"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("reward_start", "reward_end", "wall_s", "max_lag_seen", "lag0_max_abs_dlogp"):
        assert key in summary
    assert summary["steps"] == 2
    assert summary["lag0_max_abs_dlogp"] == 0.0  # aligned kernels: lag-0 tokens are bit-identical
    assert (run_dir / "report.html").read_text().count("<img") >= 3
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert "seed: 3" in (run_dir / "config.yaml").read_text()
    assert "=== rz train: summary ===" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_align_check_on_cuda_without_a_gpu_fails_with_a_clear_message(capsys):
    assert main(["align-check", "--device", "cuda"]) == 2
    assert "no CUDA GPU is available" in capsys.readouterr().err
