"""How the pieces are placed: the schema and factories every runtime shares, and the local one-process
runtime (learner optionally in a child process)."""

from rz_agents.runtime.config import EnvSpec, LearnerSpec, ModelSpec, RolloutSpec, TrainConfig, resolve
from rz_agents.runtime.local import LocalRun, run_training

__all__ = [
    "EnvSpec",
    "LearnerSpec",
    "LocalRun",
    "ModelSpec",
    "RolloutSpec",
    "TrainConfig",
    "resolve",
    "run_training",
]
