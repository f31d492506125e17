"""The one record a weight update travels as, from the learner to every engine.

A ``WeightUpdate`` is what the learner produces once per publication: the policy ``version``, the ``tensors``
it sends (every state-dict entry, or only the trained part: LoRA's adapters, all but a frozen vision tower)
and, for a partial update, ``held_sha256``: the SHA-256 (``held_weights.digest``) of the entries it leaves
out, which the engine checks against what it holds before it applies anything. Each transport (in-process,
Ray's object store, the broadcast group) publishes this record through its own publisher; the engine side
applies one record type (``RZEngine.apply_update``).

``to_state`` / ``from_state`` are the flat form for places that store or ship a plain tensor dict (the fixed-
lag history in checkpoints, the broadcast's buckets, ``rz serve``'s ``/update_weights`` file): the claim is
the ``HELD_KEY`` entry there, and only there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from rz_agents.model.held_weights import HELD_KEY, claim_hex, claim_tensor


@dataclass(frozen=True)
class WeightUpdate:
    """One publication: ``version``, the ``tensors`` sent, and the claim on the rest (None: whole weights)."""

    version: int
    tensors: Mapping[str, torch.Tensor] = field(repr=False)
    held_sha256: str | None = None

    def __post_init__(self) -> None:
        if HELD_KEY in self.tensors:
            raise ValueError(f"WeightUpdate: {HELD_KEY!r} is not a tensor name (the claim is held_sha256)")
        if self.held_sha256 is not None and len(self.held_sha256) != 64:
            raise ValueError(f"WeightUpdate: held_sha256 must be 64 hex digits, got {self.held_sha256!r}")

    @property
    def partial(self) -> bool:
        """True when the update leaves a held (frozen) part out."""
        return self.held_sha256 is not None

    @property
    def nbytes(self) -> int:
        """Bytes the update sends: its tensors and, for a partial one, the claim's 32 bytes."""
        claim = 32 if self.held_sha256 is not None else 0
        return claim + sum(t.numel() * t.element_size() for t in self.tensors.values())

    def to_state(self) -> dict[str, torch.Tensor]:
        """The flat tensor dict: ``tensors`` plus, for a partial update, the claim under ``HELD_KEY``."""
        out = dict(self.tensors)
        if self.held_sha256 is not None:
            out[HELD_KEY] = claim_tensor(self.held_sha256)
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor], version: int) -> WeightUpdate:
        """Inverse of ``to_state`` (a dict without ``HELD_KEY``: whole weights, or a subset with no claim)."""
        tensors = {k: v for k, v in state.items() if k != HELD_KEY}
        held = claim_hex(state[HELD_KEY]) if HELD_KEY in state else None
        return cls(int(version), tensors, held)

    def with_tensors(self, tensors: Mapping[str, torch.Tensor]) -> WeightUpdate:
        """The same update with other tensor objects (e.g. clones, or host copies)."""
        return WeightUpdate(self.version, tensors, self.held_sha256)

    def snapshot(self) -> WeightUpdate:
        """An unchanging copy (each tensor cloned): the fixed-lag history keeps these."""
        return self.with_tensors({k: v.detach().clone() for k, v in self.tensors.items()})
