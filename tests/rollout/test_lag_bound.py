"""The run's one lag object: hard, admission and train bounds, the governor inside it."""

from rz_agents.rollout.lag_bound import LagBound
from rz_agents.rollout.lag_governor import BOUND_KEY
from rz_agents.rollout.lag_policy import LagPolicy


def _policy(**kw) -> LagPolicy:
    args = dict(
        mode="async", estimator="reinforce_zero", max_lag=8, fixed_lag=None, max_ahead_batches=None,
        lag_governor=False, lag_governor_target_ess=0.5,
    )  # fmt: skip
    args.update(kw)
    return LagPolicy.decide(**args)


def test_without_a_governor_every_bound_is_the_hard_one():
    lag = LagBound(_policy())
    assert (lag.hard, lag.admission, lag.train, lag.ahead_batches()) == (8, 8, 8, 9)
    metrics = {"is_weight_ess_fraction": 0.01}
    lag.observe(metrics)
    assert BOUND_KEY not in metrics and lag.admission == 8


def test_the_governor_moves_admission_and_pacing_decides_the_train_bound():
    paced, dropping = LagBound(_policy(lag_governor=True)), LagBound(_policy(lag_governor=True), "drop")
    for lag in (paced, dropping):
        metrics = {"is_weight_ess_fraction": 0.1, "kl_k3_behavior_to_learner": 0.0}
        lag.observe(metrics)  # ESS/n below the target: the admission bound halves
        assert metrics[BOUND_KEY] == 4 and lag.admission == 4 and lag.ahead_batches() == 5
    assert paced.train == 8 and dropping.train == 4  # paced groups are trained within the hard bound


def test_resume_continues_the_governor_from_the_logged_history():
    lag = LagBound(_policy(lag_governor=True))
    lag.resume([{BOUND_KEY: 2, "is_weight_ess_fraction": 0.9, "kl_k3_behavior_to_learner": 0.0}])
    assert lag.admission == 2


def test_sync_and_fixed_lag_runs_are_never_paced():
    assert not LagBound(_policy(mode="sync")).paced
    fixed = LagBound(_policy(fixed_lag=3))
    assert not fixed.paced and fixed.fixed_lag == 3 and fixed.ahead_batches() == 1
