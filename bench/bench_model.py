"""The benchmarks' shared model: Qwen3 architecture, hidden 512, 8 layers, 8 heads / 4 KV heads,
head_dim 64, intermediate 1536 (random weights; only shapes matter for speed)."""

from __future__ import annotations

from rz_agents.model import ModelConfig


def bench_config(vocab: int, dtype: str = "float32", eos_token_id: int | None = None) -> ModelConfig:
    return ModelConfig(
        model_type="qwen3",
        vocab_size=vocab,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
        eos_token_id=eos_token_id,
        dtype=dtype,
    )
