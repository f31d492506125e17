"""The learner's one per-step exchange: a flat fp32 tensor every rank fills alike, read through named views.

A step's values that every rank must end with (each trajectory's log-probs of tokens[1:], one loss per
micro-batch, the count of tokens the estimator gated, the count of non-finite micro-batch losses) are
written into one flat tensor, zeros where another rank's micro-batch goes, summed over the ranks once
(x + 0 is exact) and copied to the host once. ``StepExchange`` owns the layout; callers name what they
write and read (``logps(i)``, ``loss(j)``, ``gated``, ``nonfinite``), never a position.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rz_agents.model.logprobs import packed_token_logprobs


class StepExchange:
    """The flat exchange tensor of one step over ``lengths`` (trajectory token counts) and ``num_losses``
    micro-batch losses (0 for a scoring pass that carries log-probs only).

    Layout: ``[logps of traj 0 | logps of traj 1 | ... | loss 0 .. loss M-1 | gated | nonfinite]``, where
    trajectory i contributes ``lengths[i] - 1`` log-probs; the two counters only ``with_counters`` (the
    training pass; a scoring pass carries log-probs only)."""

    def __init__(
        self,
        lengths: Sequence[int],
        device: torch.device | str,
        num_losses: int = 0,
        with_counters: bool = False,
    ) -> None:
        self.offsets = [0]
        for n in lengths:
            self.offsets.append(self.offsets[-1] + n - 1)
        self.num_logps = self.offsets[-1]
        self.num_losses = num_losses
        self.with_counters = with_counters
        size = self.num_logps + num_losses + (2 if with_counters else 0)
        self.flat = torch.zeros(size, dtype=torch.float32, device=device)
        self._host: torch.Tensor | None = None
        self._values: list[float] | None = None

    # -- writing (device side, before the exchange) ---------------------------------------------------
    def put_logps(self, i: int, lp: torch.Tensor) -> None:
        """Trajectory ``i``'s log-probs of tokens[1:]."""
        self.flat[self.offsets[i] : self.offsets[i + 1]] = lp.detach().float()

    def put_loss(self, j: int, loss: torch.Tensor) -> None:
        """Micro-batch ``j``'s summed loss."""
        self.flat[self.num_logps + j] = loss.detach().float()

    def add_gated(self, n_gated: torch.Tensor | int) -> None:
        """Tokens the estimator clipped, gated or masked in one micro-batch (a device tensor or 0)."""
        self.flat[self.num_logps + self.num_losses] += n_gated

    def add_nonfinite(self, loss: torch.Tensor) -> None:
        """Count ``loss`` if it is not finite (on the device: nothing is read back here)."""
        self.flat[self.num_logps + self.num_losses + 1] += (~torch.isfinite(loss.detach())).float()

    # -- the exchange ---------------------------------------------------------------------------------
    def exchange(self, reduce_sum) -> None:
        """Sum over the ranks (``reduce_sum``: the ranks' all-reduce, identity for one rank) and copy to the
        host: the step's one exchange and one host copy."""
        self._host = reduce_sum(self.flat).cpu()
        self._values = None

    # -- reading (host side, after the exchange) ------------------------------------------------------
    @property
    def host(self) -> torch.Tensor:
        if self._host is None:
            raise RuntimeError("StepExchange: read before exchange()")
        return self._host

    def _list(self) -> list[float]:
        if self._values is None:
            self._values = self.host.tolist()
        return self._values

    def logps(self, i: int) -> torch.Tensor:
        """Trajectory ``i``'s log-probs of tokens[1:] (a view of the host copy)."""
        return self.host[self.offsets[i] : self.offsets[i + 1]]

    def all_logps(self) -> list[torch.Tensor]:
        return [self.logps(i) for i in range(len(self.offsets) - 1)]

    def loss(self) -> float:
        """The step's loss: the micro-batch losses summed in micro-batch order (as one process does)."""
        values = self._list()
        return sum(values[self.num_logps + j] for j in range(self.num_losses))

    @property
    def gated(self) -> int:
        return int(self._list()[self.num_logps + self.num_losses])

    @property
    def nonfinite(self) -> int:
        return int(self._list()[self.num_logps + self.num_losses + 1])


def idle_pass(model: torch.nn.Module) -> torch.Tensor:
    """The pass a rank with no micro-batch of its own runs, so that every rank joins the same all-gathers and
    reduce-scatters: a 2-token dummy sequence whose summed log-prob times zero is exactly 0 (the unfiltered
    distribution's log-probs are finite)."""
    return packed_token_logprobs(model, [[0, 0]])[0].sum() * 0.0
