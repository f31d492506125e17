"""The REINFORCE Zero loss and the comparison estimators, in one readable file.

Per sampled token t of a trajectory with advantage A:

    w_t  = exp(logp_learner(t) - behavior_logprob(t))      # unclipped importance weight, gradient flows through it
    loss = -(sum_t mask_t * w_t * A) / normalizer           # REINFORCE Zero

so d loss / d theta = -(sum_t mask_t * w_t * A * grad logp_learner(t)) / normalizer.

The comparison estimators differ only in the per-token coefficient that multiplies A:

    reinforce_zero   w_t                                       (the default)
    standard_is      w_t                                       (same loss; the runtime selects kernels="standard")
    on_policy        exp(logp - stopgrad(logp)) == 1           (ignores behavior logprobs; run it synchronously)
    sequence_gate    w_t * 1[exp(mean_seq(logp - blp)) in [1/c, c]]   (whole sequence kept or dropped)
    token_gate       w_t * 1[w_t in [1/c, c]]                   (token kept or dropped)
    truncated_is     stopgrad(min(w_t, c)) * exp(logp - stopgrad(logp))   (gradient min(w, c) * A * grad logp)
    ppo_clip         min(w_t * A, clip(w_t, 1-eps, 1+eps) * A) / A   (behavior policy as the old policy)

The normalizer is folded into a per-token ``scale`` computed once for the whole batch (see
``token_scales``), so that the sum of micro-batch losses equals the loss of the whole batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ESTIMATORS = (
    "reinforce_zero",
    "standard_is",
    "on_policy",
    "sequence_gate",
    "token_gate",
    "truncated_is",
    "ppo_clip",
)
NORMALIZATIONS = ("token", "sequence")


@dataclass
class LossConfig:
    """Which estimator, and its one knob.

    ``gate_ratio`` is c for sequence_gate / token_gate (keep ratios in [1/c, c]); ``truncation_cap`` is C for
    truncated_is; ``ppo_clip_eps`` is eps for ppo_clip.
    """

    estimator: str = "reinforce_zero"
    normalization: str = "token"
    gate_ratio: float = 2.0
    truncation_cap: float = 2.0
    ppo_clip_eps: float = 0.2

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"loss.estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"loss.normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}"
            )
        if not self.gate_ratio > 1.0:
            raise ValueError(f"loss.gate_ratio must be > 1, got {self.gate_ratio}")
        if not self.truncation_cap > 0.0:
            raise ValueError(f"loss.truncation_cap must be > 0, got {self.truncation_cap}")
        if not 0.0 < self.ppo_clip_eps < 1.0:
            raise ValueError(f"loss.ppo_clip_eps must be in (0, 1), got {self.ppo_clip_eps}")


def token_scales(masks: list[torch.Tensor], normalization: str) -> list[torch.Tensor]:
    """Per-token factor 1/normalizer for every sequence of the batch (0 on unmasked tokens).

    token:    every sampled token of the batch counts once: 1 / (total sampled tokens).
    sequence: every sequence counts once: 1 / (num sequences * sampled tokens of that sequence).
    """
    if normalization == "token":
        total = sum(int(m.sum()) for m in masks)
        return [m.float() / max(total, 1) for m in masks]
    if normalization == "sequence":
        n_seq = len(masks)
        return [m.float() / (n_seq * max(int(m.sum()), 1)) for m in masks]
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")


def _kept_weights(log_ratio: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """w_t where keep, exactly 0 elsewhere, with no inf formed on dropped tokens (inf * 0 would give NaN
    in the value or the gradient: a gate exists to drop such tokens, not to poison the step)."""
    safe = torch.where(keep, log_ratio, torch.zeros_like(log_ratio))
    return torch.exp(safe) * keep.to(log_ratio.dtype)


def token_coefficients(logp: torch.Tensor, behavior_logp: torch.Tensor, mask: torch.Tensor, cfg: LossConfig):
    """For one sequence: the per-token coefficient c_t such that the loss is -(sum_t scale_t * c_t * A).

    ``logp`` carries the gradient; ``behavior_logp`` and ``mask`` are data. Returns a tensor shaped like logp.
    ppo_clip is not of this form (it depends on the sign of A) and is handled in ``sequence_loss``.
    """
    log_ratio = logp - behavior_logp
    w = torch.exp(log_ratio)  # unclipped; may be inf: the learner's guard skips such a step
    est = cfg.estimator
    if est in ("reinforce_zero", "standard_is"):
        return w
    if est == "on_policy":
        return torch.exp(logp - logp.detach())
    bound = math.log(cfg.gate_ratio)
    if est == "sequence_gate":
        n = mask.sum().clamp(min=1)
        seq_log_ratio = (log_ratio.detach() * mask).sum() / n  # log of the geometric-mean ratio
        keep = (seq_log_ratio.abs() <= bound).expand_as(w)
        return _kept_weights(log_ratio, keep)
    if est == "token_gate":
        return _kept_weights(log_ratio, log_ratio.detach().abs() <= bound)
    if est == "truncated_is":
        return torch.clamp(w.detach(), max=cfg.truncation_cap) * torch.exp(logp - logp.detach())
    raise ValueError(f"estimator {est!r} has no token coefficient")


def sequence_loss(
    logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    advantage: float,
    scale: torch.Tensor,
    cfg: LossConfig,
) -> torch.Tensor:
    """This sequence's share of the batch loss (a scalar); summing over the batch gives the loss.

    logp, behavior_logp, mask, scale: [n] for the n predicted tokens of the sequence (tokens[1:]).
    """
    mask_f = mask.to(logp.dtype)
    # Unsampled positions carry no behavior logprob: give them w = 1 so that nothing non-finite is ever
    # formed there (0 * inf in the backward pass would be NaN even behind a mask).
    behavior_logp = torch.where(mask, behavior_logp, logp.detach())
    if cfg.estimator == "ppo_clip":
        w = torch.exp(logp - behavior_logp)
        surrogate = torch.minimum(
            w * advantage, torch.clamp(w, 1.0 - cfg.ppo_clip_eps, 1.0 + cfg.ppo_clip_eps) * advantage
        )
    else:
        surrogate = token_coefficients(logp, behavior_logp, mask, cfg) * advantage
    return -(surrogate * scale * mask_f).sum()
