"""The episode runner a run's ``agent:`` section names (rz_agents/agents/spec.py)."""

from __future__ import annotations

from rz_agents.agents.spec import AGENT_KINDS, AgentSpec
from rz_agents.rollout.agent_loop import AgentLoop
from rz_agents.rollout.episode_runner import EpisodeRunner


def episode_runner(spec: AgentSpec) -> EpisodeRunner:
    """``agent.kind: loop``: the agent loop (steps the run's env); ``openai``: the OpenAI-API agent of
    ``agent.openai`` (its function and scorer imported now: a bad name is a ValueError naming it)."""
    if spec.kind == "loop":
        return AgentLoop()
    if spec.kind == "openai":
        # imported here: rz serve's modules load only in a run that uses them
        from rz_agents.agents.openai_api import OpenAIAPIAgent

        o = spec.openai
        return OpenAIAPIAgent(
            function=o.function,
            command=o.command,
            scorer=o.scorer,
            model_name=o.model_name,
            timeout_s=o.timeout_s,
        )
    raise ValueError(f"agent.kind must be one of {AGENT_KINDS}, got {spec.kind!r}")
