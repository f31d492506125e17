"""Supervised warm start: teach a policy the tool-call format before RL."""

from rz_agents.warmstart.bootstrap import BootstrapConfig
from rz_agents.warmstart.demos import (
    DEMO_TASKS,
    Demonstration,
    arithmetic_tool_demos,
    word_problem_tool_demos,
)
from rz_agents.warmstart.episodes import load_episodes, render_episode
from rz_agents.warmstart.sft import WarmStartConfig, supervised_warm_start

__all__ = [
    "BootstrapConfig",
    "DEMO_TASKS",
    "Demonstration",
    "WarmStartConfig",
    "arithmetic_tool_demos",
    "load_episodes",
    "render_episode",
    "supervised_warm_start",
    "word_problem_tool_demos",
]
