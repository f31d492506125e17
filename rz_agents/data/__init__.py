"""Packaged math datasets, a loader for them and for user files, and a synthetic task generator."""

from rz_agents.data.loader import DATASETS, DatasetError, load_dataset
from rz_agents.data.reasoning_gym_tasks import reasoning_gym_tasks
from rz_agents.data.synthetic import arithmetic_task, generate_arithmetic_tasks

__all__ = [
    "DATASETS",
    "DatasetError",
    "arithmetic_task",
    "generate_arithmetic_tasks",
    "load_dataset",
    "reasoning_gym_tasks",
]
