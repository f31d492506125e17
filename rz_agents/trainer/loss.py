"""The REINFORCE Zero loss and the comparison estimators, in one readable file.

Per sampled token t of a trajectory with advantage A, with w_t = exp(logp_learner(t) - behavior_logprob(t)):

    loss = -(sum_t scale_t * s_t) ,   s_t = c_t * A  (the per-token surrogate)   # scale_t = 1/normalizer

REINFORCE Zero (the default) is c_t = w_t: the unclipped importance weight, gradient flowing through it, so
d loss / d theta = -(sum_t scale_t * w_t * A * grad logp_learner(t)).

Every estimator is one entry of ``ESTIMATOR_TABLE`` (name -> ``Estimator``): its surrogate s_t and which
tokens it clipped, gated or masked (``gated_t``, counted per step as ``estimator_clipfrac``). sg() is
stop-gradient, 1[.] an indicator, and "the batch" is every sampled token of the learner step:

    reinforce_zero   w_t                                               (the default)
    on_policy        exp(logp - sg(logp)) == 1    (ignores behavior logprobs; run it synchronously)
    sequence_gate    w_t * 1[exp(mean_seq(logp - blp)) in [1/c, c]]    (whole sequence kept or dropped)
    token_gate       w_t * 1[w_t in [1/c, c]]                          (token kept or dropped)
    icepop           w_t * 1[w_t in [1/b, b]]     (IcePop's ratio band; with one update per batch the
                                                   learner's pre-update policy is the current one, so this
                                                   is token_gate with its own band b, default [1/2, 2])
    truncated_is     sg(min(w_t, C)) * exp(logp - sg(logp))            (gradient min(w, C) * A * grad logp)
    ppo_clip         min(w_t A, clip(w_t, 1-eps, 1+eps) A) / A         (behavior policy as the old policy)
    dual_clip        ppo_clip's surrogate, and for A < 0 also bounded below by c * A:
                     max(min(w_t A, clip(w_t, 1-eps, 1+eps) A), c A)   (dual-clip PPO, Ye et al. 2020: a
                     token the learner now likes w >> 1 times more than its sampler did, with a negative
                     advantage, pushes with weight at most c instead of w; no gradient beyond c)
    m2po             w_t * keep_t, keep = the largest set of the batch's tokens, taken in increasing
                     (log w)^2, whose mean (log w)^2 <= tau (M2PO's second-moment trust bound): the
                     tokens that push the batch's second moment of the log ratio above tau are masked
    snis             w_t / sg(mean_batch w)       (self-normalized token IS: the weights average to 1)
    decoupled_ppo    sg(v_t) * 1[v_t <= V] * min(r_t A, clip(r_t, 1-eps, 1+eps) A),
                     v_t = exp(logp_prox - blp)   (behavior -> proximal IS weight; tokens above V masked)
                     r_t = exp(logp - logp_prox)  (the trust-region ratio against the proximal policy)

Any estimator can add a restoring term, ``behavior_kl_coef`` = beta (default 0: off, the recipe unchanged):

    s_t  ->  s_t - beta * (log w_t)^2 / 2      (the k2 estimate of KL(behavior || learner)
                                                on the sampled tokens)

whose gradient, -beta * log w_t * grad logp, pulls every sampled token's log-prob back toward the value its
sampler recorded, in proportion to how far it moved (log w, not w: a weight of 1e3 pulls with 6.9 beta).
The gates and clips above only take gradient away from tokens that moved; this term is the one that moves
them back, which is what a stale batch needs when the learner has drifted from the weights that sampled it.

ppo_clip clips the ratio against the *behavior* policy: in an async run that bounds staleness only (every
token of a step is clipped against the weights that sampled it, never against how far the learner itself
moved). decoupled_ppo is the one with a proximal policy: the learner's own weights, snapshotted every
``proximal_every`` versions (``Learner`` scores the batch under the snapshot with one extra no-grad
forward; with proximal_every = 1 the proximal is the current weights, logp_prox = sg(logp), and that
forward is free). Its clip bounds the drift since the snapshot, its IS weight v_t corrects the staleness.

m2po and snis need a whole-batch statistic; ``Estimator.prepare`` computes it from the batch's detached
log-probs (one extra no-grad forward in ``Learner``) and hands each sequence its share as ``aux``.

The normalizer is folded into a per-token ``scale`` computed once for the whole batch (see
``token_scales``), so that the sum of micro-batch losses equals the loss of the whole batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

NORMALIZATIONS = ("token", "sequence")


@dataclass
class LossConfig:
    """Which estimator, and its knobs.

    ``gate_ratio`` is c for sequence_gate / token_gate (keep ratios in [1/c, c]); ``truncation_cap`` is C for
    truncated_is; ``ppo_clip_eps`` is eps for ppo_clip and decoupled_ppo; ``icepop_band`` is b for icepop;
    ``m2po_tau`` is tau for m2po (M2PO's paper uses 0.04); ``proximal_every`` is how many versions the
    decoupled_ppo proximal policy lives; ``decoupled_weight_cap`` is V for decoupled_ppo; ``dual_clip_c``
    is c for dual_clip (the paper's 3; it must exceed 1 + ppo_clip_eps); ``behavior_kl_coef`` is beta of the
    restoring term beta * (log w)^2 / 2 added to any estimator (0: off).
    """

    # the loss: reinforce_zero or a comparison estimator (formulas in this file)
    estimator: str = "reinforce_zero"
    # token: the loss sums over sampled tokens / their count; sequence: per-sequence means
    normalization: str = "token"
    gate_ratio: float = 2.0
    truncation_cap: float = 2.0
    ppo_clip_eps: float = 0.2
    icepop_band: float = 2.0
    m2po_tau: float = 0.04
    proximal_every: int = 8
    decoupled_weight_cap: float = 5.0
    dual_clip_c: float = 3.0
    behavior_kl_coef: float = 0.0

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if self.estimator in RETIRED_ESTIMATORS:
            raise ValueError(RETIRED_ESTIMATORS[self.estimator])
        if self.estimator not in ESTIMATOR_TABLE:
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
        if not self.icepop_band > 1.0:
            raise ValueError(f"loss.icepop_band must be > 1, got {self.icepop_band}")
        if not self.m2po_tau > 0.0:
            raise ValueError(f"loss.m2po_tau must be > 0, got {self.m2po_tau}")
        if self.proximal_every < 1:
            raise ValueError(f"loss.proximal_every must be >= 1, got {self.proximal_every}")
        if not self.decoupled_weight_cap > 0.0:
            raise ValueError(f"loss.decoupled_weight_cap must be > 0, got {self.decoupled_weight_cap}")
        if not self.dual_clip_c > 1.0 + self.ppo_clip_eps:
            raise ValueError(
                f"loss.dual_clip_c must be > 1 + ppo_clip_eps ({1.0 + self.ppo_clip_eps}), got "
                f"{self.dual_clip_c}"
            )
        if not (math.isfinite(self.behavior_kl_coef) and self.behavior_kl_coef >= 0.0):
            raise ValueError(
                f"loss.behavior_kl_coef must be a finite number >= 0, got {self.behavior_kl_coef}"
            )


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


# ---- the estimators ---------------------------------------------------------------------------------------
# Each takes one sequence's logp (carries the gradient), behavior_logp (finite everywhere: unsampled positions
# hold logp's own value), mask, advantage, the config and the sequence's ``aux`` (see Estimator.prepare), and
# returns (surrogate s_t, gated_t): s_t such that the loss is -(sum_t scale_t * s_t), and the tokens whose
# gradient the estimator clipped, gated or masked.

Aux = torch.Tensor | None
Surrogate = tuple[torch.Tensor, torch.Tensor]


def _none_gated(logp: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(logp, dtype=torch.bool)


def _kept_weights(log_ratio: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """w_t where keep, exactly 0 elsewhere, with no inf formed on dropped tokens (inf * 0 would give NaN
    in the value or the gradient: a gate exists to drop such tokens, not to poison the step)."""
    safe = torch.where(keep, log_ratio, torch.zeros_like(log_ratio))
    return torch.exp(safe) * keep.to(log_ratio.dtype)


def _unclipped_is(logp, behavior_logp, mask, advantage, cfg, aux) -> Surrogate:
    """s_t = w_t * A: REINFORCE Zero (on either op set: model.kernels)."""
    return torch.exp(logp - behavior_logp) * advantage, _none_gated(logp)


def _on_policy(logp, behavior_logp, mask, advantage, cfg, aux) -> Surrogate:
    """s_t = exp(logp - sg(logp)) * A: value A, gradient A * grad logp; behavior logprobs ignored."""
    return torch.exp(logp - logp.detach()) * advantage, _none_gated(logp)


def _sequence_gate(logp, behavior_logp, mask, advantage, cfg, aux) -> Surrogate:
    """s_t = w_t * A * 1[|mean_seq log w| <= log c]: the whole sequence kept or dropped."""
    log_ratio = logp - behavior_logp
    n = mask.sum().clamp(min=1)
    seq_log_ratio = (log_ratio.detach() * mask).sum() / n  # log of the geometric-mean ratio
    keep = (seq_log_ratio.abs() <= math.log(cfg.gate_ratio)).expand_as(log_ratio)
    return _kept_weights(log_ratio, keep) * advantage, ~keep


def _band_gate(band: float):
    def gate(logp, behavior_logp, mask, advantage, cfg, aux) -> Surrogate:
        log_ratio = logp - behavior_logp
        keep = log_ratio.detach().abs() <= math.log(band(cfg))
        return _kept_weights(log_ratio, keep) * advantage, ~keep

    return gate


_token_gate = _band_gate(lambda cfg: cfg.gate_ratio)
_token_gate.__doc__ = "s_t = w_t * A * 1[w_t in [1/c, c]]: token kept or dropped."
_icepop = _band_gate(lambda cfg: cfg.icepop_band)
_icepop.__doc__ = "s_t = w_t * A * 1[w_t in [1/b, b]]: IcePop's train/infer ratio band."


def _truncated_is(logp, behavior_logp, mask, advantage, cfg, aux) -> Surrogate:
    """s_t = sg(min(w_t, C)) * exp(logp - sg(logp)) * A: gradient min(w, C) * A * grad logp."""
    w = torch.exp(logp.detach() - behavior_logp)
    coef = torch.clamp(w, max=cfg.truncation_cap) * torch.exp(logp - logp.detach())
    return coef * advantage, w > cfg.truncation_cap


def _clipped(ratio: torch.Tensor, advantage: float, eps: float) -> Surrogate:
    """min(r A, clip(r, 1-eps, 1+eps) A), and where the clipped branch is the one taken (no gradient)."""
    surrogate = torch.minimum(ratio * advantage, torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * advantage)
    r = ratio.detach()
    gated = ((r > 1.0 + eps) & (advantage > 0)) | ((r < 1.0 - eps) & (advantage < 0))
    return surrogate, gated


def _ppo_clip(logp, behavior_logp, mask, advantage, cfg, aux) -> Surrogate:
    """s_t = min(w_t A, clip(w_t, 1-eps, 1+eps) A), the ratio against the behavior policy."""
    return _clipped(torch.exp(logp - behavior_logp), advantage, cfg.ppo_clip_eps)


def _dual_clip(logp, behavior_logp, mask, advantage, cfg, aux) -> Surrogate:
    """s_t = max(min(w_t A, clip(w_t, 1-eps, 1+eps) A), c A) for A < 0, ppo_clip's surrogate for A >= 0.

    The tokens on a constant branch ((1+eps) A, (1-eps) A or c A: no gradient) never form their w, so a
    weight that overflows is floored, not turned into NaN by the backward pass (inf * 0)."""
    log_ratio = logp - behavior_logp
    lr = log_ratio.detach()
    eps, c = cfg.ppo_clip_eps, cfg.dual_clip_c
    const = torch.zeros_like(lr)
    if advantage > 0:
        gated = lr > math.log(1.0 + eps)
        const = torch.where(gated, (1.0 + eps) * advantage, const)
    elif advantage < 0:
        low, high = lr < math.log(1.0 - eps), lr > math.log(c)
        gated = low | high
        const = torch.where(low, (1.0 - eps) * advantage, torch.where(high, c * advantage, const))
    else:
        gated = _none_gated(logp)
    ratio = torch.exp(torch.where(gated, torch.zeros_like(log_ratio), log_ratio))
    return torch.where(gated, const.to(logp.dtype), ratio * advantage), gated


def _m2po(logp, behavior_logp, mask, advantage, cfg, aux) -> Surrogate:
    """s_t = w_t * A * keep_t, keep from ``m2po_keep`` over the whole batch (aux)."""
    keep = aux if aux is not None else torch.ones_like(mask)
    return _kept_weights(logp - behavior_logp, keep) * advantage, ~keep


def _snis(logp, behavior_logp, mask, advantage, cfg, aux) -> Surrogate:
    """s_t = w_t / sg(mean_batch w) * A (aux: the batch's mean weight; its own mean without one)."""
    w = torch.exp(logp - behavior_logp)
    mean_w = aux if aux is not None else (w.detach() * mask).sum() / mask.sum().clamp(min=1)
    return w / mean_w.to(w.dtype) * advantage, _none_gated(logp)


def _decoupled_ppo(logp, behavior_logp, mask, advantage, cfg, aux) -> Surrogate:
    """s_t = sg(v_t) 1[v_t <= V] min(r_t A, clip(r_t, 1-eps, 1+eps) A) (aux: the proximal log-probs)."""
    prox = logp.detach() if aux is None else torch.where(mask, aux.to(logp.dtype), logp.detach())
    log_v = prox - behavior_logp
    keep = log_v <= math.log(cfg.decoupled_weight_cap)
    surrogate, clipped = _clipped(torch.exp(logp - prox), advantage, cfg.ppo_clip_eps)
    v = _kept_weights(log_v, keep)
    return v * torch.where(keep, surrogate, torch.zeros_like(surrogate)), clipped | ~keep


# ---- whole-batch statistics --------------------------------------------------------------------------------
def m2po_keep(logps: list[torch.Tensor], behavior: list[torch.Tensor], masks: list[torch.Tensor], tau: float):
    """Per sequence, the M2PO keep mask over the whole batch's sampled tokens.

    Sort the batch's sampled tokens by m_t = (log w_t)^2, ascending; keep the first k, k the largest with
    mean(m_1..m_k) <= tau (the prefix means only grow, so that is every prefix within the bound); mask the
    rest. Non-finite log ratios sort last. Unsampled positions are kept (the mask zeroes them anyway).
    """
    sel = [(lp.detach().double() - b.double())[m] for lp, b, m in zip(logps, behavior, masks, strict=True)]
    m2 = torch.cat(sel) ** 2 if sel else torch.zeros(0, dtype=torch.float64)
    m2 = torch.where(torch.isfinite(m2), m2, torch.full_like(m2, math.inf))
    order = torch.argsort(m2, stable=True)
    prefix_mean = torch.cumsum(m2[order], 0) / torch.arange(1, m2.numel() + 1, dtype=torch.float64)
    k = int((prefix_mean <= tau).sum())
    keep_flat = torch.zeros(m2.numel(), dtype=torch.bool)
    keep_flat[order[:k]] = True
    out, start = [], 0
    for m in masks:
        keep = torch.ones_like(m)
        n = int(m.sum())
        keep[m] = keep_flat[start : start + n]
        start += n
        out.append(keep)
    return out


def _m2po_prepare(logps, behavior, masks, cfg) -> list[Aux]:
    return m2po_keep(logps, behavior, masks, cfg.m2po_tau)


def _snis_prepare(logps, behavior, masks, cfg) -> list[Aux]:
    """The batch's mean sampled-token weight, one scalar shared by every sequence."""
    w = torch.cat(
        [
            torch.exp(lp.detach().double() - b.double())[m]
            for lp, b, m in zip(logps, behavior, masks, strict=True)
        ]
    )
    mean_w = w.mean() if w.numel() else torch.tensor(1.0, dtype=torch.float64)
    return [mean_w] * len(masks)


@dataclass(frozen=True)
class Estimator:
    """One entry of the estimator table.

    ``surrogate``: the per-token function above. ``prepare``: None, or (detached logps, behavior, masks,
    cfg) -> one ``aux`` per sequence, from a statistic of the whole batch. ``proximal``: the aux is the
    sequence's log-probs under the proximal policy (the learner's snapshot).
    """

    surrogate: Callable[..., Surrogate]
    prepare: Callable[..., list[Aux]] | None = None
    proximal: bool = False


ESTIMATOR_TABLE: dict[str, Estimator] = {
    "reinforce_zero": Estimator(_unclipped_is),
    "on_policy": Estimator(_on_policy),
    "sequence_gate": Estimator(_sequence_gate),
    "token_gate": Estimator(_token_gate),
    "icepop": Estimator(_icepop),
    "truncated_is": Estimator(_truncated_is),
    "ppo_clip": Estimator(_ppo_clip),
    "dual_clip": Estimator(_dual_clip),
    "m2po": Estimator(_m2po, prepare=_m2po_prepare),
    "snis": Estimator(_snis, prepare=_snis_prepare),
    "decoupled_ppo": Estimator(_decoupled_ppo, proximal=True),
}
ESTIMATORS = tuple(ESTIMATOR_TABLE)
# Names that once selected more than a loss, and what to write instead (one line each).
RETIRED_ESTIMATORS = {
    "standard_is": (
        "learner.loss.estimator: standard_is is gone: it was reinforce_zero run on stock PyTorch ops, and "
        "the op set is now named only by model.kernels; write learner.loss.estimator: reinforce_zero and "
        "model.kernels: standard"
    ),
}


def sequence_terms(
    logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    advantage: float,
    scale: torch.Tensor,
    cfg: LossConfig,
    aux: Aux = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This sequence's share of the batch loss (a scalar), and how many of its sampled tokens the estimator
    clipped, gated or masked (a 0-d tensor on the loss's device: counting reads nothing back to the host).

    logp, behavior_logp, mask, scale: [n] for the n predicted tokens of the sequence (tokens[1:]); aux: this
    sequence's entry of the estimator's ``prepare`` (or its proximal log-probs), None without one.
    """
    mask_f = mask.to(logp.dtype)
    # Unsampled positions carry no behavior logprob: give them w = 1 so that nothing non-finite is ever
    # formed there (0 * inf in the backward pass would be NaN even behind a mask).
    behavior_logp = torch.where(mask, behavior_logp, logp.detach())
    surrogate, gated = ESTIMATOR_TABLE[cfg.estimator].surrogate(
        logp, behavior_logp, mask, advantage, cfg, aux
    )
    if cfg.behavior_kl_coef > 0.0:
        surrogate = surrogate - cfg.behavior_kl_coef * 0.5 * (logp - behavior_logp) ** 2
    return -(surrogate * scale * mask_f).sum(), (gated & mask).sum()


def sequence_loss(
    logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    advantage: float,
    scale: torch.Tensor,
    cfg: LossConfig,
    aux: Aux = None,
) -> torch.Tensor:
    """This sequence's share of the batch loss (a scalar); summing over the batch gives the loss."""
    return sequence_terms(logp, behavior_logp, mask, advantage, scale, cfg, aux)[0]
