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

_QWEN2_COMMON: dict[str, Any] = dict(
    model_type="qwen2",
    vocab_size=151936,
    rms_norm_eps=1e-6,
    bos_token_id=151643,
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
    # Qwen2 family: q/k/v biases, no q/k norm (config.json of the published checkpoints)
    "qwen2.5-1.5b-instruct": dict(
        _QWEN2_COMMON,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        head_dim=128,
        rope_theta=1_000_000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        eos_token_id=151645,
    ),
    "qwen2.5-7b-instruct": dict(
        _QWEN2_COMMON,
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        head_dim=128,
        rope_theta=1_000_000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        eos_token_id=151645,
    ),
    # the recipe's published mismatch model (Qwen2.5-Math-1.5B's architecture)
    "deepseek-r1-distill-qwen-1.5b": dict(
        _QWEN2_COMMON,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        head_dim=128,
        rope_theta=10_000.0,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        bos_token_id=151646,
        eos_token_id=151643,
    ),
    # DeepSeek-V3 (671B total, 37B active): MLA + DeepSeek MoE, YaRN to 160k positions
    "deepseek-v3": dict(
        model_type="deepseek_v3",
        vocab_size=129280,
        hidden_size=7168,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=61,
        num_attention_heads=128,
        num_key_value_heads=128,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        num_experts=256,
        num_experts_per_tok=8,
        n_shared_experts=1,
        n_group=8,
        topk_group=4,
        routed_scaling_factor=2.5,
        first_k_dense_replace=3,
        norm_topk_prob=True,
        rms_norm_eps=1e-6,
        rope_theta=10_000.0,
        max_position_embeddings=163840,
        rope_scaling=dict(
            rope_type="yarn",
            factor=40,
            original_max_position_embeddings=4096,
            beta_fast=32,
            beta_slow=1,
            mscale=1.0,
            mscale_all_dim=1.0,
        ),
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        dtype="bfloat16",
    ),
}


def _qwen3_vl(text: dict[str, Any], vision: dict[str, Any], tied: bool) -> dict[str, Any]:
    """An HF config.json dict of a Qwen3-VL checkpoint (model_type qwen3_vl) from its sizes."""
    return dict(
        model_type="qwen3_vl",
        tie_word_embeddings=tied,
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
        text_config=dict(
            vocab_size=151936,
            head_dim=128,
            num_key_value_heads=8,
            rms_norm_eps=1e-6,
            max_position_embeddings=262144,
            attention_bias=False,
            bos_token_id=151643,
            eos_token_id=151645,
            dtype="bfloat16",
            tie_word_embeddings=tied,
            rope_scaling={"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
            rope_theta=5_000_000,
            **text,
        ),
        vision_config=dict(
            hidden_act="gelu_pytorch_tanh",
            in_channels=3,
            num_heads=16,
            num_position_embeddings=2304,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            **vision,
        ),
    )


# Qwen3-VL (the config.json of the published Qwen/Qwen3-VL-*-Instruct checkpoints): a Qwen3 decoder and a
# vision tower feeding it deepstack features. Built by preset_config as a Qwen3VLConfig.
VL_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-vl-2b-instruct": _qwen3_vl(
        dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16),
        dict(depth=24, hidden_size=1024, intermediate_size=4096, out_hidden_size=2048,
             deepstack_visual_indexes=[5, 11, 17]),
        tied=True,
    ),
    "qwen3-vl-4b-instruct": _qwen3_vl(
        dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32),
        dict(depth=24, hidden_size=1024, intermediate_size=4096, out_hidden_size=2560,
             deepstack_visual_indexes=[5, 11, 17]),
        tied=True,
    ),
    "qwen3-vl-8b-instruct": _qwen3_vl(
        dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32),
        dict(depth=27, hidden_size=1152, intermediate_size=4304, out_hidden_size=4096,
             deepstack_visual_indexes=[8, 16, 24]),
        tied=False,
    ),
}  # fmt: skip


def _qwen3_5(layers: int, tied: bool, **sizes: Any) -> dict[str, Any]:
    """The `text_config` of a released Qwen3.5 checkpoint (model_type qwen3_5_text) from its sizes: every
    released size shares the vocabulary, the 256-wide gated full-attention heads with a quarter of each
    rotated, 16 Gated DeltaNet key heads of 128 (value heads of 128), the 4-tap conv and one full-attention
    layer in four."""
    return dict(
        model_type="qwen3_5_text",
        vocab_size=248320,
        num_hidden_layers=layers,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        head_dim=256,
        linear_num_key_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000, "partial_rotary_factor": 0.25},
        max_position_embeddings=262144,
        tie_word_embeddings=tied,
        eos_token_id=248044,
        dtype="bfloat16",
        **sizes,
    )


# Qwen3.5 (hybrid linear attention: Gated DeltaNet in three layers of four), the text decoder of the released
# Qwen/Qwen3.5-* checkpoints (their config.json's text_config). Source: the published config.json values as
# quoted by public code that reads them (found through the search tool): 0.8B/2B/4B/9B in a Qwen3.5 spec
# derivation's fixtures ("the models' own config.json, unedited"; the 0.8B's nested text_config) and a TPU
# trainer's size table ("9B has an untied lm_head"); 27B from a Qwen3_5Config built with its values (hidden
# 5120, 64 layers, 48 value heads, untied). The released names count the vision tower and the
# multi-token-prediction layer too; rz builds the text decoder (tests/model/test_qwen3_5_presets.py checks
# its size against the name). Qwen3.5-35B-A3B (qwen3_5_moe): its text_config as a MoE test of the same kind
# of source quotes it (40 layers of 2048, 256 experts of 512 with top 8 and a shared expert of 512, untied).
QWEN3_5_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3.5-0.8b": _qwen3_5(24, True, hidden_size=1024, intermediate_size=3584, num_attention_heads=8,
                             num_key_value_heads=2, linear_num_value_heads=16),
    "qwen3.5-2b": _qwen3_5(24, True, hidden_size=2048, intermediate_size=6144, num_attention_heads=8,
                           num_key_value_heads=2, linear_num_value_heads=16),
    "qwen3.5-4b": _qwen3_5(32, True, hidden_size=2560, intermediate_size=9216, num_attention_heads=16,
                           num_key_value_heads=4, linear_num_value_heads=32),
    "qwen3.5-9b": _qwen3_5(32, False, hidden_size=4096, intermediate_size=12288, num_attention_heads=16,
                           num_key_value_heads=4, linear_num_value_heads=32),
    "qwen3.5-27b": _qwen3_5(64, False, hidden_size=5120, intermediate_size=17408, num_attention_heads=24,
                            num_key_value_heads=4, linear_num_value_heads=48),
    "qwen3.5-35b-a3b": {**_qwen3_5(40, False, hidden_size=2048, num_attention_heads=16, num_key_value_heads=2,
                                   linear_num_value_heads=32, num_experts=256, num_experts_per_tok=8,
                                   moe_intermediate_size=512, shared_expert_intermediate_size=512),
                        "model_type": "qwen3_5_moe_text"},
}  # fmt: skip


def _qwen3_5_vl(text: str, **vision: Any) -> dict[str, Any]:
    """An HF config.json dict of a released Qwen3.5 checkpoint with its vision tower (model_type qwen3_5): the
    text decoder of QWEN3_5_PRESETS[text] and a tower of the given sizes (Qwen3-VL's, without deepstack)."""
    t = QWEN3_5_PRESETS[text]
    return dict(
        model_type="qwen3_5",
        tie_word_embeddings=t["tie_word_embeddings"],
        dtype=t["dtype"],
        text_config=dict(t),
        vision_config=dict(
            hidden_act="gelu_pytorch_tanh", in_channels=3, num_heads=16, num_position_embeddings=2304,
            patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=t["hidden_size"],
            **vision,
        ),
    )  # fmt: skip


# Qwen3.5 with its vision tower (the released checkpoints are vision-language; QWEN3_5_PRESETS are their text
# decoders): built by preset_config as a Qwen35VLConfig, so the dry run counts the tower. Sources (public code
# quoting the config.json values, found through the search tool): Qwen3.5-4B's tower is Qwen3-VL-4B's size (24
# blocks of 1024, MLP 4096: two independent readers' fixtures of the 4B config); the 27B's is transformers'
# Qwen3_5VisionConfig default, documented with Qwen/Qwen3.5-27B (27 blocks of 1152, MLP 4304).
QWEN3_5_VL_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3.5-4b-vl": _qwen3_5_vl("qwen3.5-4b", depth=24, hidden_size=1024, intermediate_size=4096),
    "qwen3.5-27b-vl": _qwen3_5_vl("qwen3.5-27b", depth=27, hidden_size=1152, intermediate_size=4304),
}


def _released_qwen3_vl_images():
    from rz_agents.model.qwen3_vl_config import ImageProcessing

    # Qwen/Qwen3-VL-*-Instruct preprocessor_config.json: size.shortest_edge / longest_edge, image_mean / std
    return ImageProcessing(65_536, 16_777_216, image_mean=[0.5] * 3, image_std=[0.5] * 3)


def preset_config(name: str, **overrides: Any):
    """The config of a published architecture: a ModelConfig for a key of PRESETS (`qwen3-4b`,
    `qwen2.5-1.5b-instruct`, `deepseek-r1-distill-qwen-1.5b`, `deepseek-v3`, ...), a Qwen3VLConfig for one of
    VL_PRESETS (`qwen3-vl-4b-instruct`, ...; ``overrides`` then apply to its language model's fields, with
    ``dtype`` for the whole model), a Qwen35Config for one of QWEN3_5_PRESETS (`qwen3.5-4b`, ...; overrides
    are config.json fields), a KimiLinearConfig for a Kimi Linear preset (`kimi-linear-48b-a3b`, or a released
    checkpoint's name; only ``dtype`` overrides)."""
    from rz_agents.model.kimi_linear_presets import PRESETS as KIMI_PRESETS
    from rz_agents.model.kimi_linear_presets import kimi_linear_preset, kimi_linear_preset_name

    key = name.lower()
    if kimi_linear_preset_name(key) is not None:
        unknown = sorted(set(overrides) - {"dtype"})
        if unknown:
            raise KeyError(f"preset {name!r}: only dtype can be overridden, got {unknown}")
        return kimi_linear_preset(key, dtype=overrides.get("dtype"))
    if key in QWEN3_5_PRESETS:
        from rz_agents.model.qwen3_5_config import Qwen35Config

        return Qwen35Config.from_hf({**QWEN3_5_PRESETS[key], **overrides})
    if key in QWEN3_5_VL_PRESETS:
        from rz_agents.model.qwen3_5_vl_config import Qwen35VLConfig

        d = dict(QWEN3_5_VL_PRESETS[key])
        d["text_config"] = {**d["text_config"], **overrides}
        config = Qwen35VLConfig.from_hf(d)
        config.vision.image_processing = _released_qwen3_vl_images()
        return config
    if key in VL_PRESETS:
        from rz_agents.model.qwen3_vl_config import Qwen3VLConfig

        d = dict(VL_PRESETS[key])
        d["text_config"] = {**d["text_config"], **overrides}
        config = Qwen3VLConfig.from_hf(d, dtype=overrides.get("dtype"))
        config.vision.image_processing = _released_qwen3_vl_images()
        return config
    if key not in PRESETS:
        known = sorted(PRESETS) + sorted(VL_PRESETS) + sorted(QWEN3_5_PRESETS) + sorted(QWEN3_5_VL_PRESETS)
        known += sorted(KIMI_PRESETS)
        raise KeyError(f"no preset {name!r}; known: {known}")
    return ModelConfig(**{**PRESETS[key], **overrides})


def preset_for_checkpoint(path: str) -> str | None:
    """The preset whose name is the checkpoint directory's name (e.g. /models/Qwen3-4B -> qwen3-4b,
    /models/Qwen3-VL-4B-Instruct -> qwen3-vl-4b-instruct, /models/Qwen3.5-4B -> qwen3.5-4b,
    /models/Kimi-Linear-48B-A3B-Instruct -> kimi-linear-48b-a3b)."""
    from rz_agents.model.kimi_linear_presets import kimi_linear_preset_name

    key = PurePath(path).name.lower()
    if key in PRESETS or key in VL_PRESETS or key in QWEN3_5_PRESETS or key in QWEN3_5_VL_PRESETS:
        return key
    return kimi_linear_preset_name(key)
