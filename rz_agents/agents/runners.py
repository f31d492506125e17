"""The episode runner a run's ``agent:`` section names (rz_agents/agents/spec.py)."""

from __future__ import annotations

from rz_agents.agents.spec import AGENT_KINDS, AgentSpec
from rz_agents.rollout.agent_loop import AgentLoop
from rz_agents.rollout.episode_runner import EpisodeRunner


def episode_runner(spec: AgentSpec) -> EpisodeRunner:
    """``agent.kind: loop``: the agent loop (steps the run's env); ``openai``: the OpenAI-API agent of
    ``agent.openai`` (its function and scorer imported now: a bad name is a ValueError naming it);
    ``miniswe``: mini-swe-agent on the Harbor tasks of ``agent.miniswe`` (a bad task name fails now)."""
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
    if spec.kind == "miniswe":
        from rz_agents.agents.miniswe import MiniSweAgent

        m = spec.miniswe
        return MiniSweAgent(
            python=m.python,
            configs=m.configs,
            tasks=m.tasks,
            names=m.names,
            command_timeout_s=m.command_timeout_s,
            timeout_s=m.timeout_s,
        )
    raise ValueError(f"agent.kind must be one of {AGENT_KINDS}, got {spec.kind!r}")
