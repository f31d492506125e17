"""How the pieces are placed: the schema, factories and training loop every runtime shares, the local
one-process runtime (learner optionally in a child process) and the Ray runtime (rz_agents.runtime.ray)."""

from rz_agents.runtime.config import (
    ActorsConfig,
    EnvSpec,
    LearnerSpec,
    ModelSpec,
    RayConfig,
    RolloutSpec,
    TrainConfig,
    resolve,
)
from rz_agents.runtime.launch import build_run, run_training
from rz_agents.runtime.local import LocalRun
from rz_agents.runtime.plan import RunPlan

__all__ = [
    "EnvSpec",
    "LearnerSpec",
    "LocalRun",
    "ModelSpec",
    "ActorsConfig",
    "RayConfig",
    "RolloutSpec",
    "RunPlan",
    "TrainConfig",
    "build_run",
    "resolve",
    "run_training",
]
