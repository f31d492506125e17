"""What the training loop asks of a runtime: where the learner step runs, what a published set of weights
is and how it reaches the engines. ``LocalLoopRuntime`` (runtime/local.py: one process, the learner in a
thread or a child process) and ``RayLoopRuntime`` (runtime/ray/run.py: actors) implement it; ``TrainLoop``
(runtime/loop.py) drives either one with the same code.

Every hook but ``before_train``, ``load_engine_base`` and the two learner figures is abstract: a runtime
that lacks one fails when it is built, not in the middle of a run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any


class LoopRuntime(ABC):
    """The runtime-specific half of a run (see the module docstring). ``learner``: the learner or the
    runtime's handle on it (a child process, Ray ranks), with ``version`` and ``skipped_steps``."""

    learner: Any

    # ---- the learner ----------------------------------------------------------------------------
    @property
    def learner_version(self) -> int:
        """The policy version of the learner's current weights."""
        return self.learner.version

    @property
    def skipped_steps(self) -> int:
        """Learner steps skipped so far (a non-finite loss or gradient)."""
        return self.learner.skipped_steps

    @abstractmethod
    async def learner_step(self, batch: list) -> dict[str, Any]:
        """``Learner.step`` on ``batch`` wherever the learner runs; returns its metrics."""

    @abstractmethod
    async def inspection_record(self, batch: list) -> dict[str, Any]:
        """``trainer.inspect.record_step`` for ``batch`` under the learner's current weights (the trajectory
        inspector's data for a step of ``inspect_steps``)."""

    @abstractmethod
    def learner_state(self, folder: Path) -> dict[str, Any]:
        """``Learner.save_state(folder)`` wherever the learner runs (every rank writes its own shards into
        ``folder``) for a checkpoint; returns the rest of the state."""

    @abstractmethod
    def load_learner_state(self, state: dict[str, Any], folder: Path | None = None) -> None:
        """``Learner.load_state(state, folder)`` wherever the learner runs; ``folder`` None: a checkpoint of
        the format before folders, whose ``state`` holds the whole tensors."""

    # ---- weights: learner -> engines -------------------------------------------------------------
    @abstractmethod
    def learner_weights(self) -> Any:
        """The learner's current ``model.weight_update.WeightUpdate`` in the form the engines load (the
        record, or an object reference to it)."""

    @abstractmethod
    def snapshot_weights(self, weights: Any) -> Any:
        """An unchanging copy of ``learner_weights()`` for the fixed-lag history."""

    @abstractmethod
    def load_engine_weights(self, weights: Any, version: int) -> None:
        """Make the engines sample with ``weights`` as ``version`` now (before the loop starts)."""

    def load_engine_base(self) -> None:  # noqa: B027 (optional: only a frozen part makes updates partial)
        """With a frozen part (LoRA's base, a frozen vision tower: a publication holds only the trained
        tensors): make the engines take the learner's whole weights now (its frozen part may differ from
        theirs: a warm start, a resumed checkpoint); the publications after it leave the frozen part out."""

    @abstractmethod
    async def send_weights(self, weights: Any, version: int) -> None:
        """Make every engine sample with ``weights`` as ``version`` (between its steps)."""

    @abstractmethod
    def weights_to_tensors(self, weights: Any) -> dict:
        """Published weights as a dict of tensors (for checkpoints: ``WeightUpdate.to_state``)."""

    @abstractmethod
    def weights_from_tensors(self, tensors: dict, version: int) -> Any:
        """Inverse of ``weights_to_tensors`` (the weights of ``version``)."""

    # ---- the engines ------------------------------------------------------------------------------
    @abstractmethod
    def engine_progress(self) -> int:
        """A number that grows while the engines work (for the watchdog)."""

    @abstractmethod
    def engine_step_metrics(self) -> dict[str, Any]:
        """Per-step engine figures: ``engine_generated_tokens`` and ``engine_version`` at least."""

    @abstractmethod
    def engine_summary(self) -> dict[str, Any]:
        """The engines' counters for the run summary."""

    # ---- the process -------------------------------------------------------------------------------
    def before_train(self) -> None:  # noqa: B027 (optional: most runtimes have nothing to do)
        """Called when ``train`` starts (e.g. CPU pinning)."""
