"""What a run's config decides, each setting in one place: ``resolve(cfg)`` -> ``RunPlan``.

The config (runtime/config.py) is what the user wrote; several of its fields only make sense together
(the lag bound follows mode, estimator, rollout.max_lag and rollout.fixed_lag; the learner scores under the
distribution the rollouts sample from; engine and learner run the same number of torch threads). ``resolve``
derives each such setting once, after checking that no field written in the config contradicts the one it
follows, and the runtimes hand the results to rollout, engine and learner alike:

    setting       decided from                                       handed to
    sampling      rollout.temperature / top_k / top_p                 controller (engine requests), learner
    lag           mode, learner.loss.estimator, rollout.max_lag,      controller (admission, stale drop),
                  fixed_lag, max_ahead_batches, lag_governor          learner (its bound), loop (fixed lag)
    kernels       model.kernels                                       model (engine and learner copies)
    num_threads   num_threads (Ray: or what engines and learner       engine config, learner (thread or
                  ranks both reserve)                                 process or Ray rank)
    max_turns     rollout.limits.max_turns                            agent loop, env constructors
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rz_agents.engine import EngineConfig
from rz_agents.rollout.controller import RolloutConfig
from rz_agents.rollout.lag_policy import LagPolicy
from rz_agents.sampling import SamplingSpec
from rz_agents.trainer.learner import Learner, LearnerConfig

if TYPE_CHECKING:
    from rz_agents.runtime.config import TrainConfig


@dataclass(frozen=True)
class RunPlan:
    """The settings of a run that several components follow, each decided once (see the module docstring),
    and the rollout / learner / engine configs with nothing left to derive."""

    sampling: SamplingSpec
    lag: LagPolicy
    kernels: str
    num_threads: int | None
    max_turns: int
    rollout: RolloutConfig
    learner: LearnerConfig
    engine: EngineConfig

    def build_learner(self, model, version: int = 0, ranks=None) -> Learner:
        """The run's learner over ``model``: scoring under ``sampling``, bounded by ``lag`` (wherever it runs:
        a thread, a child process, a Ray rank)."""
        return Learner(model, self.learner, version, ranks, sampling=self.sampling, max_lag=self.lag.bound)


def _agree(name: str, value: Any, source: str, derived: Any, why: str) -> None:
    if value is not None and value != derived:
        raise ValueError(f"{name} ({value!r}) conflicts with {source} ({derived!r}): {why}")


def _lag(cfg: TrainConfig) -> LagPolicy:
    r, lc = cfg.rollout, cfg.learner
    lag = r.lag_policy(cfg.mode, lc.loss.estimator)
    if lag.kind == "sync" and lc.max_lag not in (None, 0):
        source, value = ("mode", "sync") if cfg.mode == "sync" else ("learner.loss.estimator", "on_policy")
        raise ValueError(
            f"learner.max_lag ({lc.max_lag}) conflicts with {source} ({value!r}): {value} trains only "
            "lag-0 tokens; leave learner.max_lag out"
        )
    source = "rollout.max_lag" if r.fixed_lag is None else "rollout.fixed_lag"
    why = f"the learner applies the rollout's lag bound; set only {source}"
    _agree("learner.max_lag", lc.max_lag, source, lag.bound, why)
    return lag


def _sampling(cfg: TrainConfig) -> SamplingSpec:
    r, lc = cfg.rollout, cfg.learner
    for name in ("temperature", "top_k", "top_p"):
        why = f"the learner scores tokens under the rollout's sampling distribution; set only rollout.{name}"
        _agree(f"learner.{name}", getattr(lc, name), f"rollout.{name}", getattr(r, name), why)
    return r.sampling()


def _num_threads(cfg: TrainConfig) -> int | None:
    """The torch threads of engines and learner alike (alignment needs the same count on both sides)."""
    threads = cfg.num_threads
    if threads is None and cfg.runtime == "ray":  # what engines and learner ranks both reserve
        p = cfg.actors
        threads = max(1, int(min(p.cpus_per_engine, p.cpus_per_learner_rank)))
    if threads is not None and threads < 1:
        raise ValueError(f"num_threads must be >= 1 or unset, got {threads}")
    why = "engine and learner run the same number of torch threads; set only num_threads"
    _agree("engine.num_threads", cfg.engine.num_threads, "num_threads", threads, why)
    return threads


def resolve(cfg: TrainConfig) -> RunPlan:
    """The ``RunPlan`` of ``cfg``. Raises ValueError with one line naming both fields when a field written in
    the config contradicts the one it follows, e.g. ``learner.temperature (0.7) conflicts with
    rollout.temperature (1.0): ...``."""
    r, lc = cfg.rollout, cfg.learner
    lc.loss.validate()  # an estimator name that no longer exists says what to write instead
    _agree("rollout.seed", r.seed, "seed", cfg.seed, "episode seeds come from the run's seed; set only seed")
    why = "the rollout decides which groups are trained; set only rollout.skip_uniform_groups"
    _agree("learner.skip_uniform_groups", lc.skip_uniform_groups, "rollout.skip_uniform_groups",
           r.skip_uniform_groups, why)  # fmt: skip
    threads = _num_threads(cfg)
    rollout = {f.name: getattr(r, f.name) for f in dataclasses.fields(RolloutConfig)}
    learner = {f.name: getattr(lc, f.name) for f in dataclasses.fields(LearnerConfig)}
    return RunPlan(
        sampling=_sampling(cfg),
        lag=_lag(cfg),
        kernels=cfg.model.kernels,
        num_threads=threads,
        max_turns=r.limits.max_turns,
        rollout=RolloutConfig(**{**rollout, "seed": cfg.seed}),
        learner=LearnerConfig(**{**learner, "skip_uniform_groups": r.skip_uniform_groups}),
        engine=dataclasses.replace(cfg.engine, num_threads=threads),
    )
