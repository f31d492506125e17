"""Fused projections: several nn.Linear layers over one input computed as one GEMM over their stacked weights.

q/k/v (and an MLP's gate/up) read the same input; one GEMM over the weights stacked row-wise, [q+k+v, hidden],
reads the input once and launches once instead of three times. Each output column is still one dot product
over the same K in the same order, so its bits are the parts' bits: by construction on the Triton GEMM (its
tile config depends on the dtype and M only), checked once per shape on the CPU forms
(`rz_kernels.gemm.fusion_verified`; a shape that fails keeps the separate GEMMs).

The stacked tensor is the storage: each layer's parameter is re-pointed (``.data``) at its rows, so the
parameters keep their names and identities (checkpoints, weight publication, an optimizer holding them,
`load_state_dict`, the engine's in-place `load_weights` all work on the per-matrix names and write the stacked
tensor), nothing is held twice and nothing is copied per weight update. Anything that re-allocates a
parameter (`Module.to`, FSDP2 sharding, `load_state_dict(assign=True)`, a deepcopy) leaves it outside the
storage: `current()` sees that and the layers run unfused, with the same bits, until `fuse` is called again.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.autograd.graph import increment_version

from rz_agents.model.lora_math import adapted


class FusedLinears:
    """The rows of ``linears``' weights (and biases) in one tensor; their parameters are views of it."""

    def __init__(self, linears: Sequence[nn.Linear]) -> None:
        self.linears = tuple(linears)
        self.sizes = tuple(int(m.weight.shape[0]) for m in self.linears)
        with torch.inference_mode(False), torch.no_grad():  # a normal tensor: later in-place loads must work
            self.weight = torch.cat([m.weight.detach() for m in self.linears])
            has_bias = [m.bias is not None for m in self.linears]
            if any(has_bias) and not all(has_bias):
                raise ValueError("fused linears must all have a bias or none")
            self.bias = torch.cat([m.bias.detach() for m in self.linears]) if all(has_bias) else None
            start = 0
            for m, n in zip(self.linears, self.sizes, strict=True):
                m.weight.data = self.weight[start : start + n]
                if self.bias is not None:
                    m.bias.data = self.bias[start : start + n]
                start += n
        self._ptrs = self._pointers()
        self._versions = self._stamp()

    def _params(self) -> list[torch.Tensor]:
        return [p for m in self.linears for p in (m.weight, m.bias) if p is not None]

    def _pointers(self) -> tuple[int, ...]:
        return tuple(p.data_ptr() for p in self._params())

    def _stamp(self) -> tuple[int, ...]:
        return tuple(p._version for p in self._params())

    def current(self) -> bool:
        """Whether every parameter still lives in the stacked storage (host-side pointer checks only)."""
        return self._pointers() == self._ptrs

    def __call__(self, x: torch.Tensor, ops) -> tuple[torch.Tensor, ...]:
        """Each layer's output of x, from one GEMM over the stacked weight (column views of its result)."""
        # A parameter written in place (p.copy_) bumps its own version counter, not the stacked tensor's
        # (a `.data` view has its own): pass the bump on, so caches keyed on the stacked tensor's version
        # (the CPU GEMM's packed weights) are rebuilt.
        stamp = self._stamp()
        if stamp != self._versions:
            increment_version(self.weight)
            if self.bias is not None:
                increment_version(self.bias)
            self._versions = stamp
        return ops.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)

    def usable(self, ops) -> bool:
        """Whether this op set computes the stacked GEMM with the parts' bits, and the storage is current."""
        return self.current() and ops.fusable(self.sizes, int(self.weight.shape[1]), self.weight.dtype)

    def __deepcopy__(self, memo) -> None:
        # A deep copy of the model clones every parameter into its own storage: the copy starts unfused
        # (instead of holding a stale stacked tensor as well).
        return None


def project(
    fused: FusedLinears | None, linears: Sequence[nn.Linear], x: torch.Tensor, ops, use_fused: bool
) -> tuple[torch.Tensor, ...]:
    """``linears``' outputs of x: one stacked GEMM where fused and allowed, else one GEMM per layer. A layer
    with a LoRA adapter gets it added to its part afterwards, the same way on both (model/lora.py)."""
    if use_fused and fused is not None and fused.usable(ops):
        parts = fused(x, ops)
    else:
        parts = tuple(ops.linear(x, m.weight, m.bias) for m in linears)
    return tuple(adapted(m, x, y, ops) for m, y in zip(linears, parts, strict=True))
