"""The LoRA arithmetic every path runs (model/lora.py has the adapters' config, creation and freezing).

Kept apart from lora.py so the layers that call it (layers.py, fused.py, transformer.py) import only this,
and lora.py may build a whole ``Transformer`` (``publication_bytes``) without an import cycle.
"""

from __future__ import annotations

import torch
from torch import nn


def adapted(layer: nn.Module, x: torch.Tensor, y: torch.Tensor, ops) -> torch.Tensor:
    """``y`` (the layer's own output of x) plus its adapter's ``scale * B (A x)``; ``y`` when not adapted."""
    a = getattr(layer, "lora_A", None)
    if a is None:
        return y
    return y + ops.linear(ops.linear(x, a.weight), layer.lora_B.weight) * layer.lora_scale


def linear(layer: nn.Linear, x: torch.Tensor, ops) -> torch.Tensor:
    """One linear layer through the op set, with its adapter if it has one."""
    return adapted(layer, x, ops.linear(x, layer.weight, layer.bias), ops)
