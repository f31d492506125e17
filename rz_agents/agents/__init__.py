"""Agents: what drives a run's episodes, apart from the envs (``agent:`` of a run).

``agent.kind: loop`` (default) is the rollout's agent loop stepping a Gymnasium env
(rz_agents/rollout/agent_loop.py); ``agent.kind: openai`` runs the user's agent written against the OpenAI
API on ``rz serve`` sessions (openai_api/); ``agent.kind: miniswe`` runs mini-swe-agent, unmodified, on
Harbor terminal tasks in the episode's sandbox (miniswe/). All implement the episode-runner seam
(rz_agents/rollout/episode_runner.py); ``episode_runner(spec)`` builds the one a run names.
"""

from rz_agents.agents.runners import episode_runner
from rz_agents.agents.spec import AGENT_KINDS, AgentSpec, MiniSweAgentSpec, OpenAIAgentSpec

__all__ = ["AGENT_KINDS", "AgentSpec", "MiniSweAgentSpec", "OpenAIAgentSpec", "episode_runner"]
