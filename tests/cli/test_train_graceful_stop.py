"""A graceful stop of `rz train`: the first SIGTERM / SIGINT stops the run at the next learner-step boundary,
saves the checkpoint the periodic one would write there, and exits 128 + the signal; resuming from it is
bitwise the uninterrupted run. A second signal aborts at once; a stop before the first step saves nothing."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import torch
from safetensors.torch import load_file

from rz_agents.cli import main
from rz_agents.runtime import EnvSpec, LocalRun
from rz_agents.runtime import stop as stop_module
from rz_agents.runtime.stop import StopRequest, StopSignals
from rz_agents.trainer.checkpoint import load_checkpoint
from tests.cli.test_train_resume import lowercase_episodes
from tests.rollout.test_rollout_resume_after_kill import _cfg

# Sync mode (one batch at a time, generated with the current weights): a resumed run is bitwise the
# uninterrupted one (tests/rollout/test_rollout_resume_after_kill.py compares the same way). The step delay
# leaves the signal time to land mid-run.
TINY = (
    "mode: sync\nnum_threads: 1\ncheckpoint_every: 3\nlearner_step_delay_s: 0.3\n"
    "rollout:\n  group_size: 2\n  groups_per_batch: 2\n  max_concurrent_episodes: 4\n"
    "  limits: {max_turns: 2, max_tokens_per_turn: 8, max_episode_tokens: 200}\n"
    "engine: {max_running: 8, max_len: 256}\nenv:\n  kwargs: {latency_s: 0.0}\nreport: false\n"
)
STEPS = 8
# What a step computes (no timings, no per-process engine counters): equal in the resumed and the full run.
COMPARED = (
    "step", "version", "group_indices", "reward_mean", "reward_std", "loss", "grad_norm",
    "num_sampled_tokens", "lag0_abs_dlogp_max", "kl_k3_behavior_to_learner", "is_weight_mean",
)  # fmt: skip


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _signal_after_rows(cmd, metrics, rows, signum, group=False, timeout=120):
    """Start ``cmd``; send ``signum`` once ``metrics`` has ``rows`` rows (``group``: to its whole process
    group, as a terminal's Ctrl-C does); wait for the process to end. Returns (exit status, stderr, the rows
    there were when the signal was sent)."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=group
    )
    deadline, seen = time.monotonic() + timeout, None
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= rows:
            os.killpg(proc.pid, signum) if group else os.kill(proc.pid, signum)
            seen = len(metrics.read_text().splitlines())  # (read after: a loaded machine may lag)
            break
        time.sleep(0.02)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err, seen


def test_sigterm_saves_at_the_next_step_and_the_resume_is_bitwise_the_uninterrupted_run(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    full, run_dir = tmp_path / "full", tmp_path / "run"
    args = [str(cfg), "--no-progress", f"steps={STEPS}", "seed=3"]
    cmd = [sys.executable, "-m", "rz_agents", "train", "--run-dir", str(run_dir), *args]
    rc, err, seen = _signal_after_rows(cmd, run_dir / "metrics.jsonl", rows=4, signum=signal.SIGTERM)
    assert rc == 128 + signal.SIGTERM, err
    assert "SIGTERM received: stopping at the next learner-step boundary" in err
    # The step running when the signal came finishes (usually 4 or 5 steps: after the periodic one at 3).
    payload = load_checkpoint(run_dir / "checkpoint.pt", restore_rng=False)
    saved = payload["runtime"]["steps_done"]
    assert seen <= saved <= seen + 1 < STEPS, err
    assert len(_rows(run_dir)) == saved  # no step trained past the checkpoint
    line = (
        f"rz train: stopped by SIGTERM after step {saved}/{STEPS}, saved {run_dir}/checkpoint.pt; "
        f"resume with: rz train --resume {run_dir}"
    )
    assert err.strip().splitlines()[-1] == line
    assert not (run_dir / "final_model").exists()  # written when the run ends, not at a stop
    assert json.loads((run_dir / "summary.json").read_text())["stopped"]["signal"] == "SIGTERM"

    assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 0
    assert main(["train", "--run-dir", str(full), *args]) == 0
    resumed_rows, full_rows = _rows(run_dir), _rows(full)
    assert len(resumed_rows) == len(full_rows) == STEPS
    for a, b in zip(resumed_rows, full_rows, strict=True):
        assert {k: a[k] for k in COMPARED} == {k: b[k] for k in COMPARED}
    w_resumed = load_file(run_dir / "final_model" / "model.safetensors")
    w_full = load_file(full / "final_model" / "model.safetensors")
    assert w_resumed.keys() == w_full.keys()
    for k, v in w_full.items():
        assert torch.equal(v, w_resumed[k]), k


def test_ctrl_c_to_the_process_group_with_the_learner_in_a_child_process_saves(tmp_path):
    """SIGINT to every process of the group (a terminal's Ctrl-C): the learner process ignores it, the run
    saves the learner's state at the step boundary and exits 130."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "rz_agents", "train", str(cfg), "--run-dir", str(run_dir), "--no-progress",
           f"steps={STEPS}", "learner_process=true", "checkpoint_every=100"]  # fmt: skip
    rc, err, seen = _signal_after_rows(
        cmd, run_dir / "metrics.jsonl", rows=2, signum=signal.SIGINT, group=True
    )
    assert rc == 128 + signal.SIGINT, err
    payload = load_checkpoint(run_dir / "checkpoint.pt", restore_rng=False)
    saved = payload["runtime"]["steps_done"]
    assert seen <= saved <= seen + 1 < STEPS and len(_rows(run_dir)) == saved, err
    assert payload["learner"]["version"] == saved  # the child's state, saved after the signal
    assert f"stopped by SIGINT after step {saved}/{STEPS}" in err.strip().splitlines()[-1]


def test_a_stop_during_the_warm_start_saves_nothing(tmp_path):
    episodes = lowercase_episodes(tmp_path)
    cfg = tmp_path / "tiny.yaml"
    # 400 SFT steps: seconds, long enough for the signal to come while they run
    cfg.write_text(
        TINY + f"warm_start: {{demos: 0, episodes: {episodes}, epochs: 100, batch_size: 1, "
        "warmup_steps: 0}\n"
    )
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "rz_agents", "train", str(cfg), "--run-dir", str(run_dir), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:  # the warm start announces itself before its first step
        lines.append(line)
        if line.startswith("warm start, episodes: 4"):
            os.kill(proc.pid, signal.SIGTERM)
            break
    err = "".join(lines) + proc.communicate(timeout=120)[1]
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == (
        "rz train: stopped by SIGTERM during the warm start: nothing to save (no checkpoint was written); "
        f"rz train --resume {run_dir} starts the run again"
    )
    assert "warm start (episodes) step 400/400" not in err
    assert not (run_dir / "checkpoint.pt").exists() and not (run_dir / "warm_start_model").exists()
    assert not _rows(run_dir)  # (the file is opened when the run is built)


def test_a_stop_before_the_first_step_writes_no_checkpoint(tmp_path):
    stop = StopRequest()
    stop.request(signal.SIGINT)
    run = LocalRun(_cfg(steps=3, output_dir=str(tmp_path), checkpoint_every=1))
    try:
        summary = asyncio.run(asyncio.wait_for(run.train(stop), 60))
    finally:
        run.close()
    assert summary["steps_this_run"] == 0
    assert summary["stopped"] == {"signal": "SIGINT", "signum": signal.SIGINT, "checkpoint": None}
    assert not (tmp_path / "checkpoint.pt").exists()


def test_a_stop_while_the_learner_waits_for_a_batch_ends_the_wait(tmp_path):
    """Sync mode: the next batch is generated after the step, and the env's latency makes that take >= 1 s.
    A stop requested 0.2 s after step 0 ends that wait (the run does not train step 1) and saves step 1."""
    cfg = _cfg(steps=4, mode="sync", output_dir=str(tmp_path))
    cfg.env = EnvSpec(kwargs={"max_turns": 2, "latency_s": 0.5})
    run = LocalRun(cfg)
    stop = StopRequest()

    class StopAfterFirstStep:
        def __init__(self, inner):
            self.inner = inner

        def write(self, step, metrics):
            self.inner.write(step, metrics)
            if step == 0:  # while the learner waits for the next batch (not between two steps)
                asyncio.get_running_loop().call_later(0.2, stop.request, signal.SIGTERM)

        def close(self):
            self.inner.close()

    run.writer = StopAfterFirstStep(run.writer)
    try:
        summary = asyncio.run(asyncio.wait_for(run.train(stop), 60))
    finally:
        run.close()
    assert summary["stopped"]["signal"] == "SIGTERM"
    assert summary["steps"] == summary["steps_this_run"] == 1
    payload = load_checkpoint(tmp_path / "checkpoint.pt", restore_rng=False)
    assert payload["runtime"]["steps_done"] == 1 == len(_rows(tmp_path))
    assert summary["stopped"]["checkpoint"] == str(tmp_path / "checkpoint.pt")


SIGNALS = textwrap.dedent(
    """
    import importlib.util, os, signal, sys, time
    spec = importlib.util.spec_from_file_location("stop", {path!r})  # stdlib only: no torch to import
    stop_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stop_module)
    StopRequest, StopSignals = stop_module.StopRequest, stop_module.StopSignals
    stop = StopRequest()
    with StopSignals(stop):
        os.kill(os.getpid(), signal.SIG{first})
        time.sleep(0.2)
        print("requested", stop.requested, stop.signum, flush=True)
        try:
            os.kill(os.getpid(), signal.SIG{second})
            time.sleep(2)
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
            sys.exit(7)
    print("not aborted", flush=True)
    """
)


def test_the_first_signal_requests_a_stop_and_a_second_aborts_at_once():
    def run(first, second):
        code = SIGNALS.format(first=first, second=second, path=stop_module.__file__)
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    term = run("TERM", "TERM")
    assert term.stdout.splitlines() == [f"requested True {int(signal.SIGTERM)}"]
    assert term.returncode == -signal.SIGTERM  # the default action: ended by the signal, nothing after it
    assert "SIGTERM received: stopping at the next learner-step boundary" in term.stderr
    interrupt = run("TERM", "INT")
    assert interrupt.stdout.splitlines() == [f"requested True {int(signal.SIGTERM)}", "KeyboardInterrupt"]
    assert interrupt.returncode == 7


def test_claim_takes_the_handlers_back_from_a_library_that_replaced_them():
    """ray.init installs a SIGTERM handler of its own that exits at once (`rz train` with runtime: ray then
    died by SIGABRT without saving); `rz train` claims the handlers back after building the run."""
    before = signal.getsignal(signal.SIGTERM)
    stop = StopRequest()
    with StopSignals(stop) as signals:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stands for ray.init's handler
        signals.claim()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # (the handler runs in this thread between two bytecodes)
        assert stop.requested and stop.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before
