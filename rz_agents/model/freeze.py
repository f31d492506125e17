"""Freezing part of a model: its parameters stop requiring gradients, so a trainer that optimizes only the
parameters that do (the learner, the warm start's SFT) gives them no gradient, master copy or optimizer
state."""

from __future__ import annotations

from torch import nn


def _tower(model: nn.Module) -> nn.Module:
    tower = getattr(model, "visual", None) if getattr(model, "vl_config", None) is not None else None
    if not isinstance(tower, nn.Module):
        raise ValueError(
            f"learner.freeze_vision: the model ({type(model).__name__}) has no vision tower to freeze "
            "(it needs a vision-language model, e.g. model.model_type: qwen3_vl)"
        )
    return tower


def freeze_vision_tower(model: nn.Module) -> int:
    """Stop training the vision tower of a vision-language model (``model.visual``: its patch embedding,
    blocks and mergers); returns how many parameters it froze. Raises ValueError for a model without one.
    (``model.policy.build_policy`` calls it for ``PolicySpec.freeze_vision``.)"""
    tower = _tower(model)
    tower.requires_grad_(False)
    return sum(p.numel() for p in tower.parameters())


def vision_tower_frozen(model: nn.Module) -> bool:
    """Whether no parameter of ``model``'s vision tower trains. Raises ValueError, as
    ``freeze_vision_tower`` does, for a model without one."""
    return not any(p.requires_grad for p in _tower(model).parameters())
