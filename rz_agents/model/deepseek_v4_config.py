"""DeepSeek-V4's configuration, read from a checkpoint's config.json (transformers' `deepseek_v4`, or the
legacy fields DeepSeek's own release ships: `compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`).

The parsed fields drive the model; the config.json dict itself is kept and written back unchanged on save
(`to_hf`), so a checkpoint round trip keeps every field, including the ones rz does not read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

ATTENTION_KINDS = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")
MLP_KINDS = ("hash_moe", "moe")
SCORING_FUNCS = ("sqrtsoftplus", "softmax", "sigmoid")
_RATIO_TO_KIND = {0: ATTENTION_KINDS[0], 4: ATTENTION_KINDS[1], 128: ATTENTION_KINDS[2]}


@dataclass
class DeepseekV4Config:
    vocab_size: int
    hidden_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    q_lora_rank: int
    num_experts_per_tok: int
    n_routed_experts: int
    layer_types: tuple[str, ...]
    mlp_layer_types: tuple[str, ...]
    csa_rate: int = 4
    hca_rate: int = 128
    qk_rope_head_dim: int = 64
    scoring_func: str = "sqrtsoftplus"
    routed_scaling_factor: float = 1.5
    rope_theta: float = 10000.0
    compress_rope: dict[str, Any] = field(default_factory=dict)  # the "compress" rope parameters
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    swiglu_limit: float = 10.0
    sliding_window: int = 128
    o_groups: int = 8
    o_lora_rank: int = 1024
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 1048576
    tie_word_embeddings: bool = False
    dtype: str = "float32"
    activation_checkpointing: bool = False  # the learner's switch (not a config.json field)
    hf: dict[str, Any] = field(default_factory=dict, repr=False)  # the config.json dict, written back as is

    def __post_init__(self) -> None:
        n = self.num_hidden_layers
        for name, kinds, allowed in (
            ("layer_types", self.layer_types, ATTENTION_KINDS),
            ("mlp_layer_types", self.mlp_layer_types, MLP_KINDS),
        ):
            if len(kinds) != n:
                raise ValueError(f"{name} has {len(kinds)} entries for {n} layers")
            bad = sorted(set(kinds) - set(allowed))
            if bad:
                raise ValueError(f"{name}: unknown kinds {bad}; expected {list(allowed)}")
        if self.scoring_func not in SCORING_FUNCS:
            raise ValueError(f"scoring_func {self.scoring_func!r}; expected one of {list(SCORING_FUNCS)}")
        if (self.num_attention_heads * self.head_dim) % self.o_groups:
            raise ValueError(f"o_groups {self.o_groups} must divide heads x head_dim")
        if self.qk_rope_head_dim % 2 or self.qk_rope_head_dim > min(self.head_dim, self.index_head_dim):
            raise ValueError(f"qk_rope_head_dim {self.qk_rope_head_dim} must be even and fit a head")
        kind = self.compress_rope.get("rope_type", "default")
        if kind not in ("default", "yarn"):
            raise ValueError(f"compress rope_type {kind!r}: only default and yarn are supported")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def num_experts(self) -> int:
        return self.n_routed_experts

    @property
    def compress_rope_theta(self) -> float:
        return float(self.compress_rope.get("rope_theta", 160000.0))

    @property
    def model_type(self) -> str:
        return "deepseek_v4"

    @property
    def eos_token_id(self) -> int | list[int] | None:
        """The checkpoint's end-of-sequence token(s) (config.json's; None when it names none)."""
        return self.hf.get("eos_token_id")

    def rate(self, layer: int) -> int:
        """The compression rate of `layer`'s compressed branch (0: a sliding-window-only layer)."""
        kind = self.layer_types[layer]
        return {ATTENTION_KINDS[0]: 0, ATTENTION_KINDS[1]: self.csa_rate, ATTENTION_KINDS[2]: self.hca_rate}[
            kind
        ]

    @classmethod
    def tiny(cls, **overrides: Any) -> DeepseekV4Config:
        """A small random-init config with every layer kind (sliding, CSA, HCA) and both MoE kinds, for tests
        and CPU runs; ``overrides`` replace fields (``vocab_size`` the tokenizer's)."""
        values = dict(
            vocab_size=256, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
            num_attention_heads=4, head_dim=32, q_lora_rank=32, num_experts_per_tok=2, n_routed_experts=8,
            layer_types=(ATTENTION_KINDS[0], ATTENTION_KINDS[1], ATTENTION_KINDS[2], ATTENTION_KINDS[1]),
            mlp_layer_types=("hash_moe", "moe", "moe", "moe"), csa_rate=4, hca_rate=16, qk_rope_head_dim=16,
            hc_mult=4, hc_sinkhorn_iters=6, sliding_window=16, o_groups=2, o_lora_rank=16, index_n_heads=4,
            index_head_dim=32, index_topk=8, max_position_embeddings=4096,
        )  # fmt: skip
        values.update(overrides)
        for name in ("layer_types", "mlp_layer_types"):
            values[name] = tuple(values[name])
        config = cls(**values)
        config.hf = config.hf_fields()
        return config

    def hf_fields(self) -> dict[str, Any]:
        """A config.json dict of this config's fields (transformers' DeepseekV4Config reads it)."""
        skip = {"csa_rate", "hca_rate", "compress_rope", "activation_checkpointing", "hf", "qk_rope_head_dim"}
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        d["layer_types"], d["mlp_layer_types"] = list(self.layer_types), list(self.mlp_layer_types)
        d["compress_rates"] = {ATTENTION_KINDS[1]: self.csa_rate, ATTENTION_KINDS[2]: self.hca_rate}
        d["partial_rotary_factor"] = self.qk_rope_head_dim / self.head_dim
        d["compress_rope_theta"] = self.compress_rope_theta
        scaling = {k: v for k, v in self.compress_rope.items() if k != "rope_theta"}
        if scaling.get("rope_type", "default") != "default":
            d["rope_parameters"] = scaling
        head = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}
        return {**head, "num_key_value_heads": 1, "n_shared_experts": 1, **d}

    @classmethod
    def from_hf(cls, hf: dict[str, Any], dtype: str | None = None) -> DeepseekV4Config:
        """From a config.json dict (model_type deepseek_v4)."""
        if hf.get("model_type") != "deepseek_v4":
            raise ValueError(f"model_type {hf.get('model_type')!r} is not a DeepSeek-V4 config")
        if hf.get("num_key_value_heads", 1) != 1:
            raise ValueError("DeepSeek-V4 shares one K=V head: num_key_value_heads must be 1")
        if hf.get("mlp_bias") or hf.get("hidden_act", "silu") != "silu":
            raise ValueError("DeepSeek-V4 here: mlp_bias false and hidden_act silu only")
        n = hf["num_hidden_layers"]
        head_dim = hf.get("head_dim", 512)
        rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
        rates.update(hf.get("compress_rates") or {})
        if hf.get("compress_rate_csa") is not None:
            rates["compressed_sparse_attention"] = hf["compress_rate_csa"]
        if hf.get("compress_rate_hca") is not None:
            rates["heavily_compressed_attention"] = hf["compress_rate_hca"]
        types = hf.get("layer_types")
        if types is None and hf.get("compress_ratios") is not None:
            types = [_RATIO_TO_KIND[r] for r in hf["compress_ratios"]]
        if types is None:  # transformers' default: two HCA layers, then CSA / HCA interleaved
            types = [ATTENTION_KINDS[2]] * min(n, 2) + [
                ATTENTION_KINDS[1] if i % 2 else ATTENTION_KINDS[2] for i in range(max(n - 2, 0))
            ]
        mlp = hf.get("mlp_layer_types")
        if mlp is None:
            n_hash = hf.get("num_hash_layers", 3)
            mlp = ["hash_moe"] * min(n, n_hash) + ["moe"] * max(0, n - n_hash)
        rope = hf.get("rope_parameters") or {}
        partial = hf.get("partial_rotary_factor")
        if partial is None:
            partial = (hf["qk_rope_head_dim"] / head_dim) if hf.get("qk_rope_head_dim") else 64 / 512
        compress = rope.get("compress") if isinstance(rope.get("compress"), dict) else None
        if compress is None:  # a flat rope_parameters dict: its scaling is the compressed branches'
            compress = {k: v for k, v in rope.items() if k not in ("main", "compress")}
            compress["rope_theta"] = hf.get("compress_rope_theta", 160000.0)
            compress.setdefault("rope_type", "default")
            if compress["rope_type"] == "yarn":
                compress.setdefault("attention_factor", 1.0)
        main = rope.get("main") if isinstance(rope.get("main"), dict) else {}
        if main.get("rope_type", "default") != "default":
            raise ValueError("DeepSeek-V4's main (sliding) rope must be the default rope")
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            moe_intermediate_size=hf["moe_intermediate_size"],
            num_hidden_layers=n,
            num_attention_heads=hf["num_attention_heads"],
            head_dim=head_dim,
            q_lora_rank=hf["q_lora_rank"],
            num_experts_per_tok=hf["num_experts_per_tok"],
            n_routed_experts=hf["n_routed_experts"],
            layer_types=tuple(types[:n]),
            mlp_layer_types=tuple(mlp[:n]),
            csa_rate=rates["compressed_sparse_attention"],
            hca_rate=rates["heavily_compressed_attention"],
            qk_rope_head_dim=int(head_dim * partial),
            scoring_func=hf.get("scoring_func", "sqrtsoftplus"),
            routed_scaling_factor=hf.get("routed_scaling_factor", 1.5),
            rope_theta=main.get("rope_theta", hf.get("rope_theta", 10000.0)),
            compress_rope=dict(compress),
            hc_mult=hf.get("hc_mult", 4),
            hc_sinkhorn_iters=hf.get("hc_sinkhorn_iters", 20),
            hc_eps=hf.get("hc_eps", 1e-6),
            swiglu_limit=hf.get("swiglu_limit", 10.0),
            sliding_window=hf.get("sliding_window", 128),
            o_groups=hf.get("o_groups", 8),
            o_lora_rank=hf.get("o_lora_rank", 1024),
            index_n_heads=hf.get("index_n_heads", 64),
            index_head_dim=hf.get("index_head_dim", 128),
            index_topk=hf.get("index_topk", 512),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            max_position_embeddings=hf.get("max_position_embeddings", 1048576),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            dtype=dtype or str(hf.get("dtype") or hf.get("torch_dtype") or "float32"),
            hf=dict(hf),
        )

    def to_hf(self) -> dict[str, Any]:
        """The config.json dict this config was read from (every field, unchanged; a config made here: its
        fields), with its dtype."""
        return {**(self.hf or self.hf_fields()), "dtype": self.dtype}

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | os.PathLike, dtype: str | None = None) -> DeepseekV4Config:
        """From `ckpt_dir`/config.json."""
        path = Path(ckpt_dir) / "config.json"
        if not path.is_file():
            raise ValueError(f"{ckpt_dir}: no config.json")
        return cls.from_hf(json.loads(path.read_text()), dtype=dtype)
