"""Rollouts: the agent loop (env + engine, token in / token out), the lag-bounded controller, the queue,
and the ledger that accounts for every started group."""

from rz_agents.rollout.agent_loop import EpisodeError, EpisodeLimits, EpisodeSpec, run_episode
from rz_agents.rollout.controller import RolloutConfig, RolloutController
from rz_agents.rollout.group_ledger import GroupLedger
from rz_agents.rollout.task_source import TaskSource
from rz_agents.rollout.trajectory_queue import Group, TrajectoryQueue

__all__ = [
    "EpisodeError",
    "EpisodeLimits",
    "EpisodeSpec",
    "Group",
    "GroupLedger",
    "RolloutConfig",
    "RolloutController",
    "TaskSource",
    "TrajectoryQueue",
    "run_episode",
]
