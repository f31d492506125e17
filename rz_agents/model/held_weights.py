"""What a partial weight update assumes the receiver already holds, and the check of that claim.

A learner that trains only part of the model (LoRA: the adapters; ``learner.freeze_vision``: everything but
the vision tower) publishes only that part after each step. The tensors it leaves out must already be in the
engine, bit for bit as the learner holds them, or the engine samples from another policy while every lag-0
token still looks aligned to nobody. So a partial publication (``weight_update.WeightUpdate``) carries, as
``held_sha256`` (under ``HELD_KEY`` in its flat form only), the SHA-256 of the state-dict entries it leaves
out (names, dtypes, shapes, bytes, in state-dict order: ``digest``), and the engine refuses it unless the same
entries of its own state hash alike (``held_digest``, cached until one of those tensors is written in place
again: their version counters say when).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import torch
from torch import nn

HELD_KEY = "rz.held_sha256"  # a [32] uint8 tensor in a partial publication (never a model tensor's name)


def digest(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 hex of (name, tensor) pairs: each name, dtype, shape, then the tensor's bytes (on the host)."""
    h = hashlib.sha256()
    for name, tensor in named:
        whole = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{whole.dtype}|{tuple(whole.shape)}|".encode())
        h.update(whole.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def claim_tensor(hex_digest: str) -> torch.Tensor:
    """The ``HELD_KEY`` entry of a publication: the digest's 32 bytes as a uint8 tensor."""
    return torch.tensor(list(bytes.fromhex(hex_digest)), dtype=torch.uint8)


def claim_hex(tensor: torch.Tensor) -> str:
    """Inverse of ``claim_tensor``."""
    return bytes(tensor.detach().cpu().to(torch.uint8).tolist()).hex()


class HeldWeights:
    """The digest of the entries of ``model``'s state that a partial update leaves out, computed on demand and
    kept until one of them changes (an engine's check of ``HELD_KEY``)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._cache: tuple[tuple[str, ...], tuple[int, ...], str] | None = None

    def held_digest(self, sent: Iterable[str]) -> str:
        """``digest`` of the model's state-dict entries whose names are not in ``sent``."""
        sent = set(sent)
        held = [(n, t) for n, t in self.model.state_dict().items() if n not in sent]
        names = tuple(n for n, _ in held)
        try:
            versions = tuple(t._version for _, t in held)  # detach() shares the parameter's version counter
        except RuntimeError:  # inference tensors keep no version counter: hash every time
            return digest(held)
        if self._cache is not None and self._cache[:2] == (names, versions):
            return self._cache[2]
        value = digest(held)
        self._cache = (names, versions, value)
        return value

    def verify(self, tensors: Mapping[str, torch.Tensor], claimed: str | None) -> None:
        """Raise ValueError unless ``claimed`` (a partial update's ``held_sha256``; None: nothing claimed) is
        what this model holds for the entries ``tensors`` leaves out (then nothing may be loaded: send the
        whole weights first)."""
        if claimed is None:
            return
        held = self.held_digest(tensors)
        if held != claimed:
            total = len(self.model.state_dict())
            raise ValueError(
                f"load_weights: a partial update ({len(tensors)} of {total} tensors) assumes this engine "
                f"holds the other {total - len(tensors)} as sha256 {claimed[:16]}..., it holds "
                f"{held[:16]}...: load the whole weights first (the frozen part changed, or the engine was "
                "built otherwise)"
            )

    def check(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` (the flat form: ``weight_update.WeightUpdate.to_state``) without its ``HELD_KEY`` entry,
        after ``verify`` of that claim."""
        rest = {k: v for k, v in state.items() if k != HELD_KEY}
        self.verify(rest, claim_hex(state[HELD_KEY]) if HELD_KEY in state else None)
        return rest
