"""The interface every engine backend offers (rz, vllm): token in, token out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import torch

from rz_agents.engine.params import Completion, SamplingParams


@runtime_checkable
class Engine(Protocol):
    async def generate(self, prompt: list[int], params: SamplingParams) -> Completion:
        """Generate one completion of ``prompt``; many calls may be in flight at once."""
        ...

    def load_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Swap in new weights between steps; later tokens carry ``version``."""
        ...

    @property
    def version(self) -> int:
        """Policy version of the weights the engine currently samples with."""
        ...
