"""Weights kept for the fixed-lag mode (``rollout.fixed_lag: k``): the engine samples with version v - k.

Each learner step records the weights it starts from; after a step to version v, the runtime publishes
the weights of version max(v - k, 0). Only the last k versions are kept: k copies of the weights (fine for
small models; a 135M-parameter bf16 model at k = 64 would hold ~17 GB).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def _clone(weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in weights.items()}


class WeightHistory:
    """The weights of the last ``lag`` policy versions, so the engine can be held exactly ``lag`` behind."""

    def __init__(self, lag: int, copy: Callable[[Any], Any] | None = None) -> None:
        """``copy`` makes the kept copy of a runtime's weights (default: clone each tensor; the Ray runtime
        keeps its object-store references, which never change)."""
        if lag < 0:
            raise ValueError(f"fixed lag must be >= 0, got {lag}")
        self.lag = lag
        self.copy = copy or _clone
        self._versions: dict[int, Any] = {}

    def record(self, weights: Any, version: int) -> None:
        """Keep a copy of the weights of ``version`` (call before a step changes them)."""
        if self.lag and version not in self._versions:
            self._versions[version] = self.copy(weights)

    def to_publish(self, current: Any, version: int) -> tuple[Any, int]:
        """(weights, version) the engine should sample with while the learner is at ``version``."""
        target = max(version - self.lag, 0)
        for old in [v for v in self._versions if v < target]:
            del self._versions[old]  # never needed again: the target only moves forward
        if target == version:
            return current, version
        if target not in self._versions:
            raise RuntimeError(f"fixed lag {self.lag}: weights of version {target} were not recorded")
        return self._versions[target], target

    def state_dict(self) -> dict[int, Any]:
        """The kept versions (for checkpoints: a resumed run keeps the same lag)."""
        return dict(self._versions)

    def load_state_dict(self, state: Mapping[int, Any]) -> None:
        """Restore what ``state_dict`` saved."""
        self._versions = {int(v): w for v, w in state.items()}
