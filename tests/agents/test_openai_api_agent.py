"""agent.kind: openai: an agent written only against the OpenAI SDK trains through rz serve sessions of the
run's engine; the learner's lag-0 re-scoring of the session tokens is exact, and the server counts a client
that rewrites history (0 for an append-only one)."""

from __future__ import annotations

import asyncio

import pytest

from rz_agents.agents import AgentSpec, OpenAIAgentSpec
from rz_agents.agents.openai_api import OpenAIAPIAgent
from rz_agents.agents.openai_api.endpoint import _ENDPOINTS
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import LearnerSpec, LocalRun, RolloutSpec, TrainConfig
from rz_agents.trainer.optim import OptimConfig

AGENTS = "rz_agents.agents.examples.openai_letters_agent"


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def _cfg(agent: str, steps: int, group_size: int = 4) -> TrainConfig:
    return TrainConfig(
        mode="sync",
        steps=steps,
        num_threads=1,
        agent=AgentSpec(
            kind="openai", openai=OpenAIAgentSpec(function=f"{AGENTS}:{agent}", scorer=f"{AGENTS}:score")
        ),
        rollout=RolloutSpec(
            group_size=group_size,
            groups_per_batch=2,
            max_concurrent_episodes=8,
            limits=EpisodeLimits(max_turns=2, max_tokens_per_turn=8, max_episode_tokens=400),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2), assert_lag0_exact=True),
    )


def _train(cfg: TrainConfig):
    run = LocalRun(cfg)
    try:
        summary = asyncio.run(run.train())
        counters = dict(_ENDPOINTS[run.engine][1].server.sessions.counters)
        return summary, run.loop.history, counters
    finally:
        run.close()


def test_an_openai_sdk_agent_trains_on_its_session_tokens_with_exact_lag0_logprobs():
    summary, history, counters = _train(_cfg("agent", steps=2))
    assert summary["steps"] == 2 and summary["rollout"]["episodes_failed"] == 0
    assert all(m["lag0_abs_dlogp_max"] == 0.0 for m in history)
    assert counters["prefix_mismatches"] == 0
    assert (
        counters["appended_requests"] == counters["session_requests"] // 2
    )  # turn 2 of each episode appended
    assert counters["sessions_opened"] >= 16


def test_a_client_that_rewrites_history_is_counted_and_still_trains_its_last_segment():
    summary, history, counters = _train(_cfg("rewriting_agent", steps=1, group_size=2))
    assert summary["steps"] == 1 and summary["rollout"]["episodes_failed"] == 0
    assert history[0]["lag0_abs_dlogp_max"] == 0.0
    assert counters["prefix_mismatches"] >= 4  # every episode's second turn


def test_the_agent_needs_one_function_or_command_it_can_import_and_steps_no_env():
    with pytest.raises(ValueError, match="exactly one of function"):
        OpenAIAPIAgent()
    with pytest.raises(ValueError, match="exactly one of function"):
        OpenAIAPIAgent(function=f"{AGENTS}:agent", command="python x.py")
    with pytest.raises(ValueError, match="agent function 'nope:x'"):
        OpenAIAPIAgent(function="nope:x")
    with pytest.raises(ValueError, match="scorer 'nope:y'"):
        OpenAIAPIAgent(function=f"{AGENTS}:agent", scorer="nope:y")
    assert OpenAIAPIAgent(command="python x.py").uses_env is False


def test_an_env_evaluation_of_an_openai_agent_run_runs_the_agent_on_sessions_not_an_env():
    from rz_agents.eval.checkpoint_policy import CheckpointPolicy
    from rz_agents.eval.env_eval import EnvEvalConfig, run_env_eval

    cfg = _cfg("agent", steps=0)
    run = LocalRun(cfg)
    try:
        policy = CheckpointPolicy(run.model, run.tokenizer, run.template, "random")
        config = EnvEvalConfig(checkpoint="random", num_tasks=2, k=2, num_threads=1, save_text=False)
        from rz_agents.runtime.factories import run_env_factory

        plan = run.plan
        result = run_env_eval(cfg, config, policy, plan, run_env_factory(cfg, plan), engine=run.engine)
        opened = dict(_ENDPOINTS[run.engine][1].server.sessions.counters)["sessions_opened"]
    finally:
        run.close()
    samples = [s for task in result["tasks"] for s in task["samples"]]
    assert result["num_samples"] == 4 and result["num_failed"] == 0 and opened == 4
    assert {s["finish"] for s in samples} <= {"agent_returned", "max_turns", "max_episode_tokens"}
