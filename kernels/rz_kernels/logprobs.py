"""Log-probabilities of the distribution a sampler actually draws from.

One function for the engine's sampler and for the learner: the engine samples from
exp(sampling_logprobs(logits, ...)) and records the value at the sampled token; the learner calls
the same function on its own logits. Everything is fp32 and row-wise, so in aligned mode the two
agree bitwise at lag 0. On CUDA the row log-softmax is the Triton kernel (one program per row:
torch's CUDA log-softmax gives no batch-invariance guarantee); on CPU it is torch's, which is row-wise.
"""

from __future__ import annotations

import torch

from rz_kernels.elementwise import aligned_unary


def sampling_logprobs(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """[n, V] fp32 log-probs after temperature, top-k and top-p (-inf outside the support).

    temperature <= 0 means greedy decoding; the recorded log-prob is then that of the
    untempered distribution (a point mass has log-prob 0 and carries no information).
    """
    x = logits.float()
    if temperature > 0 and temperature != 1.0:
        x = x / temperature
    if top_k and 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        x = x.masked_fill(~_nucleus(x, top_p), float("-inf"))
    return row_log_softmax(x)


def row_log_softmax(x: torch.Tensor) -> torch.Tensor:
    """log_softmax over the last dim with a per-row arithmetic that never depends on the row count."""
    if x.is_cuda:
        from rz_kernels.triton_ops.softmax import log_softmax

        return log_softmax(x)
    return torch.log_softmax(x, dim=-1)


# Candidates looked at first for top-p on CPU: the nucleus of a trained model's distribution almost
# always lies within its 1,024 most likely tokens, and a partial sort of those is far cheaper than
# sorting a 150k vocabulary (1.1 s per step for 64 rows). Rows whose 1,024 best tokens hold less than
# top_p fall back to the full sort, decided row by row, so a row's result never depends on its neighbours.
NUCLEUS_CANDIDATES = 1024


def _nucleus(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """Bool mask of the smallest set of most likely tokens whose mass reaches top_p (never empty)."""
    if x.is_cuda:  # the GPU op set's form: one full sort per row
        sorted_x, sorted_idx = torch.sort(x, dim=-1, descending=True, stable=True)
        probs = torch.softmax(sorted_x, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly before each token
        return torch.zeros_like(x, dtype=torch.bool).scatter(-1, sorted_idx, before < top_p)
    logp = torch.log_softmax(x, dim=-1)
    keep = torch.zeros_like(x, dtype=torch.bool)
    k = min(NUCLEUS_CANDIDATES, x.shape[-1])
    rows = torch.arange(x.shape[0], device=x.device)
    while rows.numel():
        top, idx = torch.topk(logp[rows], k, dim=-1)  # sorted, most likely first
        probs = aligned_unary(torch.exp, top)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly before each token
        done = (before[:, -1] + probs[:, -1] >= top_p) | (k == x.shape[-1])
        sel = rows[done]
        keep[sel] = torch.zeros_like(keep[sel]).scatter(-1, idx[done], before[done] < top_p)
        rows, k = rows[~done], x.shape[-1]  # the rest: every token is a candidate
    return keep


def token_logprobs_of_logits(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """gather_logprobs(sampling_logprobs(logits, ...), targets), bit for bit, without the [n, V] result
    on CUDA when there is no top-k/top-p (the Triton log-softmax + gather kernel)."""
    if logits.is_cuda and not top_k and top_p >= 1.0:
        from rz_kernels.triton_ops.softmax import log_softmax_gather

        x = logits.float()
        if temperature > 0 and temperature != 1.0:
            x = x / temperature
        return log_softmax_gather(x, targets)
    return gather_logprobs(sampling_logprobs(logits, temperature, top_k, top_p), targets)


def gather_logprobs(logprobs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return logprobs.gather(-1, targets.view(-1, 1)).squeeze(-1)
