"""The lag bound: no trained token ever has lag > max_lag, whether the learner or the rollouts are slow."""

import pytest

from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import EnvSpec, LearnerSpec, RolloutSpec, TrainConfig, run_training
from rz_agents.trainer.optim import OptimConfig


def _cfg(max_lag, learner_delay, env_latency, steps=8, groups_per_batch=2):
    return TrainConfig(
        mode="async",
        steps=steps,
        num_threads=1,
        learner_step_delay_s=learner_delay,
        env=EnvSpec(kwargs={"max_turns": 2, "latency_s": env_latency}),
        rollout=RolloutSpec(
            group_size=2,
            groups_per_batch=groups_per_batch,
            max_concurrent_episodes=16,
            max_lag=max_lag,
            limits=EpisodeLimits(max_turns=2, max_tokens_per_turn=6, max_episode_tokens=200),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-3), assert_lag0_exact=True),
    )


@pytest.mark.parametrize("max_lag", [1, 3])
def test_slow_learner_fast_engine_never_trains_past_max_lag(max_lag):
    s = run_training(_cfg(max_lag, learner_delay=0.25, env_latency=0.0))
    assert s["steps"] == 8 and s["version"] == 8
    # The engine outruns the learner, so the bound is reached, and held.
    assert s["max_lag_seen"] == max_lag
    # Admission keeps the pipeline at most max_lag + 1 batches deep (plus groups replacing dropped ones).
    started = s["rollout"]["groups_started"]
    dropped = s["rollout"]["groups_dropped_stale"] + s["rollout"]["groups_dropped_failed"]
    assert started - dropped <= (8 + max_lag + 1) * 2


def test_fast_learner_slow_rollouts_never_trains_past_max_lag():
    s = run_training(_cfg(1, learner_delay=0.0, env_latency=0.05, steps=6, groups_per_batch=1))
    assert s["steps"] == 6
    assert s["max_lag_seen"] <= 1


def test_sync_mode_trains_only_lag_zero_tokens():
    cfg = _cfg(64, learner_delay=0.05, env_latency=0.0, steps=4)
    cfg.mode = "sync"
    s = run_training(cfg)
    assert s["max_lag_seen"] == 0 and s["rollout"]["groups_dropped_stale"] == 0
    assert s["rollout"]["groups_started"] == 4 * 2  # exactly one batch per version


def test_max_ahead_batches_limits_run_ahead_below_the_lag_bound():
    cfg = _cfg(64, learner_delay=0.25, env_latency=0.0, steps=6)
    cfg.rollout.max_ahead_batches = 2
    s = run_training(cfg)
    # At most two batches beyond the ones trained were ever started, so lag stays far below 64.
    assert s["rollout"]["groups_started"] <= (6 + 2) * 2
    assert s["max_lag_seen"] <= 2


def test_no_group_starts_past_the_runs_last_batch():
    # The engine outruns the learner (rollouts run ahead up to the bound) but never starts a group for a batch
    # past the run's last step: those rollouts would be cut at the end, CPU spent on nothing.
    s = run_training(_cfg(3, learner_delay=0.25, env_latency=0.0, steps=6))
    assert s["steps"] == 6 and s["max_lag_seen"] == 3  # it did run ahead
    started = s["rollout"]["groups_started"]
    dropped = s["rollout"]["groups_dropped_stale"] + s["rollout"]["groups_dropped_failed"]
    assert started - dropped == 6 * 2
