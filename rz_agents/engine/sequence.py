"""The state of one request as it moves through the engine: waiting -> running -> finished."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

import torch

from rz_agents.engine.params import Completion, FinishReason, SamplingParams

_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued, holds no cache slot
    RUNNING = "running"  # holds a slot; prefilling or decoding
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request: its tokens, how many of them have K/V in the cache, and what it generated.

    ``num_cached`` counts the leading tokens whose K/V are written in the slot; the next forward
    feeds ``tokens[num_cached:]`` (a prefill chunk) or, once only the newest token is missing, that
    token alone (a decode step). The last sampled token never has K/V until it is fed.
    """

    prompt: list[int]
    params: SamplingParams
    seq_id: int = field(default_factory=lambda: next(_ids))
    status: SequenceStatus = SequenceStatus.WAITING
    slot: int | None = None
    num_cached: int = 0
    num_cached_prompt_tokens: int = 0  # prompt tokens reused from the prefix cache at admission
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # python floats hold fp32 values exactly
    versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    cancelled: bool = False
    # True once a weight update kept this slot's K/V ("keep" policy): the slot then mixes versions
    # and must not become a prefix entry, whose reuse has to equal a cold prefill.
    kv_from_old_weights: bool = False
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

    @property
    def tokens(self) -> list[int]:
        """Prompt followed by every generated token."""
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def num_pending(self) -> int:
        """Tokens still to feed through the model before the next token can be sampled."""
        return self.num_tokens - self.num_cached

    def append(self, token: int, logprob: float, version: int) -> None:
        self.output.append(int(token))
        self.logprobs.append(float(logprob))
        self.versions.append(int(version))

    def finish(self, reason: FinishReason, stop_reason: int | str | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason

    def to_completion(self) -> Completion:
        return Completion(
            prompt=list(self.prompt),
            tokens=list(self.output),
            logprobs=torch.tensor(self.logprobs, dtype=torch.float32),
            versions=list(self.versions),
            finish_reason=self.finish_reason or "error",
            num_cached_prompt_tokens=self.num_cached_prompt_tokens,
            error=self.error,
            stop_reason=self.stop_reason,
        )
