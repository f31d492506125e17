"""Supervised fine-tuning on demonstrations (masked next-token cross-entropy), on the aligned model."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from rz_agents.model.logprobs import pack, token_logprobs
from rz_agents.model.transformer import Transformer
from rz_agents.trainer.learner import micro_batches
from rz_agents.trainer.optim import OptimConfig, build_optimizer
from rz_agents.warmstart.bootstrap import BootstrapConfig
from rz_agents.warmstart.demos import Demonstration


@dataclass
class WarmStartConfig:
    """Supervised warm start before RL. Three sources, each off by default, run in this order:

    * ``episodes: PATH``: a JSON Lines file of episodes for any env (warmstart/episodes.py), trained on
      for ``epochs`` epochs;
    * ``bootstrap``: rejection sampling on the env's own tasks (warmstart/bootstrap.py);
    * ``demos: N`` (synthetic, for the built-in arithmetic / word-problem tool envs only), in two phases:
      1. format: `demos` tool-use demonstrations for `epochs` epochs (the call format, copying the
         expression into the call and the tool's output into the answer);
      2. prior: `prior_demos` demonstrations of which only `tool_fraction` use the tool, the rest
         answer at once with a guess, for one epoch: the policy ends up rarely calling its tool, as
         base models often do. RL then has to learn when the tool pays.
    """

    episodes: str | None = None  # a JSON Lines file of episodes to train on first (warmstart/episodes.py)
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    demos: int = 0
    prior_demos: int = 0
    # demonstrations' tasks: "arithmetic" ("Compute 37*48+12."), "word_problems" or "visual_click"
    # (rz_agents/VisualClick-v0's own pictures: warmstart/visual_demos.py)
    task: str = "arithmetic"
    # share of demos that use the tool (prior phase); visual_click: share that click the named button
    tool_fraction: float = 0.2
    difficulty: int = 1  # operands / steps of the synthetic demonstrations' problems
    epochs: int = 3  # epochs over demos (format phase) and over the episodes file
    batch_size: int = 32  # episodes per SFT optimizer step
    # token budget of one packed forward/backward (gradients accumulate over a batch's micro-batches);
    # null: the whole batch at once. Bounds the activation memory of long demonstrations.
    micro_batch_tokens: int | None = None
    lr: float = 3e-3  # learning rate of the format phase and of episodes
    prior_lr: float = 1e-3  # learning rate of the prior phase (demos)
    weight_decay: float = 0.0  # AdamW weight decay of the SFT
    warmup_steps: int = 20  # linear warmup steps of the SFT
    seed: int = 0  # seed of the demonstrations and the SFT's shuffling
    # op set of the SFT: null keeps the run's kernels; "standard" is faster (RL still uses the run's)
    kernels: str | None = None
    # torch threads of the SFT (it runs before RL, alone): null keeps the run's num_threads
    num_threads: int | None = None

    @property
    def enabled(self) -> bool:
        """Whether any warm start runs."""
        return self.demos > 0 or bool(self.episodes) or self.bootstrap.rounds > 0

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        self.bootstrap.validate()
        if self.episodes is not None and not isinstance(self.episodes, str):
            raise ValueError(
                f"warm_start.episodes must be a path to a JSON Lines file, got {self.episodes!r}"
            )
        if self.demos < 0 or self.prior_demos < 0:
            raise ValueError(
                f"warm_start.demos and prior_demos must be >= 0, got {self.demos}, {self.prior_demos}"
            )
        if not 0.0 <= self.tool_fraction <= 1.0:
            raise ValueError(f"warm_start.tool_fraction must be in [0, 1], got {self.tool_fraction}")
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError("warm_start.epochs and warm_start.batch_size must be >= 1")
        if self.task not in ("arithmetic", "word_problems", "visual_click"):
            raise ValueError(
                f"warm_start.task must be 'arithmetic', 'word_problems' or 'visual_click', got {self.task!r}"
            )
        if self.kernels not in (None, "aligned", "standard"):
            raise ValueError(
                f"warm_start.kernels must be null, 'aligned' or 'standard', got {self.kernels!r}"
            )
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"warm_start.num_threads must be >= 1 or null, got {self.num_threads}")
        if self.lr <= 0:
            raise ValueError(f"warm_start.lr must be > 0, got {self.lr}")
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 2:
            raise ValueError(
                f"warm_start.micro_batch_tokens must be >= 2 or null, got {self.micro_batch_tokens}"
            )


def _summed_nll(model: Transformer, batch: Sequence[Demonstration]) -> torch.Tensor:
    """Summed negative log-likelihood of the assistant tokens of ``batch`` (one packed forward)."""
    if getattr(model, "vl_config", None) is not None:  # a vision-language model: its images go along
        from rz_agents.trainer.sequence_logprobs import trajectory_logprobs

        logps = trajectory_logprobs(model, batch, {})
        mask = [torch.tensor(d.loss_mask[1:], device=lp.device) for d, lp in zip(batch, logps, strict=True)]
        return -sum(lp[m].sum() for lp, m in zip(logps, mask, strict=True))
    tokens, positions, seq_ids = pack([d.tokens for d in batch])
    # row t predicts token t+1 of the same sequence: the LM head runs only on rows whose target the
    # policy wrote (most rows are prompt)
    rows, offset = [], 0
    for d in batch:
        rows += [offset + t for t in range(len(d.tokens) - 1) if d.loss_mask[t + 1]]
        offset += len(d.tokens)
    device = model.device
    rows_t = torch.tensor(rows, dtype=torch.long, device=device)
    tokens = tokens.to(device)
    hidden = model(tokens, positions.to(device), seq_ids.to(device))
    logp = token_logprobs(model, hidden[rows_t], tokens[rows_t + 1])
    return -logp.sum()


def supervised_warm_start(
    model: Transformer,
    demos: Sequence[Demonstration],
    cfg: WarmStartConfig,
    on_step: Callable[[int, int, float], None] | None = None,
    *,
    epochs: int | None = None,
    lr: float | None = None,
    warmup_steps: int | None = None,
) -> dict:
    """Train `model` in place on `demos` (cosine LR after a warmup); returns
    {"steps", "loss_start", "loss_end", "wall_s"}. epochs / lr / warmup_steps override cfg's."""
    cfg.validate()
    epochs = cfg.epochs if epochs is None else epochs
    peak = cfg.lr if lr is None else lr
    warmup = cfg.warmup_steps if warmup_steps is None else warmup_steps
    rng = random.Random(cfg.seed)
    order = list(range(len(demos)))
    total = epochs * math.ceil(len(demos) / cfg.batch_size)
    optim = OptimConfig(
        lr=peak,
        betas=(0.9, 0.98),
        weight_decay=cfg.weight_decay,
        max_grad_norm=1.0,
        schedule="cosine",
        warmup_steps=warmup,
        total_steps=total,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    opt, sched = build_optimizer(params, optim)

    t0 = time.perf_counter()
    losses: list[float] = []
    step = 0
    model.train()
    for _ in range(epochs):
        rng.shuffle(order)
        for i in range(0, len(order), cfg.batch_size):
            batch = [demos[j] for j in order[i : i + cfg.batch_size]]
            budget = cfg.micro_batch_tokens or sum(len(d.tokens) for d in batch)
            opt.zero_grad(set_to_none=True)
            n_targets = sum(sum(d.loss_mask[1:]) for d in batch)
            total_loss = 0.0
            for part in micro_batches([len(d.tokens) for d in batch], budget):
                nll = _summed_nll(model, [batch[k] for k in part])
                (nll / n_targets).backward()  # the batch's mean NLL, accumulated part by part
                total_loss += float(nll.detach())
            torch.nn.utils.clip_grad_norm_(params, optim.max_grad_norm)
            opt.step()
            sched.step()
            losses.append(total_loss / n_targets)
            step += 1
            if on_step:
                on_step(step, total, losses[-1])
    model.zero_grad(set_to_none=True)
    head = losses[: max(1, len(losses) // 20)]
    tail = losses[-max(1, len(losses) // 20) :]
    return {
        "steps": step,
        "loss_start": sum(head) / len(head) if head else math.nan,
        "loss_end": sum(tail) / len(tail) if tail else math.nan,
        "wall_s": time.perf_counter() - t0,
    }
