"""How the pieces are placed: the schema, factories and training loop every runtime shares, the local
one-process runtime (learner optionally in a child process) and the Ray runtime (rz_agents.runtime.ray)."""

from rz_agents.runtime.config import EnvSpec, ModelSpec, PlacementConfig, RayConfig, TrainConfig
from rz_agents.runtime.launch import build_run, run_training
from rz_agents.runtime.local import LocalRun

__all__ = [
    "EnvSpec",
    "LocalRun",
    "ModelSpec",
    "PlacementConfig",
    "RayConfig",
    "TrainConfig",
    "build_run",
    "run_training",
]
