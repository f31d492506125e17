"""DeepSeek-V4's published shapes as config.json dicts, for meta-device builds and sizing without the weights.

`deepseek-v4-flash`: the sizes of transformers 5.19's DeepseekV4Config defaults (documented there as
deepseek-ai/DeepSeek-V4-Flash-Base) with its default layer schedule (two HCA layers, then HCA / CSA
interleaved; three hash-routed MoE layers first): 284.3B parameters, the published total. The released
checkpoint's compressed-branch YaRN parameters are not in those defaults and are not guessed here (the
compressed branches use the default rope at `compress_rope_theta`).

`deepseek-v4-pro`: deepseek-ai/DeepSeek-V4-Pro's published config.json sizes (not in transformers' defaults):
hidden 7168, 61 layers, 128 heads of 512 (q rank 1536, output rank 1024 in 16 groups), 384 routed experts of
3072 (top 6, routed scale 2.5), an indexer of 64 heads of 128 picking 1024 entries; the same layer schedule
rule, hash layers, window, rates and hyper-connections as Flash: 1.6T parameters, the published total.
"""

from __future__ import annotations

from typing import Any

from rz_agents.model.deepseek_v4_config import DeepseekV4Config

V4_PRESETS: dict[str, dict[str, Any]] = {
    "deepseek-v4-flash": dict(
        model_type="deepseek_v4", vocab_size=129280, hidden_size=4096, moe_intermediate_size=2048,
        num_hidden_layers=43, num_attention_heads=64, num_key_value_heads=1, head_dim=512, q_lora_rank=1024,
        num_experts_per_tok=6, n_routed_experts=256, n_shared_experts=1, scoring_func="sqrtsoftplus",
        routed_scaling_factor=1.5, max_position_embeddings=1048576, rope_theta=10000.0,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        compress_rope_theta=160000.0, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=10.0,
        sliding_window=128, o_groups=8, o_lora_rank=1024, index_n_heads=64, index_head_dim=128,
        index_topk=512, num_nextn_predict_layers=1, rms_norm_eps=1e-6, tie_word_embeddings=False,
        partial_rotary_factor=64 / 512, bos_token_id=0, eos_token_id=1, dtype="bfloat16",
    ),
    "deepseek-v4-pro": dict(
        model_type="deepseek_v4", vocab_size=129280, hidden_size=7168, moe_intermediate_size=3072,
        num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=1, head_dim=512, q_lora_rank=1536,
        num_experts_per_tok=6, n_routed_experts=384, n_shared_experts=1, scoring_func="sqrtsoftplus",
        routed_scaling_factor=2.5, max_position_embeddings=1048576, rope_theta=10000.0,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        compress_rope_theta=160000.0, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=10.0,
        sliding_window=128, o_groups=16, o_lora_rank=1024, index_n_heads=64, index_head_dim=128,
        index_topk=1024, num_nextn_predict_layers=1, rms_norm_eps=1e-6, tie_word_embeddings=False,
        partial_rotary_factor=64 / 512, bos_token_id=0, eos_token_id=1, dtype="bfloat16",
    ),
}  # fmt: skip


def deepseek_v4_preset(name: str, **overrides: Any) -> DeepseekV4Config:
    """The DeepseekV4Config of a published shape (a key of V4_PRESETS); ``overrides`` replace config.json
    fields (e.g. ``num_hidden_layers`` for a shallower build)."""
    key = name.lower()
    if key not in V4_PRESETS:
        raise KeyError(f"no DeepSeek-V4 preset {name!r}; known: {sorted(V4_PRESETS)}")
    return DeepseekV4Config.from_hf({**V4_PRESETS[key], **overrides})
