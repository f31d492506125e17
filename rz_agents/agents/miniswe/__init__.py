"""mini-swe-agent trained unchanged (``agent.kind: miniswe``): per episode, the real mini-swe-agent CLI in its
own interpreter, its model an ``rz serve`` session of the run's engine, its commands run in the episode's
Harbor sandbox (agent.py; the sandbox's endpoint: command_endpoint.py; the environment class mini-swe-agent
loads: shim/rz_sandbox_environment.py)."""

from rz_agents.agents.miniswe.agent import MiniSweAgent, miniswe_python

__all__ = ["MiniSweAgent", "miniswe_python"]
