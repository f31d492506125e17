"""Per-token log-probabilities from the model: the learner's side of the IS weight."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.checkpoint import checkpoint

from rz_agents.model.transformer import Transformer
from rz_kernels import gather_logprobs, sampling_logprobs

__all__ = ["packed_token_logprobs", "sampling_logprobs", "token_logprobs"]

# Rows of logits materialised at a time ([rows, vocab] fp32). Any value gives the same bits: the
# LM head GEMM is tiled and log-softmax is row-wise.
LOGIT_CHUNK = 512


def token_logprobs(
    model: Transformer,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """fp32 log-prob of targets[i] given hidden[i], under the sampling distribution.

    With ``model.config.activation_checkpointing`` and gradients on, each chunk's logits are
    recomputed in the backward instead of kept ([LOGIT_CHUNK, vocab] fp32 per chunk otherwise).
    """

    def chunk_logprobs(h: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return gather_logprobs(sampling_logprobs(model.logits(h), temperature, top_k, top_p), tgt)

    recompute = getattr(model.config, "activation_checkpointing", False) and torch.is_grad_enabled()
    out = []
    for i in range(0, hidden.shape[0], LOGIT_CHUNK):
        h, tgt = hidden[i : i + LOGIT_CHUNK], targets[i : i + LOGIT_CHUNK]
        out.append(
            checkpoint(chunk_logprobs, h, tgt, use_reentrant=False) if recompute else chunk_logprobs(h, tgt)
        )
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)


def packed_token_logprobs(
    model: Transformer,
    sequences: Sequence[Sequence[int] | torch.Tensor],
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> list[torch.Tensor]:
    """For each sequence, fp32 [len-1] log-probs of tokens[1:] (one packed, differentiable forward)."""
    seqs = [torch.as_tensor(s, dtype=torch.long) for s in sequences]
    if not seqs:
        return []
    lengths = [s.numel() for s in seqs]
    tokens = torch.cat(seqs)
    positions = torch.cat([torch.arange(n) for n in lengths])
    seq_ids = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)])
    hidden = model(tokens, positions, seq_ids)
    # Row t predicts token t+1 within the same sequence: drop each sequence's last row.
    keep = torch.ones(tokens.numel(), dtype=torch.bool)
    ends = torch.cumsum(torch.tensor(lengths), 0) - 1
    keep[ends] = False
    targets = torch.cat([s[1:] for s in seqs])
    logp = token_logprobs(model, hidden[keep], targets, temperature, top_k, top_p)
    return list(torch.split(logp, [max(n - 1, 0) for n in lengths]))
