"""Rollouts: the episode-runner seam and its default, the agent loop (env + engine, token in / token out),
the lag-bounded controller, the queue, and the ledger that accounts for every started group."""

from rz_agents.rollout.agent_loop import AgentLoop, EpisodeError, EpisodeLimits, EpisodeSpec, run_episode
from rz_agents.rollout.controller import RolloutConfig, RolloutController
from rz_agents.rollout.episode_runner import EpisodeRunner
from rz_agents.rollout.group_ledger import GroupLedger
from rz_agents.rollout.task_source import TaskSource
from rz_agents.rollout.trajectory_queue import Group, TrajectoryQueue

__all__ = [
    "AgentLoop",
    "EpisodeError",
    "EpisodeLimits",
    "EpisodeRunner",
    "EpisodeSpec",
    "Group",
    "GroupLedger",
    "RolloutConfig",
    "RolloutController",
    "TaskSource",
    "TrajectoryQueue",
    "run_episode",
]
