"""rz_agents: async REINFORCE Zero for tool-using and computer-using LLM agents.

Importing the package registers the Gymnasium ids of its envs (``gymnasium.make("rz_agents/PythonTool-v0")``);
registration imports no env module (entry points are strings).
"""

from rz_agents.envs.registry import register_builtin_envs

__version__ = "0.1.0"

register_builtin_envs()
