"""Supervised fine-tuning on demonstrations (masked next-token cross-entropy), on the aligned model."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rz_agents.model.logprobs import token_logprobs
from rz_agents.model.transformer import Transformer
from rz_agents.warmstart.demos import Demonstration


@dataclass
class WarmStartConfig:
    """Supervised warm start before RL, in two phases. `demos: 0` disables it.

    1. format: `demos` tool-use demonstrations for `epochs` epochs (the call format, copying the
       expression into the call and the tool's output into the answer);
    2. prior: `prior_demos` demonstrations of which only `tool_fraction` use the tool, the rest
       answer at once with a guess, for one epoch: the policy ends up rarely calling its tool, as
       base models often do. RL then has to learn when the tool pays.
    """

    demos: int = 0
    prior_demos: int = 0
    task: str = "arithmetic"  # demonstrations' tasks: "arithmetic" ("Compute 37*48+12.") or "word_problems"
    tool_fraction: float = 0.2
    difficulty: int = 1
    epochs: int = 3
    batch_size: int = 32
    lr: float = 3e-3
    prior_lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    seed: int = 0
    # op set of the SFT: null keeps the run's kernels; "standard" is faster (RL still uses the run's)
    kernels: str | None = None
    # torch threads of the SFT (it runs before RL, alone): null keeps the run's num_threads
    num_threads: int | None = None

    def validate(self) -> None:
        if self.demos < 0 or self.prior_demos < 0:
            raise ValueError(
                f"warm_start.demos and prior_demos must be >= 0, got {self.demos}, {self.prior_demos}"
            )
        if not 0.0 <= self.tool_fraction <= 1.0:
            raise ValueError(f"warm_start.tool_fraction must be in [0, 1], got {self.tool_fraction}")
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError("warm_start.epochs and warm_start.batch_size must be >= 1")
        if self.task not in ("arithmetic", "word_problems"):
            raise ValueError(f"warm_start.task must be 'arithmetic' or 'word_problems', got {self.task!r}")
        if self.kernels not in (None, "aligned", "standard"):
            raise ValueError(
                f"warm_start.kernels must be null, 'aligned' or 'standard', got {self.kernels!r}"
            )
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"warm_start.num_threads must be >= 1 or null, got {self.num_threads}")
        if self.lr <= 0:
            raise ValueError(f"warm_start.lr must be > 0, got {self.lr}")


def _batch_loss(model: Transformer, batch: Sequence[Demonstration]) -> torch.Tensor:
    lengths = [len(d.tokens) for d in batch]
    tokens = torch.tensor([t for d in batch for t in d.tokens], dtype=torch.long)
    positions = torch.cat([torch.arange(n) for n in lengths])
    seq_ids = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)])
    # row t predicts token t+1 of the same sequence; train only where token t+1 is an assistant token
    rows, targets = [], []
    offset = 0
    for d, n in zip(batch, lengths, strict=True):
        for t in range(n - 1):
            if d.loss_mask[t + 1]:
                rows.append(offset + t)
                targets.append(d.tokens[t + 1])
        offset += n
    device = model.device
    hidden = model(tokens.to(device), positions.to(device), seq_ids.to(device))
    logp = token_logprobs(
        model, hidden[torch.tensor(rows, device=device)], torch.tensor(targets, device=device)
    )
    return -logp.mean()


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
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=peak, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    order = list(range(len(demos)))
    total = epochs * math.ceil(len(demos) / cfg.batch_size)

    def lr_at(step: int) -> float:
        if step < warmup:
            return peak * (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    t0 = time.perf_counter()
    losses: list[float] = []
    step = 0
    model.train()
    for _ in range(epochs):
        rng.shuffle(order)
        for i in range(0, len(order), cfg.batch_size):
            batch = [demos[j] for j in order[i : i + cfg.batch_size]]
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            loss = _batch_loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(float(loss.detach()))
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
