"""Published architectures (the config.json fields of the real checkpoints), for building random-init
models of the real shapes: memory estimates when the checkpoint is not on this machine, meta-device
builds, and the GPU check's benchmark models. No weights are involved."""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from rz_agents.model.config import ModelConfig

_QWEN3_COMMON: dict[str, Any] = dict(
    vocab_size=151936,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    max_position_embeddings=40960,
    attention_bias=False,
    bos_token_id=151643,
    eos_token_id=151645,
    dtype="bfloat16",
)

PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(
        _QWEN3_COMMON,
        model_type="qwen3",
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),
    "qwen3-4b": dict(
        _QWEN3_COMMON,
        model_type="qwen3",
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),
    "qwen3-30b-a3b": dict(
        _QWEN3_COMMON,
        model_type="qwen3_moe",
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        tie_word_embeddings=False,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    ),
}


def preset_config(name: str, **overrides: Any) -> ModelConfig:
    """The ModelConfig of a published architecture (`qwen3-0.6b`, `qwen3-4b`, `qwen3-30b-a3b`)."""
    key = name.lower()
    if key not in PRESETS:
        raise KeyError(f"no preset {name!r}; known: {sorted(PRESETS)}")
    return ModelConfig(**{**PRESETS[key], **overrides})


def preset_for_checkpoint(path: str) -> str | None:
    """The preset whose name is the checkpoint directory's name (e.g. /models/Qwen3-4B -> qwen3-4b)."""
    key = PurePath(path).name.lower()
    return key if key in PRESETS else None
