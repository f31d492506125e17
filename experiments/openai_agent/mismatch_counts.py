"""The prefix-mismatch counter of rz serve sessions while training the example OpenAI-SDK agent: 0 for the
append-only agent, one per episode for the agent whose client rewrites its first message every turn.

    python experiments/openai_agent/mismatch_counts.py      # ~1 min on 2 cores; prints JSON

Two sync steps of 8 episodes (2 turns each) per agent, with tests/agents/test_openai_api_agent.py's config.
"""

from __future__ import annotations

import asyncio
import json

import torch

from rz_agents.agents import AgentSpec, OpenAIAgentSpec
from rz_agents.agents.openai_api.endpoint import _ENDPOINTS
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import LearnerSpec, LocalRun, RolloutSpec, TrainConfig
from rz_agents.trainer.optim import OptimConfig

AGENTS = "rz_agents.agents.examples.openai_letters_agent"


def counts(agent: str, steps: int = 2) -> dict:
    cfg = TrainConfig(
        mode="sync",
        steps=steps,
        num_threads=1,
        agent=AgentSpec(
            kind="openai", openai=OpenAIAgentSpec(function=f"{AGENTS}:{agent}", scorer=f"{AGENTS}:score")
        ),
        rollout=RolloutSpec(
            group_size=4,
            groups_per_batch=2,
            max_concurrent_episodes=8,
            limits=EpisodeLimits(max_turns=2, max_tokens_per_turn=8, max_episode_tokens=400),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2), assert_lag0_exact=True),
    )
    run = LocalRun(cfg)
    try:
        summary = asyncio.run(run.train())
        sessions = _ENDPOINTS[run.engine][1].server.sessions.counters
        return {
            "episodes": summary["rollout"]["episodes_finished"],
            "session_requests": sessions["session_requests"],
            "appended_requests": sessions["appended_requests"],
            "prefix_mismatches": sessions["prefix_mismatches"],
            "lag0_abs_dlogp_max": max(m["lag0_abs_dlogp_max"] for m in run.loop.history),
        }
    finally:
        run.close()


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps({agent: counts(agent) for agent in ("agent", "rewriting_agent")}, indent=1))
