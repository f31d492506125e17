"""Published Kimi Linear architectures (config.json fields of the released checkpoints, no weights): for
meta-device builds and cache sizing when the checkpoint is not on this machine.

Kimi-Linear-48B-A3B (Base and Instruct share the architecture): the fields of
huggingface.co/moonshotai/Kimi-Linear-48B-A3B-Instruct/config.json in Moonshot's form (1-indexed
`linear_attn_config` layer lists; 20 KDA and 7 MLA layers). transformers' `KimiLinearConfig` defaults, which
name that checkpoint, agree on every shape but its default layer split.
"""

from __future__ import annotations

from typing import Any

from rz_agents.model.kimi_linear_config import KimiLinearConfig

_MLA_LAYERS = [4, 8, 12, 16, 20, 24, 27]

PRESETS: dict[str, dict[str, Any]] = {
    "kimi-linear-48b-a3b": {
        "model_type": "kimi_linear",
        "vocab_size": 163840,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "moe_intermediate_size": 1024,
        "num_hidden_layers": 27,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "mla_use_nope": True,
        "num_experts": 256,
        "num_experts_per_token": 8,
        "num_shared_experts": 1,
        "num_expert_group": 1,
        "topk_group": 1,
        "moe_renormalize": True,
        "routed_scaling_factor": 2.446,
        "first_k_dense_replace": 1,
        "rms_norm_eps": 1e-5,
        "model_max_length": 1_048_576,
        "tie_word_embeddings": False,
        "bos_token_id": 163584,
        "eos_token_id": 163586,
        "dtype": "bfloat16",
        "linear_attn_config": {
            "full_attn_layers": _MLA_LAYERS,
            "kda_layers": [i for i in range(1, 28) if i not in _MLA_LAYERS],
            "num_heads": 32,
            "head_dim": 128,
            "short_conv_kernel_size": 4,
        },
    },
}


# The released checkpoints' directory names (moonshotai/Kimi-Linear-48B-A3B-Instruct, -Base), lowercased: a
# checkpoint path of that name that is not on this machine is sized by the preset (`rz train --dry-run`)
CHECKPOINT_NAMES: dict[str, str] = {
    "kimi-linear-48b-a3b-instruct": "kimi-linear-48b-a3b",
    "kimi-linear-48b-a3b-base": "kimi-linear-48b-a3b",
}


def kimi_linear_preset_name(name: str) -> str | None:
    """The preset a name (a preset's own, or a released checkpoint directory's, any case) stands for."""
    key = name.lower()
    return key if key in PRESETS else CHECKPOINT_NAMES.get(key)


def kimi_linear_preset(name: str, dtype: str | None = None) -> KimiLinearConfig:
    """The config of a published Kimi Linear model by preset name or released checkpoint name (ValueError
    naming the known ones)."""
    key = kimi_linear_preset_name(name)
    if key is None:
        raise ValueError(f"unknown Kimi Linear preset {name!r}; known: {sorted(PRESETS)}")
    config = KimiLinearConfig.from_hf(PRESETS[key])
    if dtype is not None:
        config.dtype = dtype
    return config
