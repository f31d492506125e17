"""The fp32 master weights of a learner whose model is held in a low-precision dtype (bf16, fp16).

The engine samples with the model's own weights, so the learner trains in the model's dtype where it
computes (forward and backward) and in fp32 where it updates: AdamW and its state live on fp32 tensors, the
gradients of all micro-batches are summed there in fp32, and after each step the fp32 weights are rounded
(to nearest even) into the model.

Where those fp32 tensors live is the learner's ranks' choice, stated by ``ranks.shards_trained``:

- one process (``SingleProcess``): the model's parameters stay in its dtype, and ``MasterWeights`` keeps a
  separate fp32 copy of each; every micro-batch's low-precision gradients move into fp32 sums on the copies.
- FSDP2 ranks (``ShardedRanks``): the sharded parameters are fp32 and ARE the masters (FSDP2 rounds each
  shard to the compute dtype when it all-gathers, and reduce-scatters the gradients into fp32); there is no
  second copy, nothing to accumulate by hand and nothing to copy back.
- an fp32 model: the parameters are already fp32; there are no masters.

Which case applies to the trained parameters is ``ranks.shards_trained``: FSDP2 ranks training LoRA adapters
keep the adapters whole on every rank (only the frozen base is sharded), so the adapters get separate fp32
copies as in one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class Ranks(Protocol):
    """What ``MasterWeights`` needs of the learner's ranks (``SingleProcess`` or ``ShardedRanks``)."""

    shards_trained: bool

    def full(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def shard_like(self, full: torch.Tensor, like: torch.Tensor) -> torch.Tensor: ...


class MasterWeights:
    """The tensors AdamW optimizes for ``params`` (the model's trainable parameters, after the ranks
    prepared the model) and their sync with the model's working dtype.

    ``working_dtype`` is the dtype the model computes and the engine samples in (the model's dtype before
    the ranks prepared it). Masters exist when it is not fp32: separate fp32 copies (``copies``) unless
    the ranks keep fp32 shards themselves (``in_shards``).
    """

    def __init__(self, params: Sequence[torch.Tensor], working_dtype: torch.dtype, ranks: Ranks):
        self.params = list(params)
        self.working_dtype = working_dtype
        self.ranks = ranks
        low_precision = working_dtype != torch.float32
        self.in_shards = low_precision and ranks.shards_trained
        self.copies: list[torch.Tensor] | None = None
        if low_precision and not ranks.shards_trained:
            self.copies = [p.detach().float().clone().requires_grad_(True) for p in self.params]

    @property
    def exist(self) -> bool:
        """Whether the model trains through fp32 masters (separate copies or the ranks' fp32 shards)."""
        return self.copies is not None or self.in_shards

    def optimized(self) -> list[torch.Tensor]:
        """The tensors AdamW updates: the fp32 copies, or the parameters themselves (fp32, or fp32 shards)."""
        return self.copies if self.copies is not None else self.params

    def zero_grads(self) -> None:
        """Drop every gradient, the model's and the masters' (the next backward starts from None)."""
        for p in self.params:
            p.grad = None
        if self.copies is not None:
            for m in self.copies:
                m.grad = None

    def zero_sums(self) -> None:
        """Set the optimized tensors' gradients to zeros (a step over no micro-batch still steps AdamW)."""
        for p in self.optimized():
            p.grad = torch.zeros_like(p)

    def accumulate(self) -> None:
        """Move one micro-batch's low-precision gradients into the fp32 sums on the copies (call after each
        backward; the model's gradients are then None). Nothing to do without separate copies."""
        if self.copies is None:
            return
        for p, m in zip(self.params, self.copies, strict=True):
            if p.grad is None:
                continue
            g = p.grad.float()
            m.grad = g if m.grad is None else m.grad.add_(g)
            p.grad = None

    def set_sums(self, sums: Sequence[torch.Tensor]) -> None:
        """Make ``sums`` (fp32, one per parameter, in ``params`` order: gradients summed elsewhere, as
        ``accumulate`` sums them) the optimized tensors' gradients; the parameters' own are dropped."""
        for p in self.params:
            p.grad = None
        for p, g in zip(self.optimized(), sums, strict=True):
            p.grad = g.to(p.dtype)  # (fp32 copies, or an fp32 model's parameters: no rounding)

    @torch.no_grad()
    def round_into_model(self) -> None:
        """After an optimizer step: the copies rounded (to nearest even) into the model's parameters."""
        if self.copies is None:
            return
        for p, m in zip(self.params, self.copies, strict=True):
            p.copy_(m)

    def state(self) -> list[torch.Tensor] | None:
        """The whole fp32 masters in ``params`` order, for a checkpoint (None without masters). Sharded: the
        shards are gathered (a collective: call on every rank), so the layout is one process's."""
        if self.copies is not None:
            return [m.detach().clone() for m in self.copies]
        if self.in_shards:
            return [self.ranks.full(p.detach()) for p in self.params]
        return None

    @torch.no_grad()
    def load(self, saved: Sequence[torch.Tensor] | None, weights: Sequence[torch.Tensor]) -> None:
        """Set the optimized tensors from ``saved`` (what ``state`` returned) or, where it is None, from
        ``weights`` (each parameter's whole weight, in ``params`` order).

        One process: the model's parameters were loaded already; the copies (if any) take ``saved`` or the
        weights. Ranks with sharded parameters: each parameter takes its shard of the fp32 tensor."""
        if self.ranks.shards_trained:
            for i, p in enumerate(self.params):
                full = saved[i] if saved is not None else weights[i]
                p.copy_(self.ranks.shard_like(full.float(), p))
            return
        if self.copies is not None:
            for i, m in enumerate(self.copies):
                m.copy_(saved[i] if saved is not None else weights[i])
