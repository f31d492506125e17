"""Multi-turn text environments (Gymnasium) for tool-using agents.

Importing ``rz_agents`` registers the built-in ids, e.g. ``gymnasium.make("rz_agents/PythonTool-v0")``.
(The rollout runs env calls off the event loop: ``rz_agents.rollout.agent_loop.call_env``.)
"""

from rz_agents.envs.base import ChatMessages, Message, MultiTurnTextEnv, ToolSpec, TurnText, as_messages
from rz_agents.envs.registry import register_builtin_envs, register_env

register_builtin_envs()

__all__ = [
    "ChatMessages",
    "Message",
    "MultiTurnTextEnv",
    "ToolSpec",
    "TurnText",
    "as_messages",
    "register_env",
]
