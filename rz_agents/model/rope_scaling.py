"""RoPE tables of a model config: the default frequencies, or YaRN-scaled ones (DeepSeek-V3, long-context
Qwen2.5).

YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension") blends, per frequency, the original
frequency (kept for the fast-rotating dims, which see many full turns within the pretraining length) and the
frequency divided by `factor` (for the slow dims), with a linear ramp between the dims whose number of turns
over `original_max_position_embeddings` is `beta_fast` and `beta_slow`; cos and sin are multiplied by an
attention factor (`attention_factor`, or derived from `factor`, `mscale` and `mscale_all_dim`). DeepSeek
also scales the softmax by mscale(factor, mscale_all_dim)^2 (`softmax_scale_factor`). The values follow the
published formulas and the field names of HF config.json; tests compare the model with transformers.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rz_agents.model.config import ModelConfig
from rz_kernels import RopeTable


def _mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context extended `factor` times (1 when not extended)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _turns_dim(turns: float, dim: int, base: float, length: int) -> float:
    """The (fractional) dim index whose frequency makes `turns` full turns over `length` positions."""
    return dim * math.log(length / (turns * 2 * math.pi)) / (2 * math.log(base))


def yarn_frequencies(
    dim: int, base: float, params: dict[str, Any], max_positions: int
) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim // 2] fp32, cos/sin factor) of YaRN with HF's `rope_scaling` fields `params`."""
    original = params.get("original_max_position_embeddings") or max_positions
    factor = params.get("factor") or max_positions / original
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1
    factor_cos = params.get("attention_factor")
    if factor_cos is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        factor_cos = (
            _mscale(factor, mscale) / _mscale(factor, mscale_all)
            if mscale and mscale_all
            else _mscale(factor)
        )
    low = _turns_dim(beta_fast, dim, base, original)
    high = _turns_dim(beta_slow, dim, base, original)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of zero width
    cpu = torch.device("cpu")  # real tensors even under a meta-device model build
    base_freq = base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=cpu) / dim)
    extrapolated, interpolated = 1.0 / base_freq, 1.0 / (factor * base_freq)
    keep = 1 - torch.clamp(
        (torch.arange(dim // 2, dtype=torch.float32, device=cpu) - low) / (high - low), 0, 1
    )
    return interpolated * (1 - keep) + extrapolated * keep, float(factor_cos)


def rope_table(config: ModelConfig) -> RopeTable:
    """The model's RoPE table: `rope_dim` rotated dims, default or YaRN frequencies."""
    dim, scaling = config.rope_dim, config.rope_scaling
    if scaling is None or scaling.get("rope_type", "default") == "default":
        return RopeTable(dim, config.rope_theta, config.max_position_embeddings)
    inv_freq, factor_cos = yarn_frequencies(dim, config.rope_theta, scaling, config.max_position_embeddings)
    return RopeTable(
        dim, config.rope_theta, config.max_position_embeddings, inv_freq=inv_freq, scale=factor_cos
    )


def softmax_scale_factor(config: ModelConfig) -> float:
    """DeepSeek's extra softmax scale under YaRN: mscale(factor, mscale_all_dim)^2 (1 without it)."""
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type", "default") == "default" or not scaling.get("mscale_all_dim"):
        return 1.0
    m = _mscale(scaling["factor"], scaling["mscale_all_dim"])
    return m * m
