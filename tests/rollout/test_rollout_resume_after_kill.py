"""A run stopped at any moment resumes from its last checkpoint and finishes (issue 17): the checkpoint is a
consistent cut (every started group trained, queued or relaunched, checked at save and load), a state that
would make the learner wait forever is an error naming the counts, and a stalled run loop is an error with
a stack dump. Each resume here waits under a timeout: before the fix they hung."""

import asyncio
import json

import gymnasium
import pytest
import torch

from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.rollout.checkpoint_cut import InconsistentCheckpoint, check_consistent_cut
from rz_agents.rollout.controller import RolloutDeadlock
from rz_agents.runtime import EnvSpec, LearnerSpec, LocalRun, RolloutSpec, TrainConfig
from rz_agents.runtime.synthetic_env import LowercaseLettersEnv
from rz_agents.runtime.watchdog import RunStalled
from rz_agents.trainer.checkpoint import load_checkpoint, save_checkpoint
from rz_agents.trainer.optim import OptimConfig
from tests.trainer.learner_state import whole_state

RESUME_TIMEOUT_S = 90  # a resume that hangs fails here instead of blocking the suite


def _cfg(steps, mode="async", ahead=2, **kw):
    return TrainConfig(
        mode=mode,
        steps=steps,
        num_threads=1,
        env=EnvSpec(kwargs={"max_turns": 2}),
        rollout=RolloutSpec(
            group_size=2,
            groups_per_batch=2,
            max_concurrent_episodes=8,
            max_lag=8,
            max_ahead_batches=ahead,
            limits=EpisodeLimits(max_turns=2, max_tokens_per_turn=6, max_episode_tokens=200),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2), assert_lag0_exact=True),
        **kw,
    )


class _Killed(Exception):
    """Stands for SIGKILL: the run stops between two writes, nothing is cleaned up or saved."""


class _KilledAfterRow:
    """A metrics writer that lets the run die right after writing the row of step ``step``."""

    def __init__(self, inner, step: int) -> None:
        self.inner, self.step = inner, step

    def write(self, step, metrics):
        self.inner.write(step, metrics)
        if step == self.step:
            raise _Killed

    def close(self):
        self.inner.close()


def _attempt(cfg, die_after_step=None):
    """One launch of the run; with ``die_after_step`` it stops there without its final checkpoint."""
    run = LocalRun(cfg)
    if die_after_step is not None:
        run.writer = _KilledAfterRow(run.writer, die_after_step)
    try:

        async def go():
            return await asyncio.wait_for(run.train(), RESUME_TIMEOUT_S)

        try:
            return asyncio.run(go()), {k: v.clone() for k, v in run.learner.weights().items()}
        except _Killed:
            return None, None
    finally:
        run.close()


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _assert_finished_once_each(run_dir, steps):
    """Every step logged once, no group trained twice, and the final checkpoint a consistent cut."""
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(steps))
    trained = [i for r in rows for i in r["group_indices"]]
    assert len(trained) == len(set(trained)) == 2 * steps
    payload = load_checkpoint(run_dir / "checkpoint.pt", restore_rng=False)
    history = payload["runtime"]["history"]
    assert [m["group_indices"] for m in history] == [r["group_indices"] for r in rows]
    check_consistent_cut(payload["runtime"]["controller"], steps, [m["group_indices"] for m in history])


def test_checkpoint_with_batches_queued_and_one_taken_ahead_resumes_to_completion(tmp_path):
    """The issue's situation: the learner has taken its next batch, more are queued; then the run dies."""
    ckpt = tmp_path / "checkpoint.pt"
    run = LocalRun(_cfg(steps=3, ahead=3, output_dir=str(tmp_path)))
    try:

        async def take_ahead_then_checkpoint():
            producer = asyncio.ensure_future(run.controller.run())
            taken = await run.controller.next_batch(run.learner.version)  # taken, not trained
            while len(run.controller.queue) < 2:  # one more batch finished and queued
                await asyncio.sleep(0.01)
            run.checkpoint(ckpt)
            run.controller.stop()
            await producer
            return sorted({t.group_id for t in taken})

        taken = asyncio.run(take_ahead_then_checkpoint())
    finally:
        run.close()
    state = load_checkpoint(ckpt, restore_rng=False)["runtime"]["controller"]
    assert state["steps_done"] == 0 and state["counters"]["groups_trained"] == 0
    # the taken batch is saved, in front (its groups in the order they finished)
    assert sorted(g["index"] for g in state["queued"][:2]) == taken
    started, in_flight = state["counters"]["groups_started"], len(state["in_flight"])
    assert started == len(state["queued"]) + in_flight >= 4

    summary, _ = _attempt(_cfg(steps=3, ahead=3, output_dir=str(tmp_path), resume_from=str(ckpt)))
    assert summary["steps"] == 3 and summary["version"] == 3
    assert _rows(tmp_path)[0]["group_indices"] == taken  # the taken batch is the first one trained
    _assert_finished_once_each(tmp_path, 3)


def test_a_run_killed_after_each_of_two_checkpoints_resumes_and_finishes(tmp_path):
    """Kill, resume, kill again, resume (the issue's sequence, ahead 2 like the demo): no hang, every step
    once in metrics.jsonl although the killed launches wrote rows past their last checkpoint."""
    cfg = _cfg(steps=7, output_dir=str(tmp_path), checkpoint_every=2)
    assert _attempt(cfg, die_after_step=2) == (None, None)  # checkpoint of 2 steps, 3 rows written
    assert len(_rows(tmp_path)) == 3
    resume = _cfg(
        steps=7, output_dir=str(tmp_path), checkpoint_every=2, resume_from=str(tmp_path / "checkpoint.pt")
    )
    assert _attempt(resume, die_after_step=4) == (None, None)  # checkpoint of 4 steps, 5 rows
    summary, _ = _attempt(resume)
    assert summary["steps"] == 7 and summary["steps_this_run"] == 3 and summary["version"] == 7
    _assert_finished_once_each(tmp_path, 7)


def test_sync_run_resumed_from_a_mid_run_checkpoint_is_bitwise_the_uninterrupted_run(tmp_path):
    """Sync mode admits one batch at a time: a mid-run checkpoint used to admit nothing on resume. The
    resumed launch runs its learner in a child process (learner_process: true), which loads the state
    and writes the final checkpoint (checked below)."""
    full, w_full = _attempt(_cfg(steps=4, mode="sync"))
    out = str(tmp_path)
    _attempt(_cfg(steps=4, mode="sync", output_dir=out, checkpoint_every=2), die_after_step=2)
    resumed, w_res = _attempt(
        _cfg(steps=4, mode="sync", output_dir=out, resume_from=out + "/checkpoint.pt", learner_process=True)
    )
    assert resumed["steps_this_run"] == 2 and resumed["version"] == 4
    assert resumed["reward_mean_per_step"] == full["reward_mean_per_step"]
    for k, v in w_full.items():
        assert torch.equal(v, w_res[k]), k
    _assert_finished_once_each(tmp_path, 4)


def _v1(state, history):
    """The controller state as the previous format wrote it after two resumes (the issue's checkpoint):
    steps_done two behind the history, no groups_trained, no dropped indices."""
    state = dict(state, counters=dict(state["counters"]), steps_done=len(history) - 2)
    for key in ("format", "dropped_groups"):
        state.pop(key)
    del state["counters"]["groups_trained"]
    return state


def test_a_checkpoint_of_the_old_format_that_hung_is_corrected_and_finishes(tmp_path):
    cfg = _cfg(steps=4, output_dir=str(tmp_path / "a"), checkpoint_every=4)
    _attempt(cfg)
    payload = load_checkpoint(tmp_path / "a" / "checkpoint.pt", restore_rng=False)
    runtime = payload["runtime"]
    history = [{k: v for k, v in m.items() if k != "group_indices"} for m in runtime["history"]]
    runtime = dict(runtime, controller=_v1(runtime["controller"], history), history=history)
    old = save_checkpoint(tmp_path / "old.pt", payload["learner"], runtime)
    out = tmp_path / "b"
    summary, _ = _attempt(_cfg(steps=6, resume_from=str(old), output_dir=str(out), checkpoint_every=1))
    assert summary["steps"] == 6 and summary["steps_this_run"] == 2
    # Its checkpoints are of the current format (dropped group indices unknown, counts still checked).
    state = load_checkpoint(out / "checkpoint.pt", restore_rng=False)["runtime"]["controller"]
    assert state["format"] == 2 and state["dropped_groups"] is None and state["steps_done"] == 6


def test_an_inconsistent_checkpoint_is_a_clear_error_naming_the_counts(tmp_path):
    state = {
        "format": 2,
        "tasks": {"position": 10},
        "steps_done": 3,
        "counters": {
            "groups_started": 10,
            "groups_trained": 6,
            "groups_dropped_failed": 0,
            "groups_dropped_stale": 0,
        },
        "queued": [{"index": 7, "trajectories": []}],
        "in_flight": [(9, None)],
        "dropped_groups": [],
    }
    msg = r"groups_started 10 != trained 6 \+ queued 1 \+ in flight 1 \+ dropped 0 failed \+ 0 stale \(= 8\)"
    with pytest.raises(InconsistentCheckpoint, match=msg):
        check_consistent_cut(state, steps=3)
    with pytest.raises(InconsistentCheckpoint, match="steps_done 3 != 4 learner steps in the history"):
        check_consistent_cut(dict(state, queued=state["queued"] * 3), steps=4)
    trained = [[0, 1], [2, 3], [4, 7]]  # 7 is also queued, 5, 6 and 8 are nowhere
    state_ok = dict(
        state,
        queued=[
            {"index": 7, "trajectories": []},
            {"index": 8, "trajectories": []},
            {"index": 5, "trajectories": []},
        ],
    )
    with pytest.raises(
        InconsistentCheckpoint, match=r"1 group indices are in more than one place: 7 \(queued \+ trained\)"
    ):
        check_consistent_cut(state_ok, steps=3, trained_groups=trained)
    check_consistent_cut(state_ok, steps=3, trained_groups=[[0, 1], [2, 3], [4, 6]])

    # At load, before anything runs: the run refuses the checkpoint with the same message.
    _attempt(_cfg(steps=2, output_dir=str(tmp_path), checkpoint_every=2))
    payload = load_checkpoint(tmp_path / "checkpoint.pt", restore_rng=False)
    payload["runtime"]["controller"]["counters"]["groups_started"] += 2
    bad = save_checkpoint(tmp_path / "bad.pt", payload["learner"], payload["runtime"])
    with pytest.raises(InconsistentCheckpoint, match=r"groups_started \d+ != trained 4 \+"):
        LocalRun(_cfg(steps=3, resume_from=str(bad)))


def test_a_learner_waiting_for_groups_admission_will_never_start_is_an_error_not_a_hang():
    run = LocalRun(_cfg(steps=2))
    # Two phantom groups counted as started but nowhere (what the old checkpoints did): admission is full.
    run.controller.counters["groups_started"] += 4
    run.controller.tasks.position += 4
    try:
        with pytest.raises(
            RolloutDeadlock, match=r"waits for 2 groups but none can come: 0 queued, 0 in flight"
        ):
            asyncio.run(asyncio.wait_for(run.train(), 30))
    finally:
        run.close()


class StuckLettersEnv(LowercaseLettersEnv):
    """An env whose tool call never returns in time (a hung sandbox)."""

    def _step(self, text):
        import time

        time.sleep(3)
        return super()._step(text)


gymnasium.register(id="rz_tests/StuckLetters-v0", entry_point=StuckLettersEnv)


def test_a_stalled_run_loop_is_an_error_with_a_stack_dump(tmp_path):
    cfg = _cfg(steps=2, output_dir=str(tmp_path), watchdog_s=0.6)
    cfg.env = EnvSpec(id="rz_tests/StuckLetters-v0", kwargs={"max_turns": 2})
    run = LocalRun(cfg)
    try:
        with pytest.raises(RunStalled, match=r"no progress for \d+ s .*learner steps 0/2.*stall_stacks.txt"):
            asyncio.run(asyncio.wait_for(run.train(), 30))
    finally:
        run.close()
    dump = (tmp_path / "stall_stacks.txt").read_text()
    assert "in next_batch" in dump and "in take" in dump  # where the learner waits (asyncio tasks)
    assert "in _step" in dump and "rz-env" in dump  # where the env thread is stuck


def test_a_killed_run_leaves_no_repeated_rows_in_metrics_jsonl(tmp_path):
    from rz_agents.trainer.metrics_log import MetricsWriter

    w = MetricsWriter(tmp_path, tensorboard=False)
    for s in range(4):
        w.write(s, {"x": float(s)})
    w.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "x": ')  # torn by the kill
    w = MetricsWriter(tmp_path, tensorboard=False, start_step=2)  # the checkpoint holds 2 steps
    w.write(2, {"x": 20.0})
    w.close()
    assert [(r["step"], r["x"]) for r in _rows(tmp_path)] == [(0, 0.0), (1, 1.0), (2, 20.0)]


def test_a_checkpoint_of_the_format_before_learner_folders_resumes_bitwise(tmp_path):
    """Format 1: the whole learner state inside checkpoint.pt (one torch.save), no learner folder beside it.
    A run resumed from it is bitwise the uninterrupted run, and its own checkpoints have the folder."""
    full, w_full = _attempt(_cfg(steps=4, mode="sync"))
    new = tmp_path / "new"
    _attempt(_cfg(steps=4, mode="sync", output_dir=str(new), checkpoint_every=2), die_after_step=2)
    payload = load_checkpoint(new / "checkpoint.pt", restore_rng=False)
    assert payload["learner_folder"] is not None
    loaded = LocalRun(_cfg(steps=4, mode="sync", resume_from=str(new / "checkpoint.pt")))
    try:
        whole = whole_state(loaded.learner)  # the learner state as format 1 held it
    finally:
        loaded.close()
    old = tmp_path / "old"
    old.mkdir()
    torch.save(
        {"format_version": 1, "learner": whole, "runtime": payload["runtime"], "rng": payload["rng"]},
        old / "checkpoint.pt",
    )
    assert load_checkpoint(old / "checkpoint.pt", restore_rng=False)["learner_folder"] is None
    out = tmp_path / "resumed"
    resumed, w_res = _attempt(
        _cfg(steps=4, mode="sync", output_dir=str(out), resume_from=str(old / "checkpoint.pt"))
    )
    assert resumed["steps_this_run"] == 2 and resumed["reward_mean_per_step"] == full["reward_mean_per_step"]
    for k, v in w_full.items():
        assert torch.equal(v, w_res[k]), k
    assert load_checkpoint(out / "checkpoint.pt", restore_rng=False)["learner_folder"].parent == out
