"""The paths a new user takes, run as they would (subprocess `rz ...`, the files it writes): a run stopped and
resumed keeps its whole history; a finished run is not retrained by --resume; `rz eval` / `rz serve` take the
run directory or its final_model; the eval: section serves `rz train` and `rz eval` alike."""

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest

from rz_agents.cli.launches import account_launches

TINY = (
    "mode: sync\nnum_threads: 1\ncheckpoint_every: 1\nlearner_step_delay_s: 0.3\n"
    "rollout:\n  group_size: 2\n  groups_per_batch: 2\n  max_concurrent_episodes: 4\n"
    "  limits: {max_turns: 2, max_tokens_per_turn: 8, max_episode_tokens: 200}\n"
    "engine: {max_running: 8, max_len: 256}\nenv:\n  kwargs: {latency_s: 0.0}\n"
    # a path relative to where the run starts; held-out evaluation before step 0 and every 2 steps
    "eval: {tasks: tasks.jsonl, k: 1, every: 2, at_start: true}\n"
)
TASKS = '{"id": "a", "word": "abc"}\n{"id": "b", "word": "xyz"}\n'

STEPS = 4


def rz(*args, timeout=300, cwd=None):
    """Run ``rz ARGS`` as a user would; (exit status, stdout, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "rz_agents", *map(str, args)], capture_output=True, text=True, timeout=timeout,
        cwd=cwd,
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def _interrupt_after_rows(cmd, cwd, metrics, rows, timeout=300):
    """Start ``cmd`` in ``cwd``; Ctrl-C (SIGINT) it once ``metrics`` has ``rows`` rows. (status, stderr)"""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= rows:
            proc.send_signal(signal.SIGINT)
            break
        time.sleep(0.02)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished run of TINY, stopped once by SIGINT (Ctrl-C) and resumed."""
    root = tmp_path_factory.mktemp("new-user")
    (root / "tiny.yaml").write_text(TINY)
    (root / "tasks.jsonl").write_text(TASKS)
    run = root / "run"
    # started in root with relative paths, as a user in their project directory would
    cmd = [sys.executable, "-m", "rz_agents", "train", "tiny.yaml", "--run-dir", "run", f"steps={STEPS}"]
    rc, err = _interrupt_after_rows(cmd, root, run / "metrics.jsonl", rows=2)
    assert rc == 128 + signal.SIGINT, err
    rc, out, err = rz("train", "--resume", "run", cwd=root)  # stdout redirected: plain step lines
    assert rc == 0, err
    assert "step 3 (4/4 done)" in err
    (run / "resume_stdout.txt").write_text(out)
    return run


def test_a_resumed_run_accounts_for_every_launch(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    first, second = summary["launches"]
    assert first["stopped_by"] == "SIGINT" and second["stopped_by"] is None
    assert first["steps"][0] == 0 and first["steps"][1] == second["steps"][0] and second["steps"][1] == STEPS
    assert summary["wall_s"] == pytest.approx(first["wall_s"] + second["wall_s"])
    assert summary["wall_s"] > summary["launch_wall_s"]
    out = (run_dir / "resume_stdout.txt").read_text()
    assert f"over 2 launches: {first['wall_s']:.1f} s (steps 0-{first['steps'][1]})" in out
    assert "Launches" in (run_dir / "report.html").read_text()


def test_the_held_out_curve_starts_before_step_0_and_survives_the_resume(run_dir):
    # eval.at_start ran in the first launch (stopped after 2 steps); the resumed one keeps it in the history
    summary = json.loads((run_dir / "summary.json").read_text())
    points = [(e["step"], e.get("at_start", False)) for e in summary["eval"]]
    assert points == [(None, True), (1, False), (3, False)]
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert first["eval_at_start/version"] == 0
    start = summary["eval"][0]["avg_at_k"]
    out = (run_dir / "resume_stdout.txt").read_text()
    end = summary["eval"][-1]["avg_at_k"]
    assert f"held-out avg@k (eval.every): {start:.3f} (before step 0) -> {end:.3f} (after step 3)" in out
    assert "eval before step 0 (eval.at_start): avg@k" in (run_dir / "rz.log").read_text()
    assert "step -1: before training (eval.at_start)" in (run_dir / "report.html").read_text()


def test_the_runs_config_keeps_paths_that_work_from_anywhere_and_rz_log_has_every_step(run_dir):
    import yaml

    recorded = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert recorded["eval"]["tasks"] == str(run_dir.parent / "tasks.jsonl")
    log = (run_dir / "rz.log").read_text()
    assert all(f"step {i} ({i + 1}/{STEPS} done)" in log for i in range(STEPS))


def test_imports_from_the_working_directory_name_the_cause(tmp_path):
    (tmp_path / "my_envs").mkdir()
    (tmp_path / "my_envs" / "__init__.py").write_text("")
    (tmp_path / "cfg.yaml").write_text("imports: [my_envs]\n")
    rz_command = shutil.which("rz")  # the console script: the working directory is not on its sys.path
    proc = subprocess.run([rz_command, "train", "cfg.yaml", "--dry-run"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2
    assert "no module named 'my_envs' (it is in the working directory" in proc.stderr
    assert "PYTHONPATH=. rz" in proc.stderr


def test_resume_of_a_finished_run_says_so_and_changes_nothing(run_dir):
    files = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    rc, out, err = rz("train", "--resume", run_dir)
    assert rc == 0
    assert err.strip() == (
        f"rz train: {run_dir} finished at step {STEPS}; pass steps=M (M > {STEPS}) to extend it: "
        f"rz train --resume {run_dir} steps=M"
    )
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == files


def test_the_warm_start_of_the_first_launch_stays_the_runs():
    launch = {"steps": 2, "wall_s": 10.0, "rl_wall_s": 6.0, "warm_start": {"format": {}}}
    first = account_launches(
        dict(launch, launch_warm_start_s=3.0, stopped={"signal": "SIGINT"}), None, 2, 0.0
    )
    second = account_launches(
        {"steps": 5, "wall_s": 4.0, "rl_wall_s": 3.5, "warm_start": None}, first, 3, 1.0
    )
    assert second["warm_start"] == {"format": {}} and second["wall_s"] == 14.0 and second["rl_wall_s"] == 9.5
    assert [r["steps"] for r in second["launches"]] == [[0, 2], [2, 5]]
    assert second["launches"][0]["warm_start_s"] == 3.0


@pytest.mark.parametrize("form", ["RUN", "RUN/final_model", "RUN/config.yaml"])
def test_rz_eval_takes_the_run_directory_or_its_final_model(run_dir, form):
    target = {"RUN": run_dir, "RUN/final_model": run_dir / "final_model"}.get(form, run_dir / "config.yaml")
    # the run's own env on the eval: section's tasks (eval.num_tasks: no flag), and the run's byte tokenizer
    rc, out, err = rz("eval", target, "--quiet", "--num-threads", "1")
    assert rc == 0, err
    assert "2 tasks, k=1" in out


def test_rz_eval_benchmark_reads_the_runs_shared_eval_section(run_dir, tmp_path):
    data = tmp_path / "two.jsonl"
    data.write_text('{"id": "p1", "question": "1+1?", "answer": "2"}\n')
    args = ["--benchmark", data, "--k", "1", "--max-tokens", "4", "--quiet", "--json", "--num-threads", "1"]
    rc, out, err = rz("eval", run_dir / "config.yaml", *args)
    assert rc == 0, err  # was: eval.num_tasks: unknown field
    assert json.loads(out)["k"] == 1


def test_a_path_that_is_no_run_gets_one_line_naming_the_forms(tmp_path):
    for command in ("eval", "serve"):
        rc, _, err = rz(command, tmp_path)
        assert rc == 2, err
        assert len(err.strip().splitlines()) == 1, err
        assert "a run directory (RUN: config.yaml + final_model/), a run's RUN/final_model" in err


def test_rz_serve_loads_the_runs_final_model(run_dir):
    import torch

    from rz_agents.cli.serve import build_server
    from rz_agents.model.checkpoint import load_hf_checkpoint

    server, engine = build_server(str(run_dir / "final_model"))
    assert server.model_name == run_dir.name
    final = load_hf_checkpoint(run_dir / "final_model").state_dict()
    assert all(torch.equal(t, final[n]) for n, t in engine.model.state_dict().items())


def test_a_prompt_past_the_models_positions_is_one_line_and_exits_non_zero(run_dir, tmp_path):
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"id": "long", "question": "1+" * 3000 + "1?", "answer": "3001"}) + "\n")
    args = ["--benchmark", data, "--k", "1", "--max-tokens", "4", "--quiet", "--num-threads", "1"]
    rc, _, err = rz("eval", run_dir, *args)
    assert rc == 1
    (line,) = err.strip().splitlines()
    assert "problem long's prompt has" in line and "max_position_embeddings" in line


def test_train_eval_every_works_as_typed_on_the_packaged_demo():
    from rz_agents.cli.train import load_run_config

    cfg = load_run_config("demo", ["eval.every=5"])  # validated: the in-loop plan finds its tasks
    assert cfg.eval["every"] == 5 and cfg.eval["num_tasks"] >= 1


def test_eval_every_without_tasks_names_config_keys_not_flags(tmp_path):
    cfg = tmp_path / "no-tasks.yaml"
    section = "eval: {tasks: tasks.jsonl, k: 1, every: 2, at_start: true}"
    cfg.write_text(TINY.replace(section, "eval: {every: 1}"))
    rc, _, err = rz("train", cfg, "--dry-run")
    assert rc == 2
    assert "eval.num_tasks" in err and "--num-tasks" not in err and "--tasks" not in err
