"""The run schema: one source of truth for the fields the learner and the rollouts share."""

import pytest

from rz_agents.cli.train import RunConfig
from rz_agents.config_io import ConfigError, load_config
from rz_agents.runtime import LocalRun, resolve

TINY = (
    "num_threads: 1\nengine: {num_slots: 4, max_len: 256}\n"
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
        (
            "model: {kernels: aligned}\n",
            ("learner.loss.estimator=standard_is",),
            "model.kernels ('aligned') conflicts with learner.loss.estimator ('standard_is'), ",
        ),
    ],
)
def test_a_field_written_against_the_one_it_follows_is_one_error_line_naming_both(
    tmp_path, extra, overrides, message
):
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, extra, overrides)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_derived_fields_follow_the_rollout_and_agreeing_values_are_accepted(tmp_path):
    cfg = resolve(_load(tmp_path, "learner: {temperature: 0.7, max_lag: 8}\nseed: 5\n"))
    assert (cfg.learner.temperature, cfg.learner.top_p, cfg.learner.top_k) == (0.7, 0.9, 0)
    assert (cfg.learner.max_lag, cfg.rollout.max_lag, cfg.rollout.seed) == (8, 8, 5)
    assert cfg.model.kernels == "aligned" and resolve(cfg) == cfg  # resolving twice changes nothing
    sync = resolve(_load(tmp_path, "", ["mode=sync"]))  # a mode switch needs no edit of the bound
    assert sync.learner.max_lag == sync.rollout.max_lag == 0
    standard = resolve(_load(tmp_path, "", ["learner.loss.estimator=standard_is"]))
    assert standard.model.kernels == "standard"


def test_the_local_runtime_runs_on_the_resolved_fields(tmp_path):
    run = LocalRun(_load(tmp_path, ""))
    try:
        assert run.learner.cfg.temperature == run.controller.sampling.temperature == 0.7
        assert run.learner.cfg.top_p == run.controller.sampling.top_p == 0.9
        assert run.learner.cfg.max_lag == run.controller.cfg.max_lag == 8
    finally:
        run.close()
