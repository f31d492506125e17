"""The OpenAI-API agent (``agent.kind: openai``): the user's agent, written against the OpenAI SDK, trained
through ``rz serve`` sessions of the run's engine (agent.py; its endpoint: endpoint.py)."""

from rz_agents.agents.openai_api.agent import AgentError, OpenAIAPIAgent
from rz_agents.agents.openai_api.endpoint import served_endpoint

__all__ = ["AgentError", "OpenAIAPIAgent", "served_endpoint"]
