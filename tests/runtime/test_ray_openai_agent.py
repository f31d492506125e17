"""agent.kind: openai under runtime: ray: the agent's rz serve sessions are served over the engine
replicas' router from the driver, and the learner (a Ray actor) trains on the session tokens with exact
lag-0 log-probs."""

from __future__ import annotations

import pytest

from rz_agents.agents import AgentSpec, OpenAIAgentSpec
from rz_agents.engine import EngineConfig
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import ActorsConfig, LearnerSpec, RolloutSpec, TrainConfig, build_run
from rz_agents.trainer.optim import OptimConfig

pytest.importorskip("ray")
AGENTS = "rz_agents.agents.examples.openai_letters_agent"


def test_an_openai_sdk_agent_trains_under_the_ray_runtime(ray_cluster):
    import asyncio

    cfg = TrainConfig(
        runtime="ray",
        mode="sync",
        steps=1,
        num_threads=1,
        actors=ActorsConfig(),
        agent=AgentSpec(
            kind="openai", openai=OpenAIAgentSpec(function=f"{AGENTS}:agent", scorer=f"{AGENTS}:score")
        ),
        engine=EngineConfig(max_running=8, max_len=512, max_batch_tokens=512),
        rollout=RolloutSpec(
            group_size=2,
            groups_per_batch=2,
            max_concurrent_episodes=4,
            limits=EpisodeLimits(max_turns=2, max_tokens_per_turn=8, max_episode_tokens=400),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2), assert_lag0_exact=True),
    )
    run = build_run(cfg)
    try:
        summary = asyncio.run(run.train())
        history = run.loop.history
    finally:
        run.close()
    assert summary["steps"] == 1 and summary["rollout"]["episodes_failed"] == 0
    assert history[0]["lag0_abs_dlogp_max"] == 0.0
