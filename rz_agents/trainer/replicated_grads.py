"""Gradients of parameters every learner rank holds whole (LoRA adapters on FSDP2 ranks), summed as one
process sums them.

One process adds its micro-batches' gradients in micro-batch order: ``((g0 + g1) + g2) + ...``. The ranks run
micro-batch ``j`` on rank ``j % world`` (``ShardedRanks.share``), so after each round of micro-batches (one
per rank, an idle pass where a rank has none) the ranks all-gather that round's gradients, one flat fp32 row
per rank, and every rank adds the rows in rank order, which is micro-batch order. The additions are the one
process's, in its order, so the sums, the gradient norm, the AdamW step and the updated adapters are its bits
(an all-reduce would add the ranks' partial sums in another grouping: close, not equal). An all-gather moves
only copies; a round sends ``world`` rows of the adapters' size, which for adapters is small (Qwen3-4B r=16
on all seven projections: 33M parameters, 132 MB per row in fp32).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rz_agents.trainer.master_weights import MasterWeights


class ReplicatedGrads:
    """Per round of micro-batches: take this rank's gradients of ``params`` (dropping them there), all-gather
    the round's rows, and add the real micro-batches' rows into ``master_weights``' sums in order."""

    def __init__(self, params: Sequence[torch.Tensor], master_weights: MasterWeights, ranks) -> None:
        self.params = list(params)
        self.master_weights = master_weights
        self.ranks = ranks
        self.sizes = [p.numel() for p in self.params]
        self.sums: list[torch.Tensor] | None = None  # this step's, in fp32 (kept off the parameters, whose
        # .grad the next backward writes into)

    def _take_row(self, ran: bool) -> torch.Tensor:
        """This rank's micro-batch gradients as one flat fp32 row (zeros after an idle pass, whose gradients,
        times 0, are never added); the parameters' gradients are None afterwards."""
        device = self.params[0].device
        parts = []
        for p in self.params:
            g = p.grad
            p.grad = None
            if not ran or g is None:  # (an adapter always has a gradient: every target layer runs)
                parts.append(torch.zeros(p.numel(), dtype=torch.float32, device=device))
            else:
                parts.append(g.detach().float().reshape(-1))
        return torch.cat(parts)

    def after_backward(self, round_index: int, ran: bool, num_micro_batches: int) -> None:
        """After this rank's backward in round ``round_index`` (``ran`` False: an idle pass): exchange the
        round's rows (a collective: every rank calls it once per round) and add those of real micro-batches
        (``round_index * world + rank`` < ``num_micro_batches``) in micro-batch order: the first taken as it
        is, each later one added, as one process's accumulation does (the same additions, the same bits)."""
        rows = self.ranks.all_gather(self._take_row(ran))
        start = round_index * self.ranks.world
        for r in range(min(self.ranks.world, num_micro_batches - start)):
            parts = torch.split(rows[r], self.sizes)
            grads = [g.view(p.shape) for g, p in zip(parts, self.params, strict=True)]
            if self.sums is None:
                self.sums = [g.clone() for g in grads]
            else:
                for total, g in zip(self.sums, grads, strict=True):
                    total.add_(g)

    def finish(self) -> None:
        """After the step's last round: the sums become the optimized tensors' gradients (none: no
        micro-batch ran, and the caller zeroes them as one process does)."""
        if self.sums is not None:
            self.master_weights.set_sums(self.sums)
        self.sums = None
