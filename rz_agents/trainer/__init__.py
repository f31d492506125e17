"""The learner: REINFORCE Zero loss and comparison estimators, optimizer, metrics, checkpoints."""

from rz_agents.trainer.advantages import group_advantages
from rz_agents.trainer.checkpoint import load_checkpoint, save_checkpoint
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.loss import ESTIMATORS, LossConfig, sequence_loss
from rz_agents.trainer.metrics_log import MetricsWriter
from rz_agents.trainer.optim import OptimConfig

__all__ = [
    "ESTIMATORS",
    "Learner",
    "LearnerConfig",
    "LossConfig",
    "MetricsWriter",
    "OptimConfig",
    "group_advantages",
    "load_checkpoint",
    "save_checkpoint",
    "sequence_loss",
]
