"""eval: {every: N, ...}: held-out evaluation inside training, on the run's engine, logged as eval/* in
metrics.jsonl, summary and the report; a bad section fails validation naming the field."""

import asyncio
import json

import pytest

from rz_agents.eval.in_loop import plan_loop_eval
from rz_agents.eval.math_config import load_eval_config
from rz_agents.report import write_report
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import LearnerSpec, LocalRun, RolloutSpec, TrainConfig
from rz_agents.trainer.optim import OptimConfig


def _cfg(tmp_path, steps=3, **eval_section):
    return TrainConfig(
        steps=steps, num_threads=1, output_dir=str(tmp_path / "run"), inspect_steps=[],
        rollout=RolloutSpec(
            group_size=2, groups_per_batch=1, max_concurrent_episodes=4, max_lag=2,
            limits=EpisodeLimits(max_turns=1, max_tokens_per_turn=4, max_episode_tokens=100),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2)),
        eval=eval_section,
    )  # fmt: skip


def _train(cfg):
    run = LocalRun(cfg)
    try:
        return asyncio.run(run.train())
    finally:
        run.close()


def _rows(tmp_path):
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_the_runs_env_is_evaluated_every_n_steps_and_after_the_last(tmp_path):
    summary = _train(_cfg(tmp_path, steps=3, every=2, num_tasks=3, k=2, temperature=0.0))
    rows = _rows(tmp_path)
    evaluated = [r["step"] for r in rows if "eval/avg_at_k" in r]
    assert evaluated == [1, 2]  # after 2 steps, and after the last (3rd)
    for r in rows:
        if "eval/avg_at_k" in r:
            assert 0.0 <= r["eval/avg_at_k"] <= r["eval/pass_at_k"] <= 1.0
            assert r["eval/version"] == r["step"] + 1 and r["time_eval_s"] >= r["eval/wall_s"] > 0
    assert [e["step"] for e in summary["eval"]] == [1, 2]
    html = write_report(tmp_path / "run", summary).read_text()
    assert "Held-out evaluation during training" in html


def test_at_start_evaluates_the_first_weights_before_step_0_and_the_curve_starts_there(tmp_path):
    summary = _train(_cfg(tmp_path, steps=2, every=1, at_start=True, num_tasks=2, k=1, temperature=0.0))
    first, second = _rows(tmp_path)
    assert first["eval_at_start/version"] == 0 and first["eval/version"] == 1  # before and after step 0
    assert 0.0 <= first["eval_at_start/avg_at_k"] <= 1.0 and first["eval_at_start/wall_s"] > 0
    assert not any(k.startswith("eval_at_start/") for k in second)
    points = [(e["step"], e.get("at_start", False)) for e in summary["eval"]]
    assert points == [(None, True), (0, False), (1, False)]
    assert summary["eval"][0]["avg_at_k"] == first["eval_at_start/avg_at_k"]
    html = write_report(tmp_path / "run", summary).read_text()
    assert "step -1: before training (eval.at_start)" in html


def test_a_math_set_is_evaluated_in_the_loop(tmp_path):
    data = tmp_path / "aime_like.jsonl"
    data.write_text(
        '{"id": "p1", "question": "1+1?", "answer": "2"}\n{"id": "p2", "question": "2+2?", "answer": "4"}\n'
    )
    _train(_cfg(tmp_path, steps=1, every=1, benchmark=str(data), k=2, max_tokens=6, temperature=1.0))
    (row,) = _rows(tmp_path)
    assert 0.0 <= row["eval/avg_at_k"] <= row["eval/pass_at_k"] <= 1.0 and row["eval/num_failed"] == 0.0


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"every": -1}, r"eval.every must be a whole number of learner steps >= 0 \(0: off\), got -1"),
        ({"every": 2}, r"eval.every needs tasks to evaluate: no eval tasks"),
        ({"every": 2, "num_tasks": 2, "k": 0}, r"eval.k must be a whole number >= 1, got 0"),
        ({"every": 2, "num_tasks": 2, "top_p": 1.5}, r"eval.top_p must be in \(0, 1\], got 1.5"),
        (
            {"every": 2, "num_tasks": 2, "max_tokens": 0},
            r"eval.max_tokens must be a whole number >= 1, got 0",
        ),
        ({"every": 2, "num_tasks": 2, "tool": True}, r"eval.tool: not a setting of an env evaluation"),
        ({"every": 1, "benchmark": "aime24", "k": 0}, r"eval.k: must be >= 1, got 0"),
        ({"every": 2, "num_tasks": 2, "at_start": "yes"}, r"eval.at_start must be true or false, got 'yes'"),
        ({"at_start": True, "num_tasks": 2}, r"eval.at_start: true needs eval.every >= 1"),
    ],
)
def test_a_bad_eval_section_is_refused_naming_the_field(tmp_path, section, message):
    with pytest.raises(ValueError, match=message):
        _cfg(tmp_path, **section).validate()


def test_rz_eval_ignores_the_in_loop_keys(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("model: {}\neval:\n  every: 5\n  at_start: true\n  benchmark: aime24\n  k: 2\n")
    assert load_eval_config(path).k == 2
    assert plan_loop_eval({"every": 0, "anything": 1}, None) is None  # off: the rest is rz eval's business
