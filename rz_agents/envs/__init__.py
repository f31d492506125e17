"""Multi-turn text environments (Gymnasium) for tool-using agents.

Importing this package registers the built-in ids, e.g. ``gymnasium.make("rz_agents/PythonTool-v0")``.
"""

from rz_agents.envs.base import ChatMessages, Message, MultiTurnTextEnv, ToolSpec, TurnText, as_messages
from rz_agents.envs.registry import register_builtin_envs, register_env
from rz_agents.envs.workers import EnvWorkerPool, areset, astep

register_builtin_envs()

__all__ = [
    "ChatMessages",
    "EnvWorkerPool",
    "Message",
    "MultiTurnTextEnv",
    "ToolSpec",
    "TurnText",
    "areset",
    "as_messages",
    "astep",
    "register_env",
]
