"""The lag governor: the admission bound halves when ESS/n falls below the target or KL k3 rises above
max_kl, grows back by one version a step up to max_lag when both recover, and a real async run logs the bound
it admitted under at every step and trains nothing older than it."""

import json
from itertools import pairwise

import pytest

from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.rollout.lag_governor import LagGovernor
from rz_agents.runtime import EnvSpec, LearnerSpec, RolloutSpec, TrainConfig, run_training
from rz_agents.trainer.optim import OptimConfig


def test_bound_halves_below_the_target_and_grows_back_up_to_max_lag():
    gov = LagGovernor(max_lag=64, target_ess=0.5, window=1)
    assert gov.bound == 64
    assert [gov.update(0.2) for _ in range(7)] == [32, 16, 8, 4, 2, 1, 1]  # never below min_lag 1
    assert gov.update(0.6) == 1  # between the target and the recovery level (0.75): kept
    grown = [gov.update(0.9) for _ in range(70)]  # additive: one version a healthy step, up to max_lag
    assert grown[:6] == [2, 3, 4, 5, 6, 7] and grown[62] == 64 and max(grown) == 64
    assert gov.update(None) == 64 and gov.update(float("nan")) == 64  # no stale tokens: bound kept


def test_a_kl_above_max_kl_halves_the_bound_even_while_the_ess_looks_healthy():
    gov = LagGovernor(max_lag=64, target_ess=0.5, max_kl=0.1, window=1)
    assert gov.update(0.95, 0.25) == 32  # ESS/n fine, KL k3 over 0.1: halve
    assert gov.update(0.95, 0.08) == 32  # KL between max_kl / 2 and max_kl: kept
    assert gov.update(0.95, 0.03) == 33  # both healthy: grow by one
    assert gov.update(0.95, None) == 34 and gov.update(0.95, float("nan")) == 35  # no KL logged: read as 0
    with pytest.raises(ValueError, match="lag_governor_max_kl"):
        LagGovernor(max_lag=8, max_kl=0.0)


def test_one_bad_step_does_not_halve_the_bound_under_the_median_window():
    gov = LagGovernor(max_lag=16, target_ess=0.5, window=3)
    assert [gov.update(e) for e in (1.0, 0.01, 1.0)] == [16, 16, 16]
    assert [gov.update(e) for e in (0.1, 0.1)] == [8, 4]  # two bad steps of three: the median is bad


def test_resumed_governor_continues_from_the_logged_bound():
    history = [{"is_weight_ess_fraction": 0.1, "rollout_admission_lag": 4}]
    gov = LagGovernor.resumed(history, max_lag=64, window=1)
    assert gov.bound == 4 and gov.update(0.1) == 2
    kl_history = [
        {"is_weight_ess_fraction": 0.9, "kl_k3_behavior_to_learner": 0.3, "rollout_admission_lag": 8}
    ]
    assert LagGovernor.resumed(kl_history, max_lag=64, window=3).update(0.9, 0.3) == 4  # the KL window too


def test_bad_governor_config_is_refused():
    with pytest.raises(ValueError, match="lag_governor_target_ess"):
        LagGovernor(max_lag=8, target_ess=1.5)
    spec = RolloutSpec(max_lag=8, fixed_lag=4, lag_governor=True, limits=TrainConfig().rollout.limits)
    with pytest.raises(ValueError, match="rollout.lag_governor"):  # the run's plan decides the lag policy
        TrainConfig(rollout=spec).validate()


def _governed_run(tmp_path, steps: int, stale_groups: str):
    # target_ess 0.999: every stale batch reads below it, so the bound falls from 8 to 1 and stays there.
    cfg = TrainConfig(
        mode="async",
        steps=steps,
        num_threads=1,
        learner_step_delay_s=0.2,  # a slow learner: ungoverned, the rollouts would run 9 batches ahead
        output_dir=str(tmp_path),
        tensorboard=False,
        env=EnvSpec(kwargs={"max_turns": 2, "latency_s": 0.0}),
        rollout=RolloutSpec(
            group_size=2,
            groups_per_batch=2,
            max_concurrent_episodes=16,
            max_lag=8,
            lag_governor=True,
            lag_governor_target_ess=0.999,
            stale_groups=stale_groups,
            limits=EpisodeLimits(max_turns=2, max_tokens_per_turn=6, max_episode_tokens=200),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=3e-2)),
    )
    s = run_training(cfg)
    return s, [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_async_run_logs_the_governed_bound_and_admits_under_it(tmp_path):
    steps = 10
    s, rows = _governed_run(tmp_path, steps, "drop")
    bounds = [r["rollout_admission_lag"] for r in rows]
    assert len(bounds) == steps and bounds[-1] == 1 and all(1 <= b <= 8 for b in bounds)
    assert s["max_lag_seen"] <= 8
    # Once the bound is 1, admission keeps the pipeline 2 batches deep: far fewer groups than 8 + 1 ahead.
    assert s["rollout"]["groups_started"] < (steps + 8 + 1) * 2
    # And the bound holds for what is trained, not only for what is admitted from then on: each step's batch
    # is within the bound in force when it was taken (the one the step before set), and the groups admitted
    # under the larger bound that went over it were dropped, not trained.
    assert all(now["lag_max"] <= before["rollout_admission_lag"] for before, now in pairwise(rows))
    assert s["rollout"]["groups_dropped_stale"] > 0


def test_pacing_trains_the_groups_dropping_would_drop_and_keeps_every_token_within_max_lag(tmp_path):
    """stale_groups: pace (the default): the same governed run drops no group as stale; the groups admitted
    under the larger bound are trained (lag above the governor's bound, never above max_lag), and admission
    still follows the governor's bound."""
    steps = 10
    s, rows = _governed_run(tmp_path, steps, "pace")
    assert [r["rollout_admission_lag"] for r in rows][-1] == 1
    assert s["rollout"]["groups_dropped_stale"] == 0
    assert all(r["lag_max"] <= 8 and r["lag_oldest_max"] <= 8 for r in rows)  # the hard bound holds
    assert any(now["lag_max"] > before["rollout_admission_lag"] for before, now in pairwise(rows))
    assert s["rollout"]["groups_started"] < (steps + 8 + 1) * 2
    assert rows[-1]["episode_tokens_mean_trained"] > 0 and rows[-1]["episode_tokens_mean_finished"] > 0
