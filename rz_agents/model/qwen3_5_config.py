"""The Qwen3.5 text decoder's configuration, read from a checkpoint's config.json (a `qwen3_5_text` config,
or the `text_config` of a `qwen3_5` vision-language one)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

import torch

LAYER_KINDS = ("linear_attention", "full_attention")
# what `family:` / config.json's model_type may say: dense, and MoE (qwen3_5_moe: every layer's MLP routed)
MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
MOE_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")


@dataclass
class Qwen35Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    dtype: str = "float32"
    eos_token_id: int | list[int] | None = None
    # qwen3_5_moe: every layer's MLP is num_experts routed experts (softmax top-k, renormalized) plus a
    # shared expert behind a sigmoid gate; 0 experts: the dense model (intermediate_size's MLP)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    activation_checkpointing: bool = False  # the learner's choice (not part of the checkpoint)

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers"
            )
        bad = sorted(set(self.layer_types) - set(LAYER_KINDS))
        if bad:
            raise ValueError(f"layer_types: unknown kinds {bad}; expected {list(LAYER_KINDS)}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r}: only 'silu' is supported")
        if self.num_experts and not (0 < self.num_experts_per_tok <= self.num_experts):
            raise ValueError(
                f"num_experts_per_tok {self.num_experts_per_tok} not in 1..num_experts ({self.num_experts})"
            )

    @property
    def model_type(self) -> str:
        return "qwen3_5_moe_text" if self.num_experts else "qwen3_5_text"

    @property
    def norm_topk_prob(self) -> bool:
        """The router renormalizes its top-k probabilities (transformers' qwen3_5_moe always does)."""
        return True

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index``'s MLP is routed experts (every layer of a qwen3_5_moe model)."""
        return self.num_experts > 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def conv_dim(self) -> int:
        """Channels of a Gated DeltaNet layer's short convolution (its q, k and v)."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.value_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @classmethod
    def tiny(cls, moe: bool = False, **overrides) -> Qwen35Config:
        """A small random-init config (tests, CPU demos): 4 layers, the last full attention, the rest Gated
        DeltaNet, as the released models' 3:1 pattern; ``moe``: qwen3_5_moe's MLPs (8 experts, top 2, a
        shared expert). ``overrides`` replace any field (``layer_types`` follows ``num_hidden_layers`` unless
        given)."""
        known = {f.name for f in fields(cls)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise ValueError(f"model.tiny_overrides: unknown Qwen3.5 config fields {bad}")
        base = dict(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            rope_theta=10000.0, max_position_embeddings=4096,
        )  # fmt: skip
        if moe:
            base.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                        shared_expert_intermediate_size=64)  # fmt: skip
        base.update({k: v for k, v in overrides.items() if v is not None})
        if "layer_types" not in overrides:
            n = base["num_hidden_layers"]
            base["layer_types"] = tuple(
                "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)
            )
        base["layer_types"] = tuple(base["layer_types"])
        return cls(**base)

    @property
    def rotary_dim(self) -> int:
        """Dimensions of a full-attention head that RoPE rotates (the rest pass through)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_hf(cls, hf: dict) -> Qwen35Config:
        """From a config.json dict (`qwen3_5_text`, or `qwen3_5` with a `text_config`)."""
        if hf.get("model_type") in ("qwen3_5", "qwen3_5_moe") or "text_config" in hf:
            return cls.from_hf({**hf.get("text_config", {})})
        if hf.get("model_type") not in (None, "qwen3_5_text", "qwen3_5_moe_text"):
            raise ValueError(f"model_type {hf.get('model_type')!r} is not a Qwen3.5 text config")
        rope = hf.get("rope_parameters") or {}
        layers = hf["num_hidden_layers"]
        types = hf.get("layer_types") or [
            "full_attention" if (i + 1) % hf.get("full_attention_interval", 4) == 0 else "linear_attention"
            for i in range(layers)
        ]
        rope_type = rope.get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r}: only the default RoPE is supported")
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf.get("intermediate_size", 0),  # (a MoE checkpoint has no dense MLP)
            num_hidden_layers=layers,
            num_attention_heads=hf["num_attention_heads"],
            num_key_value_heads=hf["num_key_value_heads"],
            head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
            layer_types=tuple(types),
            linear_num_key_heads=hf["linear_num_key_heads"],
            linear_num_value_heads=hf["linear_num_value_heads"],
            linear_key_head_dim=hf["linear_key_head_dim"],
            linear_value_head_dim=hf["linear_value_head_dim"],
            linear_conv_kernel_dim=hf.get("linear_conv_kernel_dim", 4),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10_000_000.0)),
            partial_rotary_factor=rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)),
            max_position_embeddings=hf.get("max_position_embeddings", 32768),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            attention_bias=hf.get("attention_bias", False),
            hidden_act=hf.get("hidden_act", "silu"),
            dtype=str(hf.get("dtype") or hf.get("torch_dtype") or "float32").removeprefix("torch."),
            eos_token_id=hf.get("eos_token_id"),
            num_experts=hf.get("num_experts", 0),
            num_experts_per_tok=hf.get("num_experts_per_tok", 0),
            moe_intermediate_size=hf.get("moe_intermediate_size", 0),
            shared_expert_intermediate_size=hf.get("shared_expert_intermediate_size", 0),
        )

    def to_hf(self) -> dict:
        """A `qwen3_5_text` (or `qwen3_5_moe_text`) config.json dict (what `from_hf` reads back to this
        config)."""
        rope = ("rope_theta", "partial_rotary_factor")
        moe = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
        moe = (*moe, "shared_expert_intermediate_size")
        skip = (*rope, "activation_checkpointing", *(() if self.num_experts else moe))
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        d["layer_types"] = list(self.layer_types)
        d["rope_parameters"] = {"rope_type": "default", **{name: getattr(self, name) for name in rope}}
        arch = "Qwen3_5MoeForCausalLM" if self.num_experts else "Qwen3_5ForCausalLM"
        return {"architectures": [arch], "model_type": self.model_type, **d}

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | os.PathLike) -> Qwen35Config:
        """From `ckpt_dir`/config.json."""
        path = Path(ckpt_dir) / "config.json"
        if not path.is_file():
            raise ValueError(f"{ckpt_dir}: no config.json")
        return cls.from_hf(json.loads(path.read_text()))
