"""`rz train --resume RUN_DIR`: a run killed with SIGKILL continues with its own config.yaml from its
checkpoint, without redoing its warm start or repeating a step in metrics.jsonl; a resume cannot change
what the checkpoint depends on, and a new run cannot overwrite another run's checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time

import yaml

from rz_agents.cli import main

TINY = (
    "num_threads: 1\ncheckpoint_every: 1\nlearner_step_delay_s: 0.2\n"
    "rollout:\n  group_size: 2\n  groups_per_batch: 2\n  max_concurrent_episodes: 4\n  max_ahead_batches: 2\n"
    "  limits: {max_turns: 2, max_tokens_per_turn: 8, max_episode_tokens: 200}\n"
    "engine: {max_running: 8, max_len: 256}\nenv:\n  kwargs: {latency_s: 0.0}\n"
    "report: false\nexport_final_model: false\n"
)


def lowercase_episodes(tmp_path):
    """A warm-start episodes file of the default env (lowercase letters): four answers of its own."""
    episodes = tmp_path / "episodes.jsonl"
    prompt = {"role": "user", "content": "Write lowercase letters, like abc."}
    episodes.write_text(
        "".join(
            json.dumps({"messages": [prompt, {"role": "assistant", "content": w}]}) + "\n"
            for w in ("abcdef", "qwerty", "zxcvbn", "lowercase")
        )
    )
    return episodes


def _tiny_config(tmp_path):
    """TINY with a warm start on the default env's (lowercase letters) own answers: the synthetic arithmetic
    demos are refused for that env."""
    episodes = lowercase_episodes(tmp_path)
    return (
        TINY + f"warm_start: {{demos: 0, episodes: {episodes}, epochs: 1, batch_size: 4, warmup_steps: 0}}\n"
    )


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _kill_after_rows(cmd, metrics, rows, timeout=120):
    """Start ``cmd``, SIGKILL it once ``metrics`` has ``rows`` rows (a checkpoint is written after each)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= rows:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err
    return err


def test_a_killed_run_resumes_with_its_config_and_finishes(tmp_path, capsys):
    cfg, run_dir = tmp_path / "tiny.yaml", tmp_path / "run"
    cfg.write_text(_tiny_config(tmp_path))
    cmd = [sys.executable, "-m", "rz_agents", "train", str(cfg), "--run-dir", str(run_dir), "--no-progress"]
    err = _kill_after_rows(cmd + ["steps=6", "seed=4"], run_dir / "metrics.jsonl", rows=2)
    assert "warm start, episodes: 4 from" in err
    recorded = (run_dir / "config.yaml").read_text()

    # Rerunning the first command would overwrite the run's checkpoint: refused.
    assert main(["train", str(cfg), "--run-dir", str(run_dir), "steps=6", "seed=4"]) == 2
    assert "already holds a run (checkpoint.pt); resume it with `rz train --resume" in capsys.readouterr().err
    # A resume cannot change what the checkpoint depends on.
    assert main(["train", "--resume", str(run_dir), "rollout.max_lag=3", "seed=5"]) == 2
    assert "cannot change rollout.max_lag, seed when resuming" in capsys.readouterr().err
    resume_from = f"resume_from={run_dir}/checkpoint.pt"
    assert main(["train", str(cfg), "--run-dir", str(run_dir), "steps=6", "seed=5", resume_from]) == 2
    # config.yaml records the config as written (no derived copies such as rollout.seed): only seed differs
    assert "differs from its config.yaml in seed;" in capsys.readouterr().err

    assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"resuming from {run_dir}/checkpoint.pt" in err and "warm start skipped" in err
    assert (run_dir / "config.yaml").read_text() == recorded  # still the run's own config
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(6))
    trained = [i for r in rows for i in r["group_indices"]]
    assert len(trained) == len(set(trained)) == 12
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 6

    # A run started from that checkpoint in a new directory resumes from its own checkpoint and keeps
    # recording where it started from.
    second = tmp_path / "second"
    assert (
        main(["train", str(cfg), "--run-dir", str(second), "--no-progress", "steps=7", "seed=4", resume_from])
        == 0
    )
    assert main(["train", "--resume", str(second), "--no-progress", "steps=8"]) == 0
    assert f"resuming from {second}/checkpoint.pt" in capsys.readouterr().err
    kept = yaml.safe_load((second / "config.yaml").read_text())
    assert kept["resume_from"] == f"{run_dir}/checkpoint.pt" and kept["steps"] == 8
    assert [r["step"] for r in _rows(second)] == [6, 7]
