"""The lag policy is decided once from mode, estimator and the rollout's lag fields, and answers every
question the controller, learner and loop ask of it (bound, admission window, fixed lag, governor)."""

import pytest

from rz_agents.rollout.lag_policy import LagPolicy


def _decide(mode="async", estimator="reinforce_zero", **kw):
    fields = dict(
        max_lag=8, fixed_lag=None, max_ahead_batches=None, lag_governor=False, lag_governor_target_ess=0.5
    )
    fields.update(kw)
    return LagPolicy.decide(mode=mode, estimator=estimator, **fields)


def test_sync_mode_and_the_on_policy_estimator_train_only_lag0_tokens_whatever_max_lag_says():
    for lag in (
        _decide(mode="sync"),
        _decide(estimator="on_policy"),
        _decide(mode="sync", lag_governor=True),
    ):
        assert (lag.kind, lag.bound, lag.ahead_batches(), lag.fixed_lag, lag.governor) == (
            "sync",
            0,
            1,
            None,
            False,
        )


def test_a_bounded_run_admits_bound_plus_one_batches_fewer_with_max_ahead_or_the_governor():
    lag = _decide()
    assert (lag.kind, lag.bound, lag.ahead_batches(), lag.fixed_lag) == ("bounded", 8, 9, None)
    assert lag.ahead_batches(admission_lag=2) == 3  # the governor's moving bound
    assert _decide(max_ahead_batches=2).ahead_batches() == 2
    assert _decide(max_ahead_batches=2).ahead_batches(admission_lag=0) == 1


def test_a_fixed_lag_run_generates_one_batch_at_a_time_and_publishes_k_versions_behind():
    lag = _decide(fixed_lag=3)
    assert (lag.kind, lag.bound, lag.fixed_lag, lag.ahead_batches(), lag.ahead_batches(7)) == (
        "fixed",
        3,
        3,
        1,
        1,
    )


def test_the_governor_starts_at_the_bound_and_continues_a_resumed_history():
    lag = _decide(lag_governor=True, lag_governor_target_ess=0.4)
    assert _decide().governor_for([]) is None
    fresh = lag.governor_for([])
    assert (fresh.bound, fresh.max_lag, fresh.target, fresh.max_kl) == (8, 8, 0.4, 0.1)
    assert _decide(lag_governor=True, lag_governor_max_kl=0.2).governor_for([]).max_kl == 0.2
    assert lag.governor_for([{"rollout_admission_lag": 2, "is_weight_ess_fraction": 0.9}]).bound == 2
    assert _decide(max_lag=0, lag_governor=True).governor is False  # nothing to govern


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(max_lag=-1), "rollout.max_lag must be >= 0"),
        (dict(max_ahead_batches=0), "rollout.max_ahead_batches must be >= 1"),
        (dict(lag_governor_target_ess=1.0), "rollout.lag_governor_target_ess must be in (0, 1)"),
        (dict(lag_governor_max_kl=-1.0), "rollout.lag_governor_max_kl must be > 0"),
        (dict(fixed_lag=2, lag_governor=True), "rollout.lag_governor moves the lag bound"),
        (dict(fixed_lag=9), "rollout.fixed_lag (9) exceeds rollout.max_lag (8)"),
        (dict(fixed_lag=2, max_ahead_batches=2), "rollout.max_ahead_batches must be 1 or unset"),
        (dict(fixed_lag=2, mode="sync"), "rollout.fixed_lag (2) needs mode: async"),
        (dict(fixed_lag=2, estimator="on_policy"), "rollout.fixed_lag (2) needs mode: async"),
    ],
)
def test_contradictions_are_one_line_naming_the_field(kw, message):
    with pytest.raises(ValueError) as info:
        _decide(**kw)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_policy_built_by_hand_cannot_contradict_itself():
    with pytest.raises(ValueError, match="0 when sync"):
        LagPolicy("sync", 4)
    with pytest.raises(ValueError, match="governor"):
        LagPolicy("fixed", 2, governor=True)
