"""rollout.fixed_lag: every trained token comes from weights exactly k versions old (after the first k
steps, which use version 0), whatever the speed of the learner or the rollouts."""

import asyncio

import pytest
import torch

from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import EnvSpec, LearnerSpec, LocalRun, RolloutSpec, TrainConfig
from rz_agents.trainer.loss import LossConfig
from rz_agents.trainer.optim import OptimConfig


def _cfg(fixed_lag, steps=6, learner_delay=0.0, env_latency=0.0, **rollout):
    return TrainConfig(
        mode="async",
        steps=steps,
        seed=3,
        num_threads=1,
        learner_step_delay_s=learner_delay,
        env=EnvSpec(kwargs={"max_turns": 2, "latency_s": env_latency}),
        rollout=RolloutSpec(
            group_size=2,
            groups_per_batch=2,
            max_concurrent_episodes=8,
            max_lag=8,
            fixed_lag=fixed_lag,
            limits=EpisodeLimits(max_turns=2, max_tokens_per_turn=6, max_episode_tokens=200),
            **rollout,
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=3e-3)),
    )


def _run(cfg):
    run = LocalRun(cfg)
    try:
        asyncio.run(run.train())
        return run.history, {k: v.clone() for k, v in run.learner.weights().items()}
    finally:
        run.close()


def test_every_token_is_trained_exactly_fixed_lag_versions_after_it_was_sampled():
    history, _ = _run(_cfg(fixed_lag=3, steps=7))
    for step, m in enumerate(history):
        expected = min(step, 3)  # the first steps use version 0, what exists
        assert m["lag_min"] == m["lag_max"] == expected, (step, m["lag_min"], m["lag_max"])
        assert m["engine_version"] == max(step + 1 - 3, 0)  # published after the step
        # The lag histogram is a single bar: every sampled token sits in the bucket holding `expected`.
        bars = {k: v for k, v in m.items() if k.startswith("lag_hist_") and v > 0}
        assert len(bars) == 1 and sum(bars.values()) == m["num_sampled_tokens"]


def test_fixed_lag_runs_do_not_depend_on_the_speed_of_learner_or_rollouts():
    fast_hist, fast_w = _run(_cfg(fixed_lag=2, steps=5))
    slow_hist, slow_w = _run(_cfg(fixed_lag=2, steps=5, learner_delay=0.2, env_latency=0.02))
    assert [m["reward_mean"] for m in fast_hist] == [m["reward_mean"] for m in slow_hist]
    assert [m["loss"] for m in fast_hist] == [m["loss"] for m in slow_hist]
    for k, v in fast_w.items():
        assert torch.equal(v, slow_w[k]), k


def test_fixed_lag_zero_is_synchronous_training():
    history, _ = _run(_cfg(fixed_lag=0, steps=3))
    assert all(m["lag_max"] == 0 and m["lag0_abs_dlogp_max"] == 0.0 for m in history)


def test_fixed_lag_resume_keeps_the_lag(tmp_path):
    cfg = _cfg(fixed_lag=2, steps=3)
    cfg.output_dir = str(tmp_path)
    _run(cfg)
    resumed = _cfg(fixed_lag=2, steps=6)
    resumed.output_dir = str(tmp_path)
    resumed.resume_from = str(tmp_path / "checkpoint.pt")
    history, _ = _run(resumed)
    assert [m["lag_max"] for m in history[3:]] == [2, 2, 2]


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(fixed_lag=9), "rollout.fixed_lag (9) exceeds rollout.max_lag (8)"),
        (dict(fixed_lag=2, max_ahead_batches=2), "rollout.max_ahead_batches must be 1 or unset"),
        (dict(fixed_lag=-1), "rollout.fixed_lag must be >= 0"),
    ],
)
def test_inconsistent_fixed_lag_settings_are_one_clear_error(change, message):
    fixed = change.pop("fixed_lag")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _cfg(fixed, **change).validate()


def test_fixed_lag_needs_an_off_policy_async_run():
    cfg = _cfg(fixed_lag=2)
    cfg.learner = LearnerSpec(loss=LossConfig(estimator="on_policy"))
    with pytest.raises(ValueError, match="needs mode: async and an off-policy estimator"):
        cfg.validate()
