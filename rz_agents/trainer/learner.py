"""The learner step: packed forward -> log-probs -> REINFORCE Zero loss -> guarded AdamW step.

One call of ``Learner.step`` consumes a batch of trajectories (whole groups), accumulates gradients over
micro-batches bounded by a token budget, and applies one optimizer step unless the loss or the gradient is
non-finite (then the step is skipped, logged, and the weights and version stay as they were).
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rz_agents.model.freeze import vision_tower_frozen
from rz_agents.model.lora import LoraConfig, has_lora
from rz_agents.model.weight_update import WeightUpdate
from rz_agents.sampling import SamplingSpec
from rz_agents.trainer.advantages import BASELINES, group_advantages, uniform_groups
from rz_agents.trainer.exchange import StepExchange, idle_pass
from rz_agents.trainer.frozen_base import frozen_names, held_digest
from rz_agents.trainer.learner_checkpoint import (
    load_learner_state,
    load_whole_tensor_state,
    save_learner_state,
)
from rz_agents.trainer.loss import ESTIMATOR_TABLE, LossConfig, sequence_terms, token_scales
from rz_agents.trainer.lr_control import KLLrController, LrControlConfig
from rz_agents.trainer.master_weights import MasterWeights
from rz_agents.trainer.metrics import (
    DeviationTracker,
    Lag0MismatchError,
    ess_by_lag_bucket,
    importance_metrics,
    lag_histogram,
    reward_and_advantage_metrics,
)
from rz_agents.trainer.optim import OptimConfig, build_optimizer
from rz_agents.trainer.replicated_grads import ReplicatedGrads
from rz_agents.trainer.sequence_logprobs import trajectory_logprobs
from rz_agents.trainer.sharding import SingleProcess
from rz_agents.trajectory import Trajectory, TrajectoryError


@dataclass
class LearnerConfig:
    """Everything the learner step needs besides the model."""

    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lr_control: LrControlConfig = field(default_factory=LrControlConfig)  # KL-steered lr scale (off: None)
    baseline: str = "mean"  # or "leave_one_out"
    micro_batch_tokens: int = 4096  # token budget of one packed forward/backward
    assert_lag0_exact: bool = False  # raise if a lag-0 token has logp_learner != behavior logprob
    # Leave groups whose rewards are all equal (advantage 0: no gradient) out of the forward/backward; the
    # loss normalizer still counts their tokens, so the update is the whole batch's (bit for bit within one
    # micro-batch; across micro-batches the gradient sums run in another order).
    skip_uniform_groups: bool = False
    # LoRA adapters (rank 0: off, full fine-tune): base frozen, only the adapters train and are published
    lora: LoraConfig = field(default_factory=LoraConfig)
    # A vision-language model's vision tower (model.visual: patch embedding, ViT blocks, mergers) stays as
    # loaded: no gradient, fp32 master or AdamW state; the language model trains (the warm start's SFT
    # leaves it too). Weight updates leave it out (the engines hold it: sent whole once, like LoRA's base) and
    # carry its SHA-256 instead, which each engine checks against its own tower (model/held_weights.py).
    freeze_vision: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        self.loss.validate()
        self.lora.validate()
        self.optim.validate()
        self.lr_control.validate()
        if self.baseline not in BASELINES:
            raise ValueError(f"learner.baseline must be one of {BASELINES}, got {self.baseline!r}")
        if self.micro_batch_tokens < 2:
            raise ValueError(f"learner.micro_batch_tokens must be >= 2, got {self.micro_batch_tokens}")


class _Lookup(Sequence):
    """``[weights[name] for name in names]`` looked up when indexed: with a lazy ``weights`` (a checkpoint's
    ``LazyState``) one whole tensor is in memory at a time."""

    def __init__(self, weights: Mapping[str, torch.Tensor], names: list[str]) -> None:
        self.weights, self.names = weights, names

    def __getitem__(self, i):
        return self.weights[self.names[i]]

    def __len__(self) -> int:
        return len(self.names)


def micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Split indices 0..n-1, in order, into runs whose total length fits the budget.

    A sequence longer than the budget gets a micro-batch of its own (a packed forward cannot split it).
    """
    out: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        if cur and used + n > token_budget:
            out.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    if cur:
        out.append(cur)
    return out


def _working_dtype(model: torch.nn.Module) -> torch.dtype:
    """The one dtype of the model's parameters: the dtype the engine samples in and the learner computes
    in."""
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) != 1:
        raise ValueError(
            f"the learner needs a model whose parameters share one dtype, got {sorted(map(str, dtypes))}"
        )
    return dtypes.pop()


@dataclass
class _Batch:
    """The admitted trajectories that go through the forward/backward, in order, with their data per predicted
    token (tokens[1:]): sampled-token mask, behavior log-probs, advantage and token scales."""

    trajs: list[Trajectory]
    masks: list[torch.Tensor]
    behavior: list[torch.Tensor]
    advantages: list[float]
    scales: list[torch.Tensor]


@dataclass
class _Scored:
    """What the forward/backward pass over a batch leaves for the metrics and the update."""

    logps: list[torch.Tensor]  # detached learner log-probs of tokens[1:], per trajectory
    loss: float
    finite: bool
    gated_tokens: int  # sampled tokens the estimator clipped, gated or masked
    time_forward_s: float
    time_backward_s: float


class Learner:
    """Owns the trained model, its optimizer and schedule, and the policy version.

    A model held in bf16 (or fp16) trains through fp32 master weights (``MasterWeights``): gradients are
    accumulated in fp32 on the masters, AdamW and its state are fp32, and after each step the masters are
    rounded into the model, whose weights are the ones the engine samples with (so lag-0 tokens stay
    bit-identical).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: LearnerConfig,
        version: int = 0,
        ranks: SingleProcess | None = None,
        *,
        sampling: SamplingSpec | None = None,
        max_lag: int | None = 64,
    ) -> None:
        """``ranks``: this process's place among the learner ranks (``ShardedRanks`` shards the model with
        FSDP2 over a torch.distributed group; default: one process). ``sampling``: the distribution the
        engine sampled from, which the learner scores tokens under (default: temperature 1, unfiltered);
        ``max_lag``: tokens older than this many versions are not trained (dropped and counted; None: no
        bound). A run passes its plan's ``sampling`` and ``lag.bound`` (``runtime.plan``), the ones its
        rollouts follow."""
        cfg.validate()
        if max_lag is not None and max_lag < 0:
            raise ValueError(f"learner max_lag must be >= 0 or None, got {max_lag}")
        self.sampling = sampling or SamplingSpec()
        self.max_lag = max_lag
        verify = getattr(model, "verify_kernels", None)
        if verify is not None:  # the aligned kernels' guards, paid (and logged) before the first step
            verify()
        self.ranks = ranks or SingleProcess()
        if next(model.parameters()).is_meta and not self.ranks.keeps_fp32_shards:
            raise ValueError("a model on the meta device needs sharded learner ranks (ShardedRanks)")
        self.dtype = _working_dtype(model)  # the dtype of the weights the engine samples with
        # the policy builder froze the tower (model.policy.build_policy): the learner only checks it did
        if cfg.freeze_vision and not vision_tower_frozen(model):
            raise ValueError(
                "learner.freeze_vision is set but the model's vision tower trains: build the policy with "
                "model.policy.build_policy(PolicySpec(freeze_vision=True)) (the runtimes do)"
            )
        self.model = self.ranks.shard(model)
        self.cfg = cfg
        self.version = version
        if cfg.lora.enabled and not has_lora(model):
            raise ValueError(
                "learner.lora is set but the model has no adapters: build the policy with model.policy."
                "build_policy(PolicySpec(lora=...)) before the engine copies it (the runtimes do)"
            )
        # LoRA (or freeze_vision): the frozen part has requires_grad False, so it gets no gradient, fp32
        # master or AdamW state
        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        # a vision tower's parameters last (optim.vision_lr gives them a group of their own; the optimizer's
        # order is this list's, which the checkpoints' names follow)
        tower = [p for n, p in trained if n.startswith("model.visual.")]
        self.params = [p for n, p in trained if not n.startswith("model.visual.")] + tower
        if cfg.optim.vision_lr is not None and not tower:
            raise ValueError(
                "learner.optim.vision_lr is set but the model has no trained vision tower "
                "(a text model, or learner.freeze_vision)"
            )
        # fp32 masters: separate copies in one process, the fp32 shards themselves with FSDP2, none in fp32
        self.master_weights = MasterWeights(self.params, self.dtype, self.ranks)
        self.optimizer, self.scheduler = build_optimizer(
            self.master_weights.optimized(), cfg.optim, vision=len(tower)
        )
        # Trained parameters whole on every one of several ranks (LoRA adapters): their gradients are summed
        # in one process's order (bit-identical), not reduce-scattered (trainer/replicated_grads.py)
        self.replicated_grads: ReplicatedGrads | None = None
        if self.ranks.world > 1 and not self.ranks.shards_trained and self.params:
            self.replicated_grads = ReplicatedGrads(self.params, self.master_weights, self.ranks)
        self.deviation = DeviationTracker()
        self.lr_control = KLLrController(cfg.lr_control)
        self.skipped_steps = 0
        self.dropped_over_lag = 0
        # decoupled_ppo's proximal policy: a copy of the weights, refreshed every loss.proximal_every versions
        self.proximal: torch.nn.Module | None = None
        self.proximal_version = -1
        if (
            ESTIMATOR_TABLE[cfg.loss.estimator].proximal
            and cfg.loss.proximal_every > 1
            and self.ranks.world > 1
        ):
            raise ValueError(
                "learner.loss.estimator decoupled_ppo with proximal_every > 1 needs learner_ranks 1"
            )

    @property
    def masters(self) -> list[torch.Tensor] | None:
        """The separate fp32 copies of ``params`` (None: an fp32 model, or ranks whose fp32 shards are
        the masters; ``master_weights.in_shards`` says which)."""
        return self.master_weights.copies

    # ---- the step -------------------------------------------------------------------------------------
    def step(self, batch: Sequence[Trajectory]) -> dict[str, Any]:
        """Train on one batch; return the step's metrics. Increments ``version`` unless the step is
        skipped."""
        learner_version = self.version
        trajs, dropped_invalid, dropped_lag = self._admit(batch)
        metrics: dict[str, Any] = {
            "version": learner_version,
            "batch_trajectories": len(trajs),
            "dropped_invalid": dropped_invalid,
            "dropped_over_lag": dropped_lag,
        }
        if not trajs:
            metrics.update(step_skipped_empty=1, step_skipped_nonfinite=0)
            return metrics

        kept = self._prepare(trajs, metrics)
        trajs, masks = kept.trajs, kept.masks
        cpu0 = time.thread_time()  # CPU time of this thread: wall >> cpu means the cores were busy elsewhere
        scored = self._forward_backward(kept)
        # Mismatch metrics on sampled tokens, before any weight change.
        if trajs:
            metrics.update(self._mismatch_metrics(kept, scored.logps, learner_version))
        metrics["estimator_clipfrac"] = scored.gated_tokens / max(sum(int(m.sum()) for m in masks), 1)
        if self.proximal is not None:
            metrics["proximal_lag"] = learner_version - self.proximal_version
        t0 = time.perf_counter()
        scheduled = self.optimizer.param_groups[0][
            "lr"
        ]  # the schedule moves on after the step, from its base
        lr_scale = self.lr_control.update(
            metrics.get("kl_k3_behavior_to_learner"), metrics.get("lag_mean"), scheduled
        )
        if self.lr_control.enabled:
            metrics["lr_scale"] = lr_scale
        lr = scheduled * lr_scale  # the rate this step uses (the scale never compounds)
        grad_norm, skipped = self._apply_update(scored, lr_scale)
        t_opt = time.perf_counter() - t0

        n_tokens = sum(len(t.tokens) for t in trajs)
        elapsed = scored.time_forward_s + scored.time_backward_s + t_opt
        metrics.update(
            loss=scored.loss,
            grad_norm=grad_norm,
            lr=lr,
            step_skipped_nonfinite=int(skipped),
            step_skipped_empty=0,
            skipped_steps_total=self.skipped_steps,
            dropped_over_lag_total=self.dropped_over_lag,
            time_forward_s=scored.time_forward_s,
            time_backward_s=scored.time_backward_s,
            time_optimizer_s=t_opt,
            learner_tokens=n_tokens,
            learner_tokens_per_s=n_tokens / elapsed if elapsed > 0 else 0.0,
            learner_thread_cpu_s=time.thread_time() - cpu0,
        )
        return metrics

    def _prepare(self, trajs: list[Trajectory], metrics: dict[str, Any]) -> _Batch:
        """Advantages and per-token data of the admitted trajectories; with ``skip_uniform_groups`` the groups
        whose rewards are all equal are left out (the token scales still count them). Adds the reward,
        advantage and uniform-group figures to ``metrics``."""
        cfg = self.cfg
        rewards = [float(t.reward) for t in trajs]
        advantages = group_advantages(rewards, [t.group_id for t in trajs], cfg.baseline)
        metrics.update(reward_and_advantage_metrics(rewards, advantages))
        # Per predicted token (tokens[1:]) data of each sequence.
        masks = [torch.tensor(t.loss_mask[1:], dtype=torch.bool) for t in trajs]
        behavior = [torch.tensor(t.behavior_logprobs[1:], dtype=torch.float32) for t in trajs]
        scales = token_scales(masks, cfg.loss.normalization)  # over the whole batch, skipped groups included
        uniform = uniform_groups(rewards, [t.group_id for t in trajs])
        metrics["groups_uniform"] = len(uniform)  # all rewards equal: advantage 0, no gradient
        kept = list(range(len(trajs)))
        if cfg.skip_uniform_groups:
            kept = [i for i, t in enumerate(trajs) if t.group_id not in uniform]
            metrics.update(
                groups_skipped_uniform=len(uniform),
                trajectories_skipped_uniform=len(trajs) - len(kept),
                tokens_skipped_uniform=sum(len(trajs[i].tokens) for i in set(range(len(trajs))) - set(kept)),
            )
        return _Batch(
            [trajs[i] for i in kept],
            [masks[i] for i in kept],
            [behavior[i] for i in kept],
            [advantages[i] for i in kept],
            [scales[i] for i in kept],
        )

    def _forward_backward(self, kept: _Batch) -> _Scored:
        """Packed forward, loss and backward per micro-batch; gradients accumulate (in fp32 on the masters).

        With several ranks each runs its share of the micro-batches. Nothing leaves the device per
        micro-batch: the log-probs, per-micro-batch losses and a count of non-finite losses go into one flat
        fp32 tensor (zeros where another rank's micro-batch goes), summed over the ranks once per step (x + 0
        is exact) and copied to the host once, so every rank returns the whole batch's values, the loss summed
        in micro-batch order as one process does. A non-finite micro-batch is still backpropagated (deciding
        not to would need its value on the host now); the step is then skipped and its gradients discarded.
        """
        cfg = self.cfg
        trajs, masks, behavior = kept.trajs, kept.masks, kept.behavior
        self.model.train()
        self.master_weights.zero_grads()
        t_fwd = t_bwd = 0.0
        mbs = micro_batches([len(t.tokens) for t in trajs], cfg.micro_batch_tokens)
        aux = self._estimator_aux(trajs, masks, behavior, mbs)
        device = next(self.model.parameters()).device
        ex = StepExchange([len(t.tokens) for t in trajs], device, num_losses=len(mbs), with_counters=True)
        for round_index, j in enumerate(self.ranks.share(len(mbs))):
            t0 = time.perf_counter()
            mb = mbs[j] if j is not None else []
            loss, mb_logps, n_gated = self._micro_batch_loss(kept, mb, aux)
            t1 = time.perf_counter()
            for i, lp in zip(mb, mb_logps, strict=True):
                ex.put_logps(i, lp)
            ex.add_nonfinite(loss)
            if j is not None:
                ex.put_loss(j, loss)
            ex.add_gated(n_gated)
            loss.backward()
            if self.replicated_grads is not None:  # (a collective per round of micro-batches)
                self.replicated_grads.after_backward(round_index, j is not None, len(mbs))
            else:
                self.master_weights.accumulate()
            t_fwd += t1 - t0
            t_bwd += time.perf_counter() - t1
        if self.replicated_grads is not None:
            self.replicated_grads.finish()
        if not mbs:  # every group skipped: zero gradients, so AdamW still steps as it would on the batch
            self.master_weights.zero_sums()
        ex.exchange(self.ranks.reduce_sum)  # the step's one exchange and one host copy
        return _Scored(ex.all_logps(), ex.loss(), ex.nonfinite == 0, ex.gated, t_fwd, t_bwd)

    def _micro_batch_loss(
        self, kept: _Batch, mb: list[int], aux: list[torch.Tensor | None]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor | int]:
        """One micro-batch's packed forward and loss (not yet backpropagated): the summed loss, the log-probs
        of tokens[1:] per sequence of ``mb``, and the number of sampled tokens the estimator gated (a device
        tensor: nothing is copied to the host here).

        An empty ``mb`` is the idle pass (this rank has fewer micro-batches than another): a 2-token dummy
        sequence with zero weight, so that every rank joins the same all-gathers and reduce-scatters."""
        if not mb:
            return idle_pass(self.model), [], 0
        cfg = self.cfg
        trajs, masks, behavior = kept.trajs, kept.masks, kept.behavior
        # Only the sampled tokens' rows go through the LM head (the loss reads no other; same bits), unless
        # an estimator's per-token extra would meet the 0.0 the others get (a proximal ratio could overflow).
        sampled_only = all(aux[i] is None for i in mb)
        mb_logps = trajectory_logprobs(
            self.model, [trajs[i] for i in mb], self.sampling.scoring(), sampled_only=sampled_only
        )
        # Per-token data lives on the CPU; the loss is computed where the model is (a no-op on CPU).
        terms = [
            sequence_terms(
                lp,
                behavior[i].to(lp.device, non_blocking=True),
                masks[i].to(lp.device, non_blocking=True),
                kept.advantages[i],
                kept.scales[i].to(lp.device, non_blocking=True),
                cfg.loss,
                None if aux[i] is None else aux[i].to(lp.device),
            )
            for i, lp in zip(mb, mb_logps, strict=True)
        ]
        loss = sum(t[0] for t in terms)
        n_gated = sum(t[1] for t in terms)
        return loss, mb_logps, n_gated

    def _estimator_aux(
        self,
        trajs: list[Trajectory],
        masks: list[torch.Tensor],
        behavior: list[torch.Tensor],
        mbs: list[list[int]],
    ) -> list[torch.Tensor | None]:
        """Per sequence, what the estimator needs beyond its own tokens: the proximal log-probs
        (decoupled_ppo: one no-grad forward under the snapshot, none when proximal_every is 1) or a statistic
        of the whole batch (m2po, snis: one no-grad forward under the current weights); None for the
        others."""
        cfg = self.cfg
        est = ESTIMATOR_TABLE[cfg.loss.estimator]
        if est.proximal and cfg.loss.proximal_every > 1:
            if self.proximal is None or self.version - self.proximal_version >= cfg.loss.proximal_every:
                if self.proximal is None:
                    self.proximal = copy.deepcopy(self.model).requires_grad_(False)
                else:
                    self.proximal.load_state_dict(self.model.state_dict())
                self.proximal_version = self.version
            return self._score(self.proximal, trajs, mbs)
        if est.prepare is not None:
            return est.prepare(self._score(self.model, trajs, mbs), behavior, masks, cfg.loss)
        return [None] * len(trajs)

    @torch.no_grad()
    def _score(
        self, model: torch.nn.Module, trajs: list[Trajectory], mbs: list[list[int]]
    ) -> list[torch.Tensor]:
        """Detached log-probs of tokens[1:] of every trajectory under ``model`` (this rank's micro-batches,
        then exchanged; an idle rank runs the same dummy pass as in the backward loop)."""
        ex = StepExchange([len(t.tokens) for t in trajs], next(model.parameters()).device)
        for j in self.ranks.share(len(mbs)):
            mb = mbs[j] if j is not None else []
            if not mb:
                idle_pass(model)
                continue
            lps = trajectory_logprobs(model, [trajs[i] for i in mb], self.sampling.scoring())
            for i, lp in zip(mb, lps, strict=True):
                ex.put_logps(i, lp)
        ex.exchange(self.ranks.reduce_sum)  # one exchange, one host copy (x + 0 is exact)
        return ex.all_logps()

    def _mismatch_metrics(
        self, kept: _Batch, logps: list[torch.Tensor], learner_version: int
    ) -> dict[str, Any]:
        """IS-weight, KL, lag and lag-0 |dlogp| figures over the sampled tokens; enforces
        assert_lag0_exact."""
        cfg = self.cfg
        trajs, masks, behavior = kept.trajs, kept.masks, kept.behavior
        sel_logp = torch.cat([s[m] for s, m in zip(logps, masks, strict=True)])
        sel_blp = torch.cat([b[m] for b, m in zip(behavior, masks, strict=True)])
        sel_ver = torch.cat(
            [torch.tensor(t.versions[1:], dtype=torch.long)[m] for t, m in zip(trajs, masks, strict=True)]
        )
        out = importance_metrics(sel_logp, sel_blp, sel_ver, learner_version)
        if self.max_lag is not None:
            out.update(lag_histogram(learner_version - sel_ver, self.max_lag))
            out.update(ess_by_lag_bucket(sel_logp - sel_blp, learner_version - sel_ver, self.max_lag))
        if "is_weight_abs_dev_mean" in out:
            out.update(self.deviation.update(out["is_weight_abs_dev_mean"]))
        if cfg.assert_lag0_exact and out.get("lag0_abs_dlogp_max", 0.0) != 0.0:
            self.master_weights.zero_grads()
            raise Lag0MismatchError(
                f"lag-0 tokens differ from their behavior logprobs: max |dlogp| = {out['lag0_abs_dlogp_max']}"
            )
        return out

    def _apply_update(self, scored: _Scored, lr_scale: float = 1.0) -> tuple[float, bool]:
        """The guard, then AdamW at the schedule's rate times ``lr_scale``: a non-finite loss or gradient
        never reaches the weights (the ratio itself is not clipped). Returns (gradient norm, skipped)."""
        max_norm = self.cfg.optim.max_grad_norm if self.cfg.optim.max_grad_norm > 0 else math.inf
        grad_norm = math.nan
        if scored.finite:
            norm = torch.nn.utils.clip_grad_norm_(
                self.master_weights.optimized(), max_norm, error_if_nonfinite=False
            )
            grad_norm = float(self.ranks.full(norm))
        skipped = not (scored.finite and math.isfinite(scored.loss) and math.isfinite(grad_norm))
        if skipped:
            self.skipped_steps += 1
        else:
            if lr_scale != 1.0:  # LambdaLR sets every group's rate afresh on its step below
                for group in self.optimizer.param_groups:
                    group["lr"] = group["lr"] * lr_scale
            self.optimizer.step()
            self.scheduler.step()
            self.master_weights.round_into_model()
            self.version += 1
        self.master_weights.zero_grads()
        return grad_norm, skipped

    def _admit(self, batch: Sequence[Trajectory]) -> tuple[list[Trajectory], int, int]:
        """Drop (and count) invalid trajectories and those with a token older than max_lag."""
        keep: list[Trajectory] = []
        invalid = over_lag = 0
        for t in batch:
            try:
                t.validate()
            except TrajectoryError:
                invalid += 1
                continue
            oldest = t.oldest_version()
            if self.max_lag is not None and oldest is not None and self.version - oldest > self.max_lag:
                over_lag += 1
                continue
            keep.append(t)
        self.dropped_over_lag += over_lag
        return keep, invalid, over_lag

    # ---- weights and state ----------------------------------------------------------------------------
    # With several ranks these gather the whole tensors (collectives: call them on every rank) and hold the
    # same layout as one process's, so a checkpoint moves between learner_ranks 1 and N.
    def weights(self) -> dict[str, torch.Tensor]:
        """The current weights to publish (detached views in one process; the receiver copies them)."""
        return dict(self.iter_weights())

    def iter_weights(self, names: Sequence[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, whole tensor in the model's dtype), one at a time, in ``names`` order (default: the state
        dict's). With several ranks each tensor is gathered when it is reached (every rank must iterate, in
        the same order), so a consumer that keeps nothing (the ranks that do not publish) or sends each
        tensor on (the publisher) never holds a second copy of the weights. A sharded fp32 master is
        rounded to the model's dtype before the gather: the same bits, half the bytes sent."""
        state = self.model.state_dict()
        for name in names if names is not None else list(state):
            yield name, self.ranks.full(state[name].detach().to(self.dtype))

    def published_names(self) -> list[str] | None:
        """The names a weight update publishes: every state-dict entry but the parameters the learner does not
        train (with LoRA the adapters, with ``freeze_vision`` all but the vision tower: the frozen part never
        changes and the engine holds it already); None: every weight (nothing is frozen)."""
        frozen = frozen_names(self)
        if not frozen:
            return None
        return [n for n in self.model.state_dict() if n not in frozen]

    def iter_published(self, order: Sequence[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """``iter_weights`` of the tensors a weight update sends, in ``order`` (default: ``published_names``,
        or every weight). A collective with several ranks, like ``iter_weights``."""
        yield from self.iter_weights(order if order is not None else self.published_names())

    def held_claim(self) -> str | None:
        """The SHA-256 of the frozen tensors a partial update leaves out, in the model's dtype
        (``WeightUpdate.held_sha256``: an engine refuses the update unless it holds those same bits); None
        when updates carry every weight. A collective with several ranks when it is computed."""
        names = self.published_names()
        return None if names is None else held_digest(self, names)

    def weight_update(self) -> WeightUpdate:
        """The record a weight update publishes: this version, the tensors sent (``iter_published``) and the
        claim on the frozen rest (``held_claim``). A collective with several ranks."""
        claim = self.held_claim()
        return WeightUpdate(self.version, dict(self.iter_published()), claim)

    def published_weights(self) -> dict[str, torch.Tensor]:
        """Deprecated: ``weight_update().to_state()`` (the flat form, the claim under ``HELD_KEY``)."""
        return self.weight_update().to_state()

    def weight_shapes(self) -> dict[str, torch.Tensor]:
        """Meta tensors with the names, whole shapes and dtype of ``weights()`` (nothing gathered)."""
        return {
            k: torch.empty(v.shape, dtype=self.dtype, device="meta")
            for k, v in self.model.state_dict().items()
        }

    def replace_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Replace the weights (and fp32 masters) with ``weights``, keeping version and optimizer state
        (the policy changed outside the learner, e.g. by a supervised warm start). Not an engine's
        ``load_weights`` (weights sampled as a version): hence its own name."""
        state = {"model": weights, "masters": None}
        self._load_model(state)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Deprecated name of ``replace_weights`` (``load_weights`` is the engines' method: a version's
        weights to sample with)."""
        warnings.warn(
            "Learner.load_weights is deprecated: call Learner.replace_weights",
            DeprecationWarning,
            stacklevel=2,
        )
        self.replace_weights(weights)

    def counters(self) -> dict[str, Any]:
        """The schedule, version, counters and lr scale: the part of the state ``save_state`` returns as plain
        values (and the checkpoints before folders kept beside their whole tensors)."""
        return {
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
            "skipped_steps": self.skipped_steps,
            "dropped_over_lag": self.dropped_over_lag,
            "deviation_history": list(self.deviation.history),
            "lr_control": self.lr_control.state_dict(),
        }

    def load_counters(self, state: dict[str, Any]) -> None:
        """Restore what ``counters`` saved (a state from before the lr controller restores its scale 1)."""
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])
        self.skipped_steps = int(state["skipped_steps"])
        self.dropped_over_lag = int(state["dropped_over_lag"])
        self.deviation.history = list(state["deviation_history"])
        self.lr_control.load_state_dict(state.get("lr_control"))

    def save_state(self, directory: str | Path) -> dict[str, Any]:
        """The learner's state for a checkpoint: the tensors (fp32 masters, AdamW state) written into
        ``directory`` with torch.distributed.checkpoint, each rank its own shards (nothing gathered; a
        collective with several ranks), one layout for any number of ranks; returns the rest (schedule,
        version, counters; trainer/learner_checkpoint.py)."""
        return save_learner_state(self, directory)

    def load_state(self, state: dict[str, Any], directory: str | Path | None) -> None:
        """Restore what ``save_state`` wrote to ``directory`` and returned as ``state``. ``directory`` None:
        ``state`` is a checkpoint from before folders, holding the whole tensors (read with a deprecation
        warning; any number of ranks cut their shards from it)."""
        if directory is None:
            load_whole_tensor_state(self, state)
        else:
            load_learner_state(self, state, directory)

    @torch.no_grad()
    def _load_model(self, state: dict[str, Any]) -> None:
        """Weights from ``state["model"]``, fp32 masters from ``state["masters"]`` (or the weights); for
        ``replace_weights`` and the whole-tensor checkpoints (trainer/learner_checkpoint.py)."""
        if self.ranks.keeps_fp32_shards:  # the shards take their part of each whole tensor
            names = {id(p): n for n, p in self.model.named_parameters()}
            weights = _Lookup(state["model"], [names[id(p)] for p in self.params])  # one tensor at a time
            trained = {id(p) for p in self.params}
            for name, p in self.model.named_parameters():
                # LoRA: the frozen base's shards, and the whole adapters (their fp32 copies load below)
                if id(p) not in trained or not self.ranks.shards_trained:
                    p.copy_(self.ranks.shard_like(state["model"][name], p))
        else:
            self.model.load_state_dict(state["model"])
            weights = self.params
        self.master_weights.load(state.get("masters"), weights)
