"""LoRA adapters: ``y = W x + b + scale * B (A x)`` on chosen linear layers, in the model's op set.

An adapter is two plain ``nn.Linear`` holders attached to the adapted layer as its children ``lora_A``
([rank, in]) and ``lora_B`` ([out, rank]), so the parameter names are PEFT's without its prefix
(``model.layers.0.self_attn.q_proj.lora_A.weight``; PEFT's file adds ``base_model.model.``). The math lives in
one function, ``adapted``, which every path calls after the layer's own GEMM: the trainer's packed forward,
the engine's prefill, chunked prefill and decode (all ``Transformer.forward``), the static decode step and
its CUDA graph (the same forward over static buffers), and the fused q/k/v and gate/up projections (the
stacked GEMM's column parts are the separate GEMMs' bits, see model/fused.py; each part then gets its own
adapter here, with the same ops in the same order). So engine and trainer run the same arithmetic per token.

The scale is applied after B's GEMM (``y + (B (A x)) * scale``), never folded into a weight, and adapters are
never merged into the base on one side only (merged weights round differently): merging is an export.
Dropout must be 0: the engine cannot apply it, so a trained token would be scored under another function
than it was sampled from.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from rz_agents.model.lora_math import adapted, linear  # noqa: F401 (the math: lora_math.py)

# Layers an adapter may target (Llama / Qwen2 / Qwen3 dense attention and MLP projections).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraConfig:
    """LoRA adapters on the policy: the base weights are frozen, only the adapters train and are published."""

    rank: int = 0  # adapter rank r (0: no LoRA, full fine-tune)
    alpha: float = 16.0  # scale = alpha / rank, applied to B (A x)
    # must be 0: the engine cannot apply dropout, so sampled and scored tokens would differ
    dropout: float = 0.0
    # Layer names to adapt (each layer of the model that has one): q_proj k_proj v_proj o_proj gate_proj
    # up_proj down_proj. MoE experts and DeepSeek-V3 (MLA) layers are refused.
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    init_seed: int = 0  # seed of A's random init (B starts at 0, so the adapted model starts as the base)

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if self.rank < 0:
            raise ValueError(f"learner.lora.rank must be >= 0, got {self.rank}")
        if not self.enabled:
            return
        if not math.isfinite(self.alpha) or self.alpha <= 0:
            raise ValueError(f"learner.lora.alpha must be > 0, got {self.alpha}")
        if self.dropout != 0:
            raise ValueError(
                f"learner.lora.dropout must be 0, got {self.dropout}: the engine cannot apply dropout, so "
                "the trainer would score tokens under another function than the engine sampled them from"
            )
        if not self.target_modules:
            raise ValueError("learner.lora.target_modules must name at least one layer")
        bad = [t for t in self.target_modules if t not in LORA_TARGETS]
        if bad:
            raise ValueError(f"learner.lora.target_modules: {bad} not among {list(LORA_TARGETS)}")


def _refuse_unsupported(model: nn.Module, targets: set[str]) -> None:
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) == "deepseek_v3":
        raise ValueError("learner.lora: DeepSeek-V3 (MLA + DeepSeek MoE) layers are not supported by LoRA")
    if getattr(cfg, "num_experts", 0) and targets & {"gate_proj", "up_proj", "down_proj"}:
        raise ValueError(
            "learner.lora.target_modules: MoE experts cannot be adapted (gate_proj/up_proj/down_proj on an "
            "MoE model); target the attention projections only"
        )


@torch.no_grad()
def add_lora(model: nn.Module, cfg: LoraConfig) -> list[str]:
    """Attach adapters to ``model``'s target layers and freeze everything else; returns the adapted layers'
    names. A starts random (seeded, PEFT's kaiming-uniform bound), B at zero: the model's function is
    unchanged until a step trains B. Call before the engine copies the model (both then hold adapters)."""
    cfg.validate()
    if not cfg.enabled:
        return []
    targets = set(cfg.target_modules)
    if has_lora(model):  # loaded with its adapter (a checkpoint's lora_adapter/): keep it if it is this one
        have = model.lora_config
        if (have.rank, have.alpha, sorted(have.target_modules)) != (cfg.rank, cfg.alpha, sorted(targets)):
            raise ValueError(
                f"learner.lora (rank {cfg.rank}, alpha {cfg.alpha}, {sorted(targets)}) does not match the "
                f"checkpoint's adapter (rank {have.rank}, alpha {have.alpha}, {sorted(have.target_modules)})"
            )
        model.requires_grad_(False)
        for name in adapter_names(model):
            model.get_parameter(name).requires_grad_(True)
        return sorted({n.rsplit(".lora_", 1)[0] for n in adapter_names(model)})
    _refuse_unsupported(model, targets)
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(cfg.init_seed)
    model.requires_grad_(False)
    names = []
    for name, m in model.named_modules():
        if not isinstance(m, nn.Linear) or name.rsplit(".", 1)[-1] not in targets:
            continue
        if hasattr(m, "lora_A"):
            raise ValueError(f"{name} already has a LoRA adapter")
        a = nn.Linear(m.in_features, cfg.rank, bias=False)
        b = nn.Linear(cfg.rank, m.out_features, bias=False)
        bound = 1.0 / math.sqrt(m.in_features)  # kaiming_uniform(a=sqrt(5)) as PEFT and nn.Linear use
        a.weight.copy_(torch.rand(a.weight.shape, generator=gen) * 2 * bound - bound)
        b.weight.zero_()
        m.lora_A = a.to(device=device, dtype=dtype)
        m.lora_B = b.to(device=device, dtype=dtype)
        m.lora_scale = cfg.scale
        names.append(name)
    for name in adapter_names(model):
        model.get_parameter(name).requires_grad_(True)
    if not names:
        raise ValueError(f"learner.lora.target_modules {sorted(targets)} matched no layer of the model")
    model.lora_config = cfg
    return names


def adapter_names(model: nn.Module) -> list[str]:
    """State-dict names of the adapter tensors, in state-dict order."""
    return [k for k in model.state_dict() if ".lora_A." in k or ".lora_B." in k]


def has_lora(model: nn.Module) -> bool:
    return any(".lora_A." in k for k, _ in model.named_parameters())


@contextmanager
def base_trainable(model: nn.Module) -> Iterator[None]:
    """Within the block the base weights train and the adapters are frozen (a supervised warm start of the
    base before LoRA RL: the adapters stay at their init, B = 0); restored after. No-op without adapters."""
    if not has_lora(model):
        yield
        return
    saved = {n: p.requires_grad for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.requires_grad_(".lora_" not in n)
    try:
        yield
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(saved[n])


def publication_bytes(config, cfg: LoraConfig) -> tuple[int, int]:
    """(bytes of the adapter tensors, bytes of every weight) one weight update of a model with ``config``
    publishes with LoRA ``cfg`` vs a full update (from the shapes only: the model is built on the meta
    device). Tied embeddings count once."""
    from rz_agents.model.transformer import Transformer  # (lora.py is imported by transformer.py)

    with torch.device("meta"):
        model = Transformer(config, init=False)
    size = torch.empty((), dtype=next(model.parameters()).dtype, device="meta").element_size()
    full = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) * size
    _refuse_unsupported(model, set(cfg.target_modules))
    adapter = sum(
        cfg.rank * (m.in_features + m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in cfg.target_modules
    )
    return adapter * size, full


@torch.no_grad()
def merge_into_base(model: nn.Module) -> None:
    """Fold every adapter into its base weight (``W + scale * B A``, computed in fp32, rounded once to the
    weight's dtype) and remove the adapters: an export step (the merged model's log-probs are close to the
    adapted model's, not bit-identical, so an engine never merges on its own)."""
    for m in list(model.modules()):
        a = getattr(m, "lora_A", None)
        if a is None:
            continue
        delta = (m.lora_B.weight.float() @ a.weight.float()) * m.lora_scale
        m.weight.copy_((m.weight.float() + delta).to(m.weight.dtype))
        del m.lora_A, m.lora_B, m.lora_scale
    if hasattr(model, "lora_config"):
        del model.lora_config
    model.requires_grad_(True)
