"""Token-weighted staleness: per-token lag and each trajectory's oldest lag, per step and over the run, in
metrics.jsonl, TensorBoard and the report."""

import asyncio
import json

import pytest

from rz_agents.report import write_report
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import LearnerSpec, LocalRun, RolloutSpec, TrainConfig
from rz_agents.trainer.metrics import lag_buckets, staleness_histogram, staleness_metrics
from rz_agents.trainer.optim import OptimConfig


def test_buckets_double_and_end_at_the_bound():
    assert lag_buckets(5) == [(0, 0), (1, 1), (2, 3), (4, 5)]


def test_a_long_trajectory_weighs_by_its_tokens_and_by_its_oldest_token():
    # trajectory A: 6 tokens, oldest lag 3 (sampled across an update); B: 2 tokens at lag 0
    m, flat, oldest = staleness_metrics([[3, 3, 1, 1, 0, 0], [0, 0]], max_lag=4)
    assert sorted(flat) == [0, 0, 0, 0, 1, 1, 3, 3] and oldest == [3, 0]
    assert m["lag_token_frac_0_0"] == 4 / 8 and m["lag_token_frac_1_1"] == 2 / 8
    assert m["lag_token_frac_2_3"] == 2 / 8 and m["lag_token_frac_4_4"] == 0.0
    # by its oldest token, all 6 of A's tokens count as lag 3: the token-weighted oldest lag is 3 * 6 / 8
    assert m["lag_oldest_traj_2_3"] == 1.0 and m["lag_oldest_traj_0_0"] == 1.0
    assert m["lag_oldest_token_frac_2_3"] == 6 / 8 and m["lag_oldest_token_frac_0_0"] == 2 / 8
    assert m["lag_oldest_mean"] == 1.5 and m["lag_oldest_token_mean"] == pytest.approx(18 / 8)
    assert m["lag_oldest_max"] == 3.0 and m["lag_sampled_tokens"] == 8.0


def test_the_run_histogram_weighs_each_step_by_its_tokens():
    a, _, _ = staleness_metrics([[0, 0, 0]], max_lag=1)  # 3 tokens at lag 0
    b, _, _ = staleness_metrics([[1]], max_lag=1)  # 1 token at lag 1
    hist = staleness_histogram([a, b])
    assert hist["token"] == {"0": 0.75, "1": 0.25} and hist["oldest_traj"] == {"0": 1.0, "1": 1.0}


def test_a_run_logs_staleness_per_step_to_jsonl_tensorboard_summary_and_report(tmp_path):
    cfg = TrainConfig(
        steps=3, num_threads=1, output_dir=str(tmp_path / "run"), tensorboard=True,
        rollout=RolloutSpec(
            group_size=2, groups_per_batch=1, max_concurrent_episodes=4, max_lag=2,
            limits=EpisodeLimits(max_turns=1, max_tokens_per_turn=4, max_episode_tokens=100),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2)), inspect_steps=[],
    )  # fmt: skip
    run = LocalRun(cfg)
    try:
        summary = asyncio.run(run.train())
    finally:
        run.close()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        fracs = [row[f"lag_token_frac_{lo}_{hi}"] for lo, hi in lag_buckets(2)]
        assert sum(fracs) == pytest.approx(1.0)  # the bound holds: every token falls in a bucket
        assert row["lag_oldest_max"] <= 2 and row["lag_oldest_token_mean"] >= row["lag_mean"]
    assert sum(summary["staleness"]["token"].values()) == pytest.approx(1.0)
    assert list((tmp_path / "run" / "tb").glob("events.*"))
    report = write_report(tmp_path / "run", summary)
    assert "Staleness histogram over the run" in report.read_text()
