"""Kimi Linear's configuration (KDA linear attention + MLA full attention + DeepSeek-style MoE), read from a
checkpoint's config.json: the form transformers writes (`layer_types`, `mlp_layer_types`, `num_experts`,
`moe_renormalize`, ...) and Moonshot's original one (`linear_attn_config` with 1-indexed `kda_layers` /
`full_attn_layers`, `first_k_dense_replace`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

import torch

LAYER_KINDS = ("linear_attention", "full_attention")
MLP_KINDS = ("dense", "sparse")
MODEL_TYPES = ("kimi_linear",)
HF_NAMES = {
    "num_experts_per_tok": "num_experts_per_token",
    "n_shared_experts": "num_shared_experts",
    "n_group": "num_expert_group",
    "norm_topk_prob": "moe_renormalize",
    "max_position_embeddings": "model_max_length",
}


@dataclass
class KimiLinearConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    layer_types: tuple[str, ...]
    mlp_layer_types: tuple[str, ...]
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    num_experts: int
    num_experts_per_tok: int
    linear_num_heads: int
    linear_head_dim: int
    q_lora_rank: int | None = None
    n_shared_experts: int = 1
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 2.446
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 1_048_576
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    activation_checkpointing: bool = False  # the learner's choice (not part of the checkpoint)

    # MLA here is NoPE (no rotary embedding at all); the shared attention code reads these
    rope_scaling = None
    rope_interleave = False

    def __post_init__(self) -> None:
        for name, kinds in (("layer_types", LAYER_KINDS), ("mlp_layer_types", MLP_KINDS)):
            value = getattr(self, name)
            if len(value) != self.num_hidden_layers:
                raise ValueError(f"{name} has {len(value)} entries for {self.num_hidden_layers} layers")
            bad = sorted(set(value) - set(kinds))
            if bad:
                raise ValueError(f"{name}: unknown kinds {bad}; expected {list(kinds)}")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r}: only 'silu' is supported")
        if self.num_experts % self.n_group:
            raise ValueError(
                f"num_experts ({self.num_experts}) must be a multiple of n_group ({self.n_group})"
            )

    @property
    def model_type(self) -> str:
        return "kimi_linear"

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def num_key_value_heads(self) -> int:
        """Heads of the (expanded) keys and values the attention cache holds: one per query head."""
        return self.num_attention_heads

    @property
    def head_dim(self) -> int:
        """The MLA cache's head dim: the q/k head dim and the value head dim padded with zeros to one power
        of two (as rz's MLA for DeepSeek, model/mla.py)."""
        need = max(self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim)
        return 1 << (need - 1).bit_length()

    @property
    def linear_dim(self) -> int:
        """Channels of each of a KDA layer's q, k and v (heads x head dim)."""
        return self.linear_num_heads * self.linear_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of a KDA layer's short convolutions (q, k and v together)."""
        return 3 * self.linear_dim

    @classmethod
    def tiny(cls, **overrides) -> KimiLinearConfig:
        """A small random-init config (tests, CPU demos): 4 layers (3 KDA then MLA, the released 3:1
        pattern), the first MLP dense, the rest MoE. ``overrides`` replace any field (``layer_types`` and
        ``mlp_layer_types`` follow ``num_hidden_layers`` unless given)."""
        known = {f.name for f in fields(cls)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise ValueError(f"model.tiny_overrides: unknown Kimi Linear config fields {bad}")
        base = dict(
            vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            num_hidden_layers=4, num_attention_heads=4, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=16, num_experts=8, num_experts_per_tok=2, linear_num_heads=4,
            linear_head_dim=16, max_position_embeddings=4096,
        )  # fmt: skip
        base.update({k: v for k, v in overrides.items() if v is not None})
        n = base["num_hidden_layers"]
        if "layer_types" not in overrides:
            base["layer_types"] = [
                "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)
            ]
        if "mlp_layer_types" not in overrides:
            base["mlp_layer_types"] = ["dense" if i == 0 else "sparse" for i in range(n)]
        base["layer_types"], base["mlp_layer_types"] = (
            tuple(base["layer_types"]),
            tuple(base["mlp_layer_types"]),
        )
        return cls(**base)

    @classmethod
    def from_hf(cls, hf: dict) -> KimiLinearConfig:
        """From a config.json dict (transformers' or Moonshot's form of a `kimi_linear` config)."""
        if hf.get("model_type") not in (None, "kimi_linear"):
            raise ValueError(f"model_type {hf.get('model_type')!r} is not a Kimi Linear config")
        layers = hf["num_hidden_layers"]
        linear = hf.get("linear_attn_config") or {}

        def pick(*names, default=None):
            return next((hf[n] for n in names if hf.get(n) is not None), default)

        types = hf.get("layer_types")
        if types is None and "kda_layers" in linear:  # Moonshot's form: 1-indexed layer lists
            types = [None] * layers
            for i in linear.get("full_attn_layers", []):
                types[i - 1] = "full_attention"
            for i in linear["kda_layers"]:
                types[i - 1] = "linear_attention"
        elif types is None:  # transformers' default
            types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(layers)]
        mlp = hf.get("mlp_layer_types") or [
            "dense" if i < hf.get("first_k_dense_replace", 1) else "sparse" for i in range(layers)
        ]
        heads = hf["num_attention_heads"]
        if hf.get("num_key_value_heads", heads) not in (None, heads):
            raise ValueError(
                f"num_key_value_heads {hf['num_key_value_heads']} != num_attention_heads {heads}"
            )
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            moe_intermediate_size=hf["moe_intermediate_size"],
            num_hidden_layers=layers,
            num_attention_heads=heads,
            layer_types=tuple(types),
            mlp_layer_types=tuple(mlp),
            kv_lora_rank=hf["kv_lora_rank"],
            qk_nope_head_dim=hf["qk_nope_head_dim"],
            qk_rope_head_dim=hf["qk_rope_head_dim"],
            v_head_dim=hf["v_head_dim"],
            num_experts=pick("num_experts", "num_local_experts"),
            num_experts_per_tok=pick("num_experts_per_token", "num_experts_per_tok"),
            linear_num_heads=linear.get("num_heads", hf.get("linear_num_heads", 32)),
            linear_head_dim=linear.get("head_dim", hf.get("linear_head_dim", 128)),
            q_lora_rank=hf.get("q_lora_rank"),
            n_shared_experts=pick("num_shared_experts", "n_shared_experts", default=1),
            n_group=pick("num_expert_group", "n_group", default=1),
            topk_group=pick("topk_group", default=1),
            norm_topk_prob=pick("moe_renormalize", "norm_topk_prob", default=True),
            routed_scaling_factor=pick("routed_scaling_factor", default=2.446),
            linear_conv_kernel_dim=linear.get("short_conv_kernel_size", hf.get("linear_conv_kernel_dim", 4)),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
            max_position_embeddings=pick("model_max_length", "max_position_embeddings", default=1_048_576),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            attention_bias=hf.get("attention_bias", False),
            hidden_act=hf.get("hidden_act", "silu"),
            dtype=str(hf.get("dtype") or hf.get("torch_dtype") or "float32").removeprefix("torch."),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
            pad_token_id=hf.get("pad_token_id"),
        )

    def to_hf(self) -> dict:
        """A `kimi_linear` config.json dict in transformers' form (what `from_hf` reads back)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "activation_checkpointing"}
        d["layer_types"], d["mlp_layer_types"] = list(self.layer_types), list(self.mlp_layer_types)
        d["num_key_value_heads"] = self.num_attention_heads
        for ours, theirs in HF_NAMES.items():  # the names transformers writes (its attribute_map)
            d[theirs] = d.pop(ours)
        return {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", **d}

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | os.PathLike) -> KimiLinearConfig:
        """From `ckpt_dir`/config.json."""
        path = Path(ckpt_dir) / "config.json"
        if not path.is_file():
            raise ValueError(f"{ckpt_dir}: no config.json")
        return cls.from_hf(json.loads(path.read_text()))
