"""`rz train`: configs load and validate with clear errors; a short run writes its run directory."""

import json
import time

import pytest
import torch

from rz_agents.cli import main
from rz_agents.cli.configs import packaged_configs, resolve_config
from rz_agents.cli.train import RunConfig, load_run_config
from rz_agents.config_io import ConfigError, load_config

CONFIGS = packaged_configs()
TINY = (
    "steps: 2\nnum_threads: 1\nrollout:\n  group_size: 2\n  groups_per_batch: 2\n"
    "  max_concurrent_episodes: 4\n"
    "  limits: {max_turns: 2, max_tokens_per_turn: 8, max_episode_tokens: 200}\n"
    "engine: {max_running: 8, max_len: 256}\n"
)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_loads_by_name(name):
    cfg = load_run_config(name)
    assert cfg.steps > 0 and resolve_config(f"{name}.yaml") == CONFIGS[name]


def test_list_configs_names_each_packaged_config_with_its_description(capsys):
    assert main(["train", "--list-configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(CONFIGS)
    assert any("CPU demo" in line for line in lines if line.startswith("demo "))


def test_an_unknown_config_name_is_one_error_with_a_did_you_mean(tmp_path, capsys):
    assert main(["train", "dmeo", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dmeo: no such config file or packaged config (did you mean demo?" in err
    assert not (tmp_path / "run").exists()


def test_env_id_typo_fails_at_load_in_under_a_second_with_a_did_you_mean(tmp_path, capsys):
    cfg = tmp_path / "typo.yaml"
    cfg.write_text(TINY + "env: {id: rz_agents/PythonTol-v0}\n")
    start = time.perf_counter()
    assert main(["train", str(cfg), "--run-dir", str(tmp_path / "run")]) == 2
    assert time.perf_counter() - start < 1.0
    err = capsys.readouterr().err
    assert err == (
        "rz train: config error: env.id: no Gymnasium env 'rz_agents/PythonTol-v0' is registered "
        "(did you mean rz_agents/PythonTool-v0?)\n"
    )
    assert not (tmp_path / "run").exists()  # nothing was built
    cfg.write_text(TINY + "env: {id: 'rz_agents.envs.word_problem_tool:WordProblemTolEnv'}\n")
    assert main(["train", str(cfg)]) == 2
    assert "has no 'WordProblemTolEnv' (did you mean WordProblemToolEnv?)" in capsys.readouterr().err


def test_a_run_stopping_failure_is_one_line_and_exit_1_with_the_traceback_in_the_run_log(tmp_path, capsys):
    cfg = tmp_path / "broken.yaml"
    # every reset fails (the task has no answer): the controller gives up after 4 failed episodes
    cfg.write_text(
        TINY
        + "env: {id: rz_agents/PythonTool-v0, kwargs: {tasks: [{question: q}]}}\nwarm_start: {demos: 0}\n"
    )
    run_dir = tmp_path / "run"
    argv = ["train", str(cfg), "rollout.max_consecutive_failures=4", "--no-progress"]
    assert main([*argv, "--run-dir", str(run_dir)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rz train: error: RolloutFailure: 4 episodes in a row failed")
    assert err[-1].endswith(f"(traceback: {run_dir / 'rz.log'})") and "Traceback" not in "".join(err)
    log = (run_dir / "rz.log").read_text()
    assert "Traceback (most recent call last)" in log and "task must have a 'answer' field" in log
    with pytest.raises(Exception, match="4 episodes in a row failed"):  # --debug: the exception itself
        main([*argv, "--run-dir", str(tmp_path / "run2"), "--debug"])


def test_wrong_field_name_gets_one_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  max_lagg: 3\n")
    with pytest.raises(ConfigError, match=r"rollout\.max_lagg: unknown field \(did you mean max_lag\?\)"):
        load_config(RunConfig, bad)
    bad.write_text("learner:\n  optim:\n    lr: fast\n")
    with pytest.raises(ConfigError, match=r"learner\.optim\.lr: expected float, got 'fast'"):
        load_config(RunConfig, bad)
    bad.write_text("learner:\n  optim:\n    lr: 3e-4\n")  # YAML 1.1 reads this as the string '3e-4'
    assert load_config(RunConfig, bad).learner.optim.lr == 3e-4
    bad.write_text("learner:\n  optim:\n    lr: 3e-4x\n")
    with pytest.raises(ConfigError, match=r"learner\.optim\.lr: expected float, got '3e-4x'"):
        load_config(RunConfig, bad)


def test_cli_reports_config_error_and_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("stepz: 3\n")
    assert main(["train", str(bad), "--run-dir", str(tmp_path / "run")]) == 2
    assert "stepz: unknown field (did you mean steps?)" in capsys.readouterr().err


def test_short_training_run_writes_summary_report_and_metrics(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY + "env:\n  kwargs: {latency_s: 0.0}\n")
    run_dir = tmp_path / "run"
    assert main(["train", str(cfg), "--run-dir", str(run_dir), "--no-progress", "seed=3"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("reward_start", "reward_end", "wall_s", "max_lag_seen", "lag0_max_abs_dlogp"):
        assert key in summary
    assert summary["steps"] == 2
    assert summary["lag0_max_abs_dlogp"] == 0.0  # aligned kernels: lag-0 tokens are bit-identical
    report = (run_dir / "report.html").read_text()
    assert report.count("<img") >= 3 and "href='inspector.html'" in report
    assert "<th>rollout</th><td><table>" in report and '{"' not in report  # nested tables, not JSON
    # the trajectory inspector: the first and the last step, recorded with the learner's own log-probs
    records = [json.loads((run_dir / "inspect" / f"step_0000{i}.json").read_text()) for i in (0, 1)]
    lag0 = [
        (lp, blp)
        for ep in records[0]["episodes"]
        for m, v, lp, blp in zip(
            ep["loss_mask"], ep["versions"], ep["learner_logprobs"], ep["behavior_logprobs"], strict=True
        )
        if m and v == records[0]["version"]
    ]
    assert lag0 and all(lp == blp for lp, blp in lag0)  # bit-identical: every IS weight is exactly 1
    page = (run_dir / "inspector.html").read_text()
    n_episodes = sum(len(r["episodes"]) for r in records)
    assert page.count('<div class="ep">') == n_episodes == 2 * 4
    policy = sum(sum(ep["loss_mask"]) for r in records for ep in r["episodes"])
    assert page.count('<span class="tok') - page.count('<span class="tok o"') - 8 == policy  # legend: 8 spans
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert "seed: 3" in (run_dir / "config.yaml").read_text()
    assert "=== rz train: summary ===" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_align_check_on_cuda_without_a_gpu_fails_with_a_clear_message(capsys):
    assert main(["align-check", "--device", "cuda"]) == 2
    assert "no CUDA GPU is available" in capsys.readouterr().err
