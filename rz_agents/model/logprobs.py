"""Per-token log-probabilities from the model: the learner's side of the IS weight."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rz_agents.model.transformer import Transformer
from rz_agents.model.vision import VLSequence
from rz_kernels import sampling_logprobs
from rz_kernels.logprobs import token_logprobs_of_logits

__all__ = ["pack", "packed_token_logprobs", "sampling_logprobs", "token_logprobs"]

# Rows of logits materialised at a time ([rows, vocab] fp32). Any value gives the same bits: the
# LM head GEMM is tiled and log-softmax is row-wise.
LOGIT_CHUNK = 512
# Above this many bytes of fp32 logits in one call, chunks are recomputed in the backward instead of kept.
KEEP_LOGITS_BYTES = 2 << 30


def _chunk_logprobs(model, hidden, targets, temperature, top_k, top_p) -> torch.Tensor:
    return token_logprobs_of_logits(model.logits(hidden), targets, temperature, top_k, top_p)


def token_logprobs(
    model: Transformer,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """fp32 log-prob of targets[i] given hidden[i], under the sampling distribution.

    With gradients on and more than KEEP_LOGITS_BYTES of logits in the call, or with
    ``model.config.activation_checkpointing``, each chunk is checkpointed: its [rows, vocab] logits are
    freed after the forward and recomputed in the backward, so a 16K-token sequence with a 151,936-wide
    head (10 GB of fp32 logits) holds one chunk at a time (the values are the same either way; smaller
    calls keep their logits and skip the recompute).
    """
    out = []
    grad = torch.is_grad_enabled() and (hidden.requires_grad or model.lm_head.weight.requires_grad)
    recompute = grad and (
        hidden.shape[0] * model.config.vocab_size * 4 > KEEP_LOGITS_BYTES
        or getattr(model.config, "activation_checkpointing", False)
    )
    for i in range(0, hidden.shape[0], LOGIT_CHUNK):
        args = (model, hidden[i : i + LOGIT_CHUNK], targets[i : i + LOGIT_CHUNK], temperature, top_k, top_p)
        if recompute:
            out.append(torch.utils.checkpoint.checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(*args))
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)


def pack(
    sequences: Sequence[Sequence[int] | torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequences as one packed forward's inputs: (tokens, positions, seq_ids), each [total tokens]."""
    seqs = [torch.as_tensor(s, dtype=torch.long) for s in sequences]
    lengths = [s.numel() for s in seqs]
    tokens = torch.cat(seqs)
    positions = torch.cat([torch.arange(n) for n in lengths])
    seq_ids = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)])
    return tokens, positions, seq_ids


def packed_token_logprobs(
    model: Transformer,
    sequences: Sequence[Sequence[int] | torch.Tensor],
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    scored: Sequence[Sequence[bool]] | None = None,
) -> list[torch.Tensor]:
    """For each sequence, fp32 [len-1] log-probs of tokens[1:] (one packed, differentiable forward). A
    sequence is its token ids, or a ``VLSequence`` with its images for a model that takes them (the one
    packer of every family: the model adds its extra forward inputs, ``Transformer.packed_inputs``).

    ``scored``: per sequence, a flag per token of tokens[1:] (e.g. the loss mask's): only the flagged
    tokens' log-probs are computed (the LM head and log-softmax skip the other rows, a prompt's included),
    the others are 0.0 with no gradient. A row's bits do not depend on which rows share the LM head's GEMM
    (the aligned op set is row-invariant), so a flagged token gets the value it gets without ``scored``.

    Nothing is read back from the device here: every index is made on the host and the inputs go up in one
    copy (pinned, non-blocking on CUDA: a copy from pageable memory would wait for the device's queue), and
    the model gets the highest position and the sequence count from the host. The one host sync left in the
    forward on the Triton op set is the attention plan's (see ``Transformer.forward``)."""
    if not sequences:
        return []
    # a VLSequence (a model that takes images) brings its images: the model packs them (``packed_inputs``)
    ids = [s.tokens if isinstance(s, VLSequence) else s for s in sequences]
    seqs = [torch.as_tensor(s, dtype=torch.long).cpu().reshape(-1) for s in ids]
    extra = model.packed_inputs(sequences, seqs)
    device = model.device
    lengths = [s.numel() for s in seqs]
    tokens, positions, seq_ids = pack(seqs)
    # Row t predicts token t+1 within the same sequence: each sequence's rows but its last, made on the host
    # (a boolean mask on the device would wait for the GPU to count it).
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    rows = torch.cat([torch.arange(a, a + n - 1) for a, n in zip(starts, lengths, strict=True) if n > 1] or
                     [torch.zeros(0, dtype=torch.long)])  # fmt: skip
    targets = torch.cat([s[1:] for s in seqs])
    picked = None if scored is None else _scored_entries(scored, lengths)
    if picked is not None:  # only these entries of the [sum(len-1)] output are computed
        rows, targets = rows[picked], targets[picked]
    host = torch.cat([tokens, positions, seq_ids, rows, targets] + ([picked] if picked is not None else []))
    if device.type == "cuda":
        host = host.pin_memory()
    flat = host.to(device, non_blocking=True)  # one upload of everything the forward needs
    t, r = tokens.numel(), rows.numel()
    tokens_d, positions_d, seq_ids_d = flat[:t], flat[t : 2 * t], flat[2 * t : 3 * t]
    rows_d, targets_d = flat[3 * t : 3 * t + r], flat[3 * t + r : 3 * t + 2 * r]
    top = max(lengths) - 1 if t else None
    hidden = model(tokens_d, positions_d, seq_ids_d, max_position=top, num_sequences=len(seqs), **extra)
    logp = token_logprobs(model, hidden[rows_d], targets_d, temperature, top_k, top_p)
    sizes = [max(n - 1, 0) for n in lengths]
    if picked is not None:  # the computed entries in place, zeros elsewhere (differentiable scatter)
        logp = logp.new_zeros(sum(sizes)).index_copy(0, flat[3 * t + 2 * r :], logp)
    return list(torch.split(logp, sizes))


def _scored_entries(scored: Sequence[Sequence[bool]], lengths: list[int]) -> torch.Tensor:
    """Indices into the packed [sum(len-1)] output of the flagged entries (``packed_token_logprobs``)."""
    if len(scored) != len(lengths):
        raise ValueError(f"scored: {len(scored)} masks for {len(lengths)} sequences")
    flags = []
    for f, n in zip(scored, lengths, strict=True):
        f = torch.as_tensor(f, dtype=torch.bool).reshape(-1)
        if f.numel() != max(n - 1, 0):
            raise ValueError(f"scored: {f.numel()} flags for a {n}-token sequence (it needs {n - 1})")
        flags.append(f)
    return torch.cat(flags).nonzero().reshape(-1) if flags else torch.zeros(0, dtype=torch.long)
