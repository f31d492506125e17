"""rollout.skip_uniform_groups / rollout.oversample: groups whose rewards are all equal are skipped by the
learner (counted per step) or, with oversample, dropped as they finish and replaced; the rollout accounting
(every started group trained, queued, in flight or dropped) still holds at every checkpoint, and a run
killed mid-way resumes to completion."""

import asyncio

import pytest

from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.rollout.checkpoint_cut import InconsistentCheckpoint, check_consistent_cut
from rz_agents.runtime import EnvSpec, LearnerSpec, LocalRun, RolloutSpec, TrainConfig, resolve
from rz_agents.trainer.checkpoint import load_checkpoint
from rz_agents.trainer.optim import OptimConfig
from tests.rollout.test_rollout_resume_after_kill import _attempt, _rows


def _cfg(steps, oversample=0, skip=True, **kw):
    # One byte per episode, reward 1 if it is a lowercase letter: most groups of 2 score 0 twice.
    return TrainConfig(
        mode="async",
        steps=steps,
        seed=1,
        num_threads=1,
        env=EnvSpec(kwargs={"max_turns": 1, "min_chars": 1}),
        rollout=RolloutSpec(
            group_size=2,
            groups_per_batch=2,
            max_concurrent_episodes=8,
            max_lag=8,
            max_ahead_batches=2,
            skip_uniform_groups=skip,
            oversample=oversample,
            limits=EpisodeLimits(max_turns=1, max_tokens_per_turn=1, max_episode_tokens=200),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2), assert_lag0_exact=True),
        **kw,
    )


def test_the_learner_follows_rollout_skip_uniform_groups_and_oversample_needs_it():
    assert resolve(_cfg(2)).learner.skip_uniform_groups is True
    assert resolve(_cfg(2, skip=False)).learner.skip_uniform_groups is False
    with pytest.raises(ValueError, match="rollout.oversample replaces uniform-reward groups"):
        _cfg(2, oversample=2, skip=False).validate()
    bad = _cfg(2, skip=False)
    bad.learner.skip_uniform_groups = True
    with pytest.raises(ValueError, match="learner.skip_uniform_groups"):
        resolve(bad)


def test_without_oversample_uniform_groups_are_trained_by_count_but_cost_no_forward():
    run = LocalRun(_cfg(4))
    try:
        asyncio.run(run.train())
    finally:
        run.close()
    skipped = [m["groups_skipped_uniform"] for m in run.history]
    assert sum(skipped) > 0  # the env makes them common
    assert run.controller.counters["groups_dropped_uniform"] == 0
    assert run.controller.counters["groups_trained"] == 8
    for m in run.history:
        assert m["groups_skipped_uniform"] == m["groups_uniform"]
        assert m["learner_tokens"] + m["tokens_skipped_uniform"] > 0


def test_oversampled_runs_replace_uniform_groups_and_resume_from_a_kill_to_a_consistent_end(tmp_path):
    out = str(tmp_path)
    _attempt(
        _cfg(6, oversample=2, output_dir=out, checkpoint_every=2), die_after_step=3
    )  # its last checkpoint: after 2 steps
    mid = load_checkpoint(tmp_path / "checkpoint.pt", restore_rng=False)
    state = mid["runtime"]["controller"]
    assert state["counters"]["groups_dropped_uniform"] > 0
    check_consistent_cut(state, 2, [m["group_indices"] for m in mid["runtime"]["history"]])
    summary, _ = _attempt(_cfg(6, oversample=2, output_dir=out, resume_from=out + "/checkpoint.pt"))
    assert summary["steps"] == 6 and summary["steps_this_run"] == 4
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == list(range(6))
    trained = [i for r in rows for i in r["group_indices"]]
    assert len(trained) == len(set(trained)) == 12
    final = load_checkpoint(tmp_path / "checkpoint.pt", restore_rng=False)
    c = final["runtime"]["controller"]["counters"]
    # never more replaced than the budget: oversample per learner step
    assert 0 < c["groups_dropped_uniform"] <= 2 * (6 + 1)
    dropped = set(final["runtime"]["controller"]["dropped_groups"])
    assert not dropped & set(trained)
    check_consistent_cut(final["runtime"]["controller"], 6, [r["group_indices"] for r in rows])
    # each step reports the cumulative count of replaced groups
    assert rows[-1]["rollout_groups_dropped_uniform"] == c["groups_dropped_uniform"]


def test_a_checkpoint_that_forgets_the_replaced_groups_is_inconsistent(tmp_path):
    out = str(tmp_path)
    _attempt(_cfg(3, oversample=2, output_dir=out))
    payload = load_checkpoint(tmp_path / "checkpoint.pt", restore_rng=False)
    state = payload["runtime"]["controller"]
    assert state["counters"]["groups_dropped_uniform"] > 0
    state["counters"]["groups_dropped_uniform"] = 0
    with pytest.raises(
        InconsistentCheckpoint, match=r"groups_started \d+ != trained 6 \+ .* dropped group indices"
    ):
        check_consistent_cut(state, 3)
