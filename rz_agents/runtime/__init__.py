"""How the pieces are placed: the embedded one-process runtime (learner optionally in a child process)."""

from rz_agents.runtime.embedded import EmbeddedRun, EnvSpec, ModelSpec, TrainConfig, run_training

__all__ = ["EmbeddedRun", "EnvSpec", "ModelSpec", "TrainConfig", "run_training"]
