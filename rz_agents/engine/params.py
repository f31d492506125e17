"""What a request asks for (SamplingParams) and what it gets back (Completion)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from rz_agents.sampling import SamplingSpec

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    temperature == 0 selects greedy decoding (argmax of the logits). Greedy tokens record the
    log-probability of the chosen token under the untempered (temperature 1) distribution with the
    same top-k/top-p filter, so they can be compared with ``packed_token_logprobs(..., temperature=1)``.
    Otherwise the recorded value is the log-probability under the distribution actually sampled from.

    stop_token_ids end the completion when generated (like eos_token_ids, which are usually set by
    the engine from the model's config); stop strings need an engine built with a ``decode``
    function. The token that ends a completion is kept in ``Completion.tokens``: the trainer needs
    every sampled token and its log-probability.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    @classmethod
    def from_spec(cls, spec: SamplingSpec, **request: Any) -> SamplingParams:
        """The params for one request (``request``: max_tokens, seed, stops) sampling from ``spec``'s
        distribution (``rollout.temperature / top_k / top_p``): what the learner then scores under."""
        return cls(temperature=spec.temperature, top_k=spec.top_k, top_p=spec.top_p, **request)

    def __post_init__(self) -> None:
        # Frozen dataclass: normalise sequences to tuples so params stay hashable and comparable.
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)):
            raise ValueError(f"SamplingParams.temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"SamplingParams.seed must be an int or None, got {self.seed!r}")
        if any(s == "" for s in self.stop):
            raise ValueError("SamplingParams.stop must not contain empty strings")

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax instead of sampling."""
        return self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        """Temperature of the distribution whose log-probabilities are recorded."""
        return 1.0 if self.greedy else float(self.temperature)


@dataclass
class Completion:
    """The generated continuation of one prompt.

    tokens: generated token ids (the prompt is not repeated).
    logprobs: fp32 tensor [len(tokens)], the exact values the sampler recorded.
    versions: policy version of the weights that produced each token's distribution.
    finish_reason: "stop" (EOS, stop token or stop string), "length" (max_tokens or the engine's
    max_len), "cancelled" or "error" (then ``error`` says why).
    """

    prompt: list[int]
    tokens: list[int]
    logprobs: torch.Tensor
    versions: list[int]
    finish_reason: FinishReason
    num_cached_prompt_tokens: int = 0
    error: str | None = None
    stop_reason: int | str | None = field(default=None)
