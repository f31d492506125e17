"""rz_agents: async REINFORCE Zero for tool-using and computer-using LLM agents.

Importing the package registers the Gymnasium ids of its envs (``gymnasium.make("rz_agents/PythonTool-v0")``);
registration imports no env module (entry points are strings). An interpreter without Gymnasium (the
vLLM worker's venv, which needs only the engine) imports the package without registering anything.
"""

import importlib.util

__version__ = "0.1.0"

if importlib.util.find_spec("gymnasium") is not None:
    from rz_agents.envs.registry import register_builtin_envs

    register_builtin_envs()
