"""Per-step learner metrics: IS weights, behavior->learner KL, lag, lag-0 mismatch, rewards, advantages.

All functions take detached tensors over the sampled tokens of a batch. Names say what is computed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import torch


class Lag0MismatchError(AssertionError):
    """Raised (when asked) if a token sampled at the learner's version has logp_learner != behavior
    logprob."""


def _stats(prefix: str, x: Sequence[float]) -> dict[str, float]:
    if not x:
        return {f"{prefix}_mean": 0.0, f"{prefix}_std": 0.0, f"{prefix}_min": 0.0, f"{prefix}_max": 0.0}
    t = torch.tensor(list(x), dtype=torch.float64)
    return {
        f"{prefix}_mean": float(t.mean()),
        f"{prefix}_std": float(t.std(unbiased=False)),
        f"{prefix}_min": float(t.min()),
        f"{prefix}_max": float(t.max()),
    }


def reward_and_advantage_metrics(rewards: Sequence[float], advantages: Sequence[float]) -> dict[str, float]:
    """reward_{mean,std,min,max}, advantage_{mean,std,min,max}, and the share of zero-advantage samples."""
    out = _stats("reward", rewards)
    out.update(_stats("advantage", advantages))
    out["advantage_zero_fraction"] = sum(1 for a in advantages if a == 0.0) / max(len(advantages), 1)
    return out


def importance_metrics(
    logp: torch.Tensor, behavior_logp: torch.Tensor, token_versions: torch.Tensor, learner_version: int
) -> dict[str, float]:
    """Mismatch metrics over the sampled tokens of a batch (all 1-D, same length, already masked).

    is_weight_*           w = exp(logp - behavior_logp): mean, max, min, p50, p99
    is_weight_frac_above_10  share of the tokens with w > 10 (a non-finite w counts as above)
    is_weight_ess_fraction  (sum w)^2 / (n * sum w^2), in (0, 1]; 1 when all weights are equal
    kl_k1_behavior_to_learner  mean(behavior_logp - logp), an unbiased KL(behavior || learner) estimate
    kl_k3_behavior_to_learner  mean((w - 1) - log w), unbiased and >= 0 per token
    is_weight_abs_dev_mean     mean |w - 1| (the step's IS-weight deviation figure)
    lag_{min,mean,max}         learner_version - version of each token
    lag0_abs_dlogp_{max,mean}  |logp - behavior_logp| over tokens with lag 0 (exactly 0 in aligned mode)
    """
    logp = logp.detach().double()
    blp = behavior_logp.detach().double()
    n = logp.numel()
    out: dict[str, float] = {"num_sampled_tokens": float(n)}
    if n == 0:
        return out
    log_w = logp - blp
    w = torch.exp(log_w)
    finite = torch.isfinite(w)
    wf = w[finite]
    out["is_weight_nonfinite_count"] = float((~finite).sum())
    out["is_weight_frac_above_10"] = float(((w > 10.0) | ~finite).double().mean())
    if wf.numel():
        q = torch.quantile(wf, torch.tensor([0.5, 0.99], dtype=torch.float64))
        out.update(
            is_weight_mean=float(wf.mean()),
            is_weight_max=float(wf.max()),
            is_weight_min=float(wf.min()),
            is_weight_p50=float(q[0]),
            is_weight_p99=float(q[1]),
            is_weight_ess_fraction=float(wf.sum() ** 2 / (wf.numel() * (wf**2).sum()).clamp(min=1e-300)),
            is_weight_abs_dev_mean=float((wf - 1.0).abs().mean()),
        )
    out["kl_k1_behavior_to_learner"] = float((-log_w).mean())
    out["kl_k3_behavior_to_learner"] = float(((w - 1.0) - log_w).mean())
    lag = learner_version - token_versions.long()
    out.update(lag_min=float(lag.min()), lag_mean=float(lag.double().mean()), lag_max=float(lag.max()))
    lag0 = lag == 0
    out["lag0_token_count"] = float(lag0.sum())
    if lag0.any():
        d = (logp[lag0] - blp[lag0]).abs()
        out["lag0_abs_dlogp_max"] = float(d.max())
        out["lag0_abs_dlogp_mean"] = float(d.mean())
    return out


def lag_histogram(lags: torch.Tensor, max_lag: int) -> dict[str, float]:
    """Token counts per lag bucket (0, 1, 2-3, 4-7, ... up to max_lag), keys lag_hist_<lo>_<hi>."""
    out: dict[str, float] = {}
    lo = 0
    while lo <= max_lag:
        hi = 0 if lo == 0 else min(2 * lo - 1, max_lag)
        out[f"lag_hist_{lo}_{hi}"] = float(((lags >= lo) & (lags <= hi)).sum())
        lo = hi + 1
    return out


def lag_buckets(max_lag: int) -> list[tuple[int, int]]:
    """The lag buckets of ``lag_histogram``: (0, 0), (1, 1), (2, 3), (4, 7), ... with the last ending at
    max_lag."""
    out, lo = [], 0
    while lo <= max_lag:
        hi = 0 if lo == 0 else min(2 * lo - 1, max_lag)
        out.append((lo, hi))
        lo = hi + 1
    return out


def staleness_metrics(
    token_lags: Sequence[Sequence[int]], max_lag: int
) -> tuple[dict[str, float], list[int], list[int]]:
    """Token-weighted staleness of a trained batch, from each trajectory's sampled-token lags
    (learner version - the version that sampled the token).

    Returns (metrics, every token's lag, every trajectory's oldest lag). The metrics, per lag bucket of
    ``lag_buckets`` (lags above max_lag, which the bound excludes, fall in no bucket):

    lag_token_frac_<lo>_<hi>        share of the batch's sampled tokens with that lag
    lag_oldest_traj_<lo>_<hi>       trajectories whose oldest sampled token has that lag
    lag_oldest_token_frac_<lo>_<hi> share of the tokens that belong to those trajectories (token-weighted)
    lag_oldest_mean / _max          mean / max over trajectories of the oldest token's lag
    lag_oldest_token_mean           the same mean, each trajectory weighted by its sampled tokens
    lag_sampled_tokens              the sampled tokens counted (to weigh steps when summing a run)
    """
    rows = [[int(x) for x in lags] for lags in token_lags if len(lags)]
    flat = [x for lags in rows for x in lags]
    oldest = [max(lags) for lags in rows]
    out: dict[str, float] = {}
    if not rows:
        return out, flat, oldest
    n_tok = len(flat)
    sizes = [len(lags) for lags in rows]
    for lo, hi in lag_buckets(max_lag):
        out[f"lag_token_frac_{lo}_{hi}"] = sum(lo <= x <= hi for x in flat) / n_tok
        inside = [i for i, o in enumerate(oldest) if lo <= o <= hi]
        out[f"lag_oldest_traj_{lo}_{hi}"] = float(len(inside))
        out[f"lag_oldest_token_frac_{lo}_{hi}"] = sum(sizes[i] for i in inside) / n_tok
    out["lag_oldest_mean"] = sum(oldest) / len(oldest)
    out["lag_oldest_max"] = float(max(oldest))
    out["lag_oldest_token_mean"] = sum(o * n for o, n in zip(oldest, sizes, strict=True)) / n_tok
    out["lag_sampled_tokens"] = float(n_tok)
    return out, flat, oldest


def staleness_histogram(rows: list[dict]) -> dict[str, dict[str, float]]:
    """The run's staleness histograms, summed over its steps: per lag bucket ("lo-hi"), the share of sampled
    tokens with that lag (``token``), and the share of tokens in trajectories whose oldest token has that lag
    (``oldest_token``) and the count of such trajectories (``oldest_traj``)."""
    tokens = sum(float(r.get("lag_sampled_tokens", 0) or 0) for r in rows)
    out: dict[str, dict[str, float]] = {"token": {}, "oldest_token": {}, "oldest_traj": {}}
    buckets = sorted(
        {
            tuple(int(x) for x in k.rsplit("_", 2)[1:])
            for r in rows
            for k in r
            if k.startswith("lag_oldest_traj_")
        }
    )
    for lo, hi in buckets:
        name = f"{lo}-{hi}" if hi != lo else str(lo)
        for kind, key in (("token", "lag_token_frac"), ("oldest_token", "lag_oldest_token_frac")):
            weighted = sum(
                float(r.get(f"{key}_{lo}_{hi}", 0) or 0) * float(r.get("lag_sampled_tokens", 0) or 0)
                for r in rows
            )
            out[kind][name] = weighted / tokens if tokens else 0.0
        out["oldest_traj"][name] = sum(float(r.get(f"lag_oldest_traj_{lo}_{hi}", 0) or 0) for r in rows)
    return out


def ess_by_lag_bucket(log_w: torch.Tensor, lags: torch.Tensor, max_lag: int) -> dict[str, float]:
    """Kish ESS/n of the IS weights within each lag bucket of ``lag_histogram`` that has tokens, keys
    is_weight_ess_fraction_lag_<lo>_<hi>: which staleness the batch's effective sample size is lost to."""
    out: dict[str, float] = {}
    w = torch.exp(log_w.detach().double())
    lo = 0
    while lo <= max_lag:
        hi = 0 if lo == 0 else min(2 * lo - 1, max_lag)
        sel = w[(lags >= lo) & (lags <= hi) & torch.isfinite(w)]
        if sel.numel():
            ess = sel.sum() ** 2 / (sel.numel() * (sel**2).sum()).clamp(min=1e-300)
            out[f"is_weight_ess_fraction_lag_{lo}_{hi}"] = float(ess)
        lo = hi + 1
    return out


class DeviationTracker:
    """Running peak / median of the per-step IS-weight deviation figure over a run."""

    def __init__(self) -> None:
        self.history: list[float] = []

    def update(self, deviation: float) -> dict[str, float]:
        """Record one step's deviation; return the run's peak, median and peak/median ratio so far."""
        if math.isfinite(deviation):
            self.history.append(deviation)
        if not self.history:
            return {}
        peak = max(self.history)
        median = statistics.median(self.history)
        ratio = peak / median if median > 0 else (1.0 if peak == 0 else math.inf)
        return {
            "is_weight_abs_dev_run_peak": peak,
            "is_weight_abs_dev_run_median": median,
            "is_weight_abs_dev_run_peak_over_median": ratio,
        }
