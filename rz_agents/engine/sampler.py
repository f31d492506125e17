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
        idx = torch.tensor(rows)
        logp = logprob_fn(logits[idx], temperature=temperature, top_k=top_k, top_p=top_p)
        greedy = [params[i].greedy for i in rows]
        chosen = _draw(logp, logits[idx], uniforms[idx], greedy)
        picked = logp.gather(1, chosen[:, None])[:, 0]
        for j, i in enumerate(rows):
            tokens[i] = int(chosen[j])
            values[i] = float(picked[j])
    return tokens, values


def _draw(logp: torch.Tensor, logits: torch.Tensor, u: torch.Tensor, greedy: list[bool]) -> torch.Tensor:
    """Inverse-CDF draw from exp(logp) per row; argmax of the raw logits for greedy rows."""
    out = torch.empty(logp.shape[0], dtype=torch.long)
    sampled = [j for j, g in enumerate(greedy) if not g]
    greedy_rows = [j for j, g in enumerate(greedy) if g]
    if greedy_rows:
        out[greedy_rows] = logits[greedy_rows].argmax(dim=-1)
    if sampled:
        probs = logp[sampled].double().exp()  # float64 CDF: tiny probabilities are not lost
        cdf = probs.cumsum(dim=-1)
        threshold = u[sampled, None] * cdf[:, -1:]
        idx = torch.searchsorted(cdf, threshold, right=True)[:, 0]
        # Rounding can put the threshold at the total; fall back to the last token with mass.
        last_nonzero = (probs > 0).long().cumsum(-1).argmax(-1)
        out[sampled] = torch.minimum(idx, last_nonzero)
    return out
