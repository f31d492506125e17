"""`rz train`'s warm start for any env: synthetic demos that do not fit the env are refused at load (they
used to train silently), a file of episodes trains, a bootstrap reports kept/total per round."""

import json

from rz_agents.cli import main
from tests.cli.test_train_cli import TINY


def test_arithmetic_demos_on_another_env_are_a_config_error_at_load_and_in_dry_run(tmp_path, capsys):
    cfg = tmp_path / "mismatch.yaml"
    cfg.write_text(TINY + "env: {id: rz_agents/GuessNumber-v0}\nwarm_start: {demos: 64}\n")
    for extra in (["--dry-run"], ["--run-dir", str(tmp_path / "run")]):
        assert main(["train", str(cfg), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(
            "rz train: config error: warm_start.demos makes 'arithmetic' demonstrations for "
            "rz_agents.envs.arithmetic_tool:ArithmeticToolEnv, but env.id is 'rz_agents/GuessNumber-v0'"
        )
        assert "warm_start.episodes: FILE.jsonl" in err
    assert not (tmp_path / "run").exists()
    # the env the demos are for is accepted
    cfg.write_text(
        TINY + "env: {id: 'rz_agents.envs.arithmetic_tool:ArithmeticToolEnv', kwargs: {prewarm: false}}\n"
        "warm_start: {demos: 64}\n"
    )
    assert main(["train", str(cfg), "--dry-run"]) == 0


def test_a_bad_episodes_file_stops_the_run_before_training_with_the_line_named(tmp_path, capsys):
    eps = tmp_path / "eps.jsonl"
    eps.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(TINY + f"warm_start: {{episodes: {eps}}}\n")
    assert main(["train", str(cfg), "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 2
    assert f"rz train: warm start: {eps}:1: no assistant turn" in capsys.readouterr().err
    assert not (tmp_path / "run" / "summary.json").exists()


def test_the_bootstrap_reports_kept_over_total_per_round_and_fine_tunes_on_the_kept(tmp_path, capsys):
    """The default env (lowercase letters) scores a random byte policy ~0.1; episodes reaching 0.25 are
    rare but exist: the bootstrap keeps exactly those, per round, and trains on them."""
    cfg = tmp_path / "boot.yaml"
    cfg.write_text(
        TINY.replace("steps: 2", "steps: 1") + "env: {kwargs: {latency_s: 0.0}}\n"
        "warm_start:\n  epochs: 1\n  batch_size: 8\n  warmup_steps: 0\n"
        "  bootstrap: {rounds: 2, tasks_per_round: 8, samples_per_task: 4, threshold: 0.25,"
        " system_prompt: 'Write only lowercase letters.'}\n"
    )
    run_dir = tmp_path / "run"
    assert main(["train", str(cfg), "--run-dir", str(run_dir), "--no-progress"]) == 0
    err = capsys.readouterr().err
    summary = json.loads((run_dir / "summary.json").read_text())
    rounds = summary["warm_start"]["bootstrap"]["rounds"]
    assert [r["round"] for r in rounds] == [1, 2] and all(r["total"] == 32 for r in rounds)
    for r in rounds:
        assert f"bootstrap round {r['round']}/2: kept {r['kept']}/32 episodes (reward >= 0.25" in err
    assert summary["warm_start"]["bootstrap"]["kept_total"] == sum(r["kept"] for r in rounds) > 0
    assert any("sft" in r for r in rounds)  # a round that kept something fine-tuned on it
    assert (run_dir / "initial_model").is_dir() and (run_dir / "warm_start_model").is_dir()
