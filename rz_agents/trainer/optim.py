"""AdamW and the learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class OptimConfig:
    """AdamW hyper-parameters, gradient clipping and the LR schedule (warmup then constant/linear/cosine)."""

    lr: float = 1e-5  # AdamW learning rate (after warmup)
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    eps: float = 1e-8  # AdamW epsilon
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    max_grad_norm: float = 1.0  # <= 0 disables clipping (the norm is still computed for the guard)
    schedule: str = "constant"  # constant | linear | cosine decay after the warmup
    warmup_steps: int = 0  # steps of linear warmup from 0 to lr
    total_steps: int = 0  # needed by linear/cosine decay
    min_lr_ratio: float = 0.0  # linear/cosine decay ends at lr * min_lr_ratio
    # A vision-language model's vision tower trains at this rate (null: lr), the schedule and lr control
    # applying to both. On the visual RL task the picture-dependent gradient lives in the tower while the
    # language model's is mostly noise along a shared side preference (docs/visual_envs.md).
    vision_lr: float | None = None

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optim.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.schedule != "constant" and self.total_steps <= 0:
            raise ValueError(f"optim.total_steps must be > 0 for schedule {self.schedule!r}")
        if self.vision_lr is not None and not self.vision_lr > 0:
            raise ValueError(f"optim.vision_lr must be > 0 or null, got {self.vision_lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")


def lr_factor(step: int, cfg: OptimConfig) -> float:
    """Multiplier of cfg.lr at optimizer step ``step`` (0-based)."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(cfg.total_steps - cfg.warmup_steps, 1)
    progress = min(max(step - cfg.warmup_steps, 0) / span, 1.0)
    if cfg.schedule == "linear":
        decay = 1.0 - progress
    else:
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * decay


def build_optimizer(
    params, cfg: OptimConfig, vision: int = 0
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable params and a LambdaLR following ``lr_factor``. ``vision``: the last that many
    of ``params`` are a vision tower's, in a group of their own at ``cfg.vision_lr`` when it is set."""
    cfg.validate()
    params = [p for p in params if p.requires_grad]
    groups: list = params
    if vision and cfg.vision_lr is not None:
        groups = [{"params": params[: len(params) - vision]}, {"params": params[len(params) - vision :]}]
        groups[1]["lr"] = cfg.vision_lr
    opt = torch.optim.AdamW(
        groups,
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        foreach=True,  # one launch per op over all tensors (the same bits as the per-parameter loop)
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    return opt, sched
