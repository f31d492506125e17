"""Supervised warm start: teach a policy the tool-call format before RL."""

from rz_agents.warmstart.demos import Demonstration, arithmetic_tool_demos
from rz_agents.warmstart.sft import WarmStartConfig, supervised_warm_start

__all__ = ["Demonstration", "WarmStartConfig", "arithmetic_tool_demos", "supervised_warm_start"]
