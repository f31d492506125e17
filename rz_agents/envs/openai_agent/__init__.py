"""``rz_agents/OpenAIAgent-v0``: an agent written against the OpenAI API, trained through an ``rz serve``
session of the run's engine (env.py)."""

from rz_agents.envs.openai_agent.env import OpenAIAgentEnv, served_endpoint

__all__ = ["OpenAIAgentEnv", "served_endpoint"]
