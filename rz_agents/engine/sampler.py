"""Turn logits into sampled tokens and the exact log-probabilities the learner will recompute.

The log-probabilities come from ``sampling_logprobs`` (the function the learner also uses), so the
recorded value is that of the distribution actually sampled from (temperature, top-k, top-p,
renormalised). Sampling is inverse-CDF with one uniform number per token drawn from the request's
own generator when it has a seed: a seeded request gives the same tokens whatever else is in the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from rz_agents.engine.params import SamplingParams

LogprobFn = Callable[..., torch.Tensor]


def _default_logprob_fn() -> LogprobFn:
    from rz_agents.model.logprobs import sampling_logprobs

    return sampling_logprobs


def sample(
    logits: torch.Tensor,
    params: Seq[SamplingParams],
    generators: Seq[torch.Generator | None],
    default_generator: torch.Generator,
    logprob_fn: LogprobFn | None = None,
) -> tuple[list[int], list[float]]:
    """Sample one token per row of ``logits`` [n, vocab]; returns (tokens, recorded logprobs).

    Rows with the same (temperature, top_k, top_p) go through ``logprob_fn`` together; that function
    is row-independent, so grouping changes no value.
    """
    logprob_fn = logprob_fn or _default_logprob_fn()
    n = logits.shape[0]
    tokens = [0] * n
    values = [0.0] * n
    groups: dict[tuple[float, int, float], list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault((p.logprob_temperature, p.top_k, p.top_p), []).append(i)
    # One uniform per sampled row; drawn in row order from the engine's generator unless seeded.
    uniforms = torch.empty(n, dtype=torch.float64)
    for i, (p, g) in enumerate(zip(params, generators, strict=True)):
        if not p.greedy:
            uniforms[i] = torch.rand((), dtype=torch.float64, generator=g or default_generator)
    for (temperature, top_k, top_p), rows in groups.items():
        whole = len(rows) == n  # the common case: one group, no row gather (a 150k-wide copy per row)
        idx = None if whole else torch.tensor(rows)
        group_logits = logits if whole else logits[idx.to(logits.device)]
        logp = logprob_fn(group_logits, temperature=temperature, top_k=top_k, top_p=top_p)
        greedy = [params[i].greedy for i in rows]
        group_uniforms = (uniforms if whole else uniforms[idx]).to(logits.device)
        chosen = _draw(logp, group_logits, group_uniforms, greedy)
        picked = logp.gather(1, chosen[:, None])[:, 0]
        for i, token, value in zip(rows, chosen.tolist(), picked.tolist(), strict=True):
            tokens[i] = int(token)
            values[i] = float(value)
    return tokens, values


# Inverse-CDF in two levels: pick a block of the vocabulary by its mass, then a token inside the block.
# A full float64 cumsum over a 150k vocabulary per row dominated the step otherwise.
CDF_BLOCK = 1024


def _draw(logp: torch.Tensor, logits: torch.Tensor, u: torch.Tensor, greedy: list[bool]) -> torch.Tensor:
    """Inverse-CDF draw from exp(logp) per row; argmax of the raw logits for greedy rows."""
    device = logp.device
    out = torch.empty(logp.shape[0], dtype=torch.long, device=device)
    sampled = [j for j, g in enumerate(greedy) if not g]
    greedy_rows = [j for j, g in enumerate(greedy) if g]
    if greedy_rows:
        out[greedy_rows] = logits[greedy_rows].argmax(dim=-1)
    if not sampled:
        return out
    probs = (logp if len(sampled) == logp.shape[0] else logp[sampled]).exp()
    n, vocab = probs.shape
    full = vocab // CDF_BLOCK
    # Block masses in fp32 (each a sum of <= 1024 terms), then a float64 CDF over the blocks.
    masses = [probs[:, : full * CDF_BLOCK].view(n, full, CDF_BLOCK).sum(-1)] if full else []
    if full * CDF_BLOCK < vocab:
        masses.append(probs[:, full * CDF_BLOCK :].sum(-1, keepdim=True))
    block_mass = torch.cat(masses, dim=1).double()  # [n, nb]
    block_cdf = block_mass.cumsum(-1)
    threshold = u[sampled].double() * block_cdf[:, -1]
    # right=True: the first block whose cumulative mass exceeds the threshold has mass > 0.
    b = torch.searchsorted(block_cdf, threshold[:, None], right=True)[:, 0]
    b = torch.minimum(b, _last_positive(block_mass))
    rows = torch.arange(n, device=device)
    rest = threshold - (block_cdf[rows, b] - block_mass[rows, b])
    inner = _block_probs(probs, b, gather=device.type != "cpu")
    i = torch.searchsorted(inner.cumsum(-1), rest[:, None], right=True)[:, 0]
    # Rounding can leave the remainder at (or past) the block total: take its last token with mass.
    i = torch.minimum(i, _last_positive(inner))
    out[sampled] = b * CDF_BLOCK + i
    return out


def _block_probs(probs: torch.Tensor, block: torch.Tensor, gather: bool) -> torch.Tensor:
    """float64 [n, CDF_BLOCK]: row r's probabilities in vocabulary block block[r] (zero past the end).

    On CPU one slice copy per row is cheapest; on a GPU one gather (a per-row loop would synchronise
    once per row). Both give the same values.
    """
    n, vocab = probs.shape
    if gather:
        cols = block[:, None] * CDF_BLOCK + torch.arange(CDF_BLOCK, device=probs.device)
        return torch.where(cols < vocab, probs.gather(1, cols.clamp(max=vocab - 1)), 0.0).double()
    inner = torch.zeros(n, CDF_BLOCK, dtype=torch.float64)
    for r in range(n):
        start = int(block[r]) * CDF_BLOCK
        chunk = probs[r, start : start + CDF_BLOCK]
        inner[r, : chunk.numel()] = chunk
    return inner


def _last_positive(x: torch.Tensor) -> torch.Tensor:
    """Index of the last entry > 0 in each row (rows always have one: a distribution's support)."""
    idx = torch.arange(x.shape[-1], device=x.device).expand_as(x)
    return torch.where(x > 0, idx, -1).amax(-1)
