"""The learner in a child process trains exactly like the in-process learner (same bits, same metrics)."""

import asyncio

import torch

from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import LearnerSpec, LocalRun, RolloutSpec, TrainConfig
from rz_agents.trainer.optim import OptimConfig


def _run(learner_process: bool):
    cfg = TrainConfig(
        mode="sync",
        steps=3,
        num_threads=1,
        learner_process=learner_process,
        rollout=RolloutSpec(
            group_size=2, groups_per_batch=2, limits=EpisodeLimits(2, 6, 200), max_concurrent_episodes=8
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2), assert_lag0_exact=True),
    )
    run = LocalRun(cfg)
    try:
        asyncio.run(run.train())
        weights = {k: v.clone() for k, v in run.engine.model.state_dict().items()}  # what was published
        return run.history, weights, run.learner.version
    finally:
        run.close()


def test_learner_process_matches_in_process_learner_bitwise():
    h_thread, w_thread, v_thread = _run(False)
    h_proc, w_proc, v_proc = _run(True)
    assert v_thread == v_proc == 3
    assert [m["reward_mean"] for m in h_thread] == [m["reward_mean"] for m in h_proc]
    assert [m["loss"] for m in h_thread] == [m["loss"] for m in h_proc]
    assert all(m["lag0_abs_dlogp_max"] == 0.0 for m in h_proc)
    for k, v in w_thread.items():
        assert torch.equal(v, w_proc[k]), k


def test_pinned_learner_and_rollouts_run_on_their_cpus_and_the_pinning_is_undone():
    import os

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        import pytest

        pytest.skip("needs 2 CPUs")
    cfg = TrainConfig(
        mode="async",
        steps=2,
        num_threads=1,
        learner_process=True,
        learner_cpus=cpus[-1:],
        rollout_cpus=cpus[:-1],
        rollout=RolloutSpec(
            group_size=2, groups_per_batch=2, limits=EpisodeLimits(2, 6, 200), max_concurrent_episodes=8
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2)),
    )
    run = LocalRun(cfg)
    try:
        seen = {}

        s = asyncio.run(run.train())
        # train() pinned this thread (and what it started) at its start; close() undoes it
        seen["rollout"] = os.sched_getaffinity(0)
        seen["learner"] = os.sched_getaffinity(run.learner._proc.pid)  # alive until close()
    finally:
        run.close()
    assert s["steps"] == 2
    assert seen["rollout"] == set(cpus[:-1]) and seen["learner"] == set(cpus[-1:])
    assert os.sched_getaffinity(0) == set(cpus)


def test_pinning_without_a_learner_process_is_refused():
    import pytest

    with pytest.raises(ValueError, match="learner_process"):
        TrainConfig(learner_cpus=[0]).validate()
