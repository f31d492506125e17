"""The run schema: one source of truth for the fields the learner and the rollouts share."""

import pytest

from rz_agents.cli.train import RunConfig
from rz_agents.config_io import ConfigError, load_config
from rz_agents.rollout.lag_policy import LagPolicy
from rz_agents.runtime import LocalRun, resolve
from rz_agents.sampling import SamplingSpec

TINY = (
    "num_threads: 1\nengine: {max_running: 4, max_len: 256}\n"
    "rollout: {group_size: 2, groups_per_batch: 1, max_concurrent_episodes: 2, temperature: 0.7, top_p: 0.9,"
    " max_lag: 8, limits: {max_turns: 1, max_tokens_per_turn: 4, max_episode_tokens: 100}}\n"
)


def _load(tmp_path, extra: str, overrides=()):
    path = tmp_path / "run.yaml"
    path.write_text(TINY + extra)
    return load_config(RunConfig, path, list(overrides))


@pytest.mark.parametrize(
    "extra, overrides, message",
    [
        (
            "learner: {temperature: 1.0}\n",
            (),
            "learner.temperature (1.0) conflicts with rollout.temperature (0.7): ",
        ),
        ("learner: {top_p: 1.0}\n", (), "learner.top_p (1.0) conflicts with rollout.top_p (0.9): "),
        ("learner: {top_k: 5}\n", (), "learner.top_k (5) conflicts with rollout.top_k (0): "),
        ("learner: {max_lag: 64}\n", (), "learner.max_lag (64) conflicts with rollout.max_lag (8): "),
        ("learner: {max_lag: 8}\n", ("mode=sync",), "learner.max_lag (8) conflicts with mode ('sync'): "),
        ("seed: 3\n", ("rollout.seed=4",), "rollout.seed (4) conflicts with seed (3): "),
        ("", ("engine.num_threads=2",), "engine.num_threads (2) conflicts with num_threads (1): "),
        ("", ("learner.loss.estimator=standard_is",), "learner.loss.estimator: standard_is is gone: "),
        ("", ("rollout.fixed_lag=2", "mode=sync"), "rollout.fixed_lag (2) needs mode: async"),
    ],
)
def test_a_field_written_against_the_one_it_follows_is_one_error_line_naming_both(
    tmp_path, extra, overrides, message
):
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, extra, overrides)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_each_derived_setting_is_decided_once_and_agreeing_values_are_accepted(tmp_path):
    plan = resolve(_load(tmp_path, "learner: {temperature: 0.7, max_lag: 8}\nseed: 5\n"))
    assert plan.sampling == SamplingSpec(temperature=0.7, top_k=0, top_p=0.9)
    assert plan.lag == LagPolicy("bounded", 8) and plan.rollout.seed == 5
    assert plan.kernels == "aligned" and plan.num_threads == plan.engine.num_threads == 1
    assert plan.max_turns == plan.rollout.limits.max_turns == 1
    sync = resolve(_load(tmp_path, "", ["mode=sync"]))  # a mode switch needs no edit of the bound
    assert (sync.lag.kind, sync.lag.bound, sync.lag.ahead_batches()) == ("sync", 0, 1)
    fixed = resolve(_load(tmp_path, "", ["rollout.fixed_lag=3"]))
    assert (fixed.lag.kind, fixed.lag.bound, fixed.lag.fixed_lag, fixed.lag.ahead_batches()) == (
        "fixed",
        3,
        3,
        1,
    )
    standard = resolve(_load(tmp_path, "", ["model.kernels=standard"]))
    assert standard.kernels == "standard" and standard.lag == plan.lag  # kernels follow nothing else


def test_ray_threads_default_to_what_engines_and_learner_ranks_both_reserve(tmp_path):
    overrides = [
        "runtime=ray",
        "num_threads=null",
        "actors.cpus_per_engine=3",
        "actors.cpus_per_learner_rank=2",
    ]
    plan = resolve(_load(tmp_path, "", overrides))
    assert plan.num_threads == plan.engine.num_threads == 2


def test_the_local_runtime_hands_one_plan_to_rollout_and_learner(tmp_path):
    run = LocalRun(_load(tmp_path, ""))
    try:
        assert run.learner.sampling is run.controller.sampling is run.plan.sampling
        assert run.controller.sampling.temperature == 0.7 and run.controller.sampling.top_p == 0.9
        assert (
            run.learner.max_lag == run.controller.lag.hard == 8 and run.controller.lag.policy is run.plan.lag
        )
        assert run.engine.config.num_threads == 1
    finally:
        run.close()
