"""model.kernels selects the op set, the estimator the loss and (on_policy) the mode; per-step metrics reach
JSONL and TensorBoard."""

import asyncio
import json

import pytest

from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import LearnerSpec, LocalRun, ModelSpec, RolloutSpec, TrainConfig
from rz_agents.trainer.loss import LossConfig
from rz_agents.trainer.optim import OptimConfig

STEP_KEYS = {
    "reward_mean", "reward_std", "advantage_mean", "advantage_std", "lag_min", "lag_mean", "lag_max",
    "is_weight_mean", "is_weight_max", "is_weight_p50", "is_weight_p99", "is_weight_ess_fraction",
    "kl_k1_behavior_to_learner", "kl_k3_behavior_to_learner", "is_weight_abs_dev_mean",
    "is_weight_abs_dev_run_peak_over_median", "learner_tokens_per_s", "trained_tokens_per_s",
    "time_wait_data_s", "time_forward_s", "time_backward_s", "time_optimizer_s", "time_publish_s",
}  # fmt: skip


def _cfg(estimator, **kw):
    return TrainConfig(
        mode="async",
        steps=2,
        num_threads=1,
        rollout=RolloutSpec(
            group_size=2, groups_per_batch=2, max_concurrent_episodes=8, limits=EpisodeLimits(2, 6, 200)
        ),
        learner=LearnerSpec(loss=LossConfig(estimator=estimator), optim=OptimConfig(lr=1e-2)),
        **kw,
    )


def _run(cfg):
    run = LocalRun(cfg)
    try:
        summary = asyncio.run(run.train())
        return run, summary
    finally:
        run.close()


def test_standard_kernels_run_on_engine_and_learner():
    run, s = _run(_cfg("reinforce_zero", model=ModelSpec(kernels="standard")))
    assert run.model.kernels == "standard" and run.engine.model.kernels == "standard"
    assert s["steps"] == 2
    # negative control end to end: engine and learner on stock ops disagree on lag-0 tokens (the first
    # step trains only tokens sampled at version 0)
    first = run.history[0]
    assert first["lag0_token_count"] > 0 and first["lag0_abs_dlogp_max"] > 0.0


def test_standard_kernels_refuse_the_exact_lag0_assertion():
    cfg = _cfg("reinforce_zero", model=ModelSpec(kernels="standard"))
    cfg.learner.assert_lag0_exact = True
    with pytest.raises(ValueError, match="assert_lag0_exact"):
        cfg.validate()


def test_the_retired_standard_is_estimator_says_what_to_write():
    with pytest.raises(ValueError) as info:
        _cfg("standard_is").validate()
    message = str(info.value)
    assert "learner.loss.estimator: reinforce_zero and model.kernels: standard" in message
    assert "\n" not in message


def test_the_estimator_no_longer_selects_kernels():
    run = LocalRun(_cfg("ppo_clip"))
    try:
        assert run.model.kernels == run.engine.model.kernels == "aligned"
    finally:
        run.close()


def test_on_policy_estimator_runs_synchronously():
    run, s = _run(_cfg("on_policy"))
    assert s["max_lag_seen"] == 0 and s["rollout"]["groups_started"] == 2 * 2
    assert run.history[0]["lag0_abs_dlogp_max"] == 0.0


def test_metrics_go_to_jsonl_and_tensorboard(tmp_path):
    _run(_cfg("reinforce_zero", output_dir=str(tmp_path), tensorboard=True))
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    missing = STEP_KEYS - set(rows[0])
    assert not missing, missing
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert (tmp_path / "checkpoint.pt").is_file()


def test_default_config_validates_and_round_trips_through_yaml():
    import yaml

    from rz_agents.config_io import from_dict, to_dict

    cfg = TrainConfig()
    cfg.validate()
    again = from_dict(TrainConfig, yaml.safe_load(yaml.safe_dump(to_dict(cfg))))
    assert again == cfg


def test_bad_fields_are_named():
    with pytest.raises(ValueError, match="mode"):
        TrainConfig(mode="fast").validate()
    cfg = TrainConfig()
    cfg.rollout.limits.max_episode_tokens = cfg.engine.max_len
    with pytest.raises(ValueError, match="max_episode_tokens"):
        cfg.validate()
    with pytest.raises(ValueError, match=r"rollout\.group_size"):
        RolloutSpec(group_size=0).validate()
