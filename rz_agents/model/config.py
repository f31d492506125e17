"""Model configuration: HF `config.json` field names, for Llama, Qwen3 and Qwen3-MoE."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

ARCHS = ("llama", "qwen3", "qwen3_moe")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


@dataclass
class ModelConfig:
    """Architecture hyper-parameters. `model_type` selects the family:

    - llama: RMSNorm, GQA, RoPE, SwiGLU (e.g. SmolLM2)
    - qwen3: llama + RMSNorm on queries and keys per head (q_norm / k_norm)
    - qwen3_moe: qwen3 with sparse MoE MLPs (top-k routing over num_experts)
    """

    model_type: str = "qwen3"
    vocab_size: int = 151936
    hidden_size: int = 512
    intermediate_size: int = 1536
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 64
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    dtype: str = "float32"
    # MoE (qwen3_moe only)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # Training memory, not architecture (never written to config.json): recompute each decoder layer's
    # activations (and each LM-head chunk's logits) in the backward instead of keeping them, so a
    # long sequence trains in memory linear in its length. No effect on forward values.
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.model_type not in ARCHS:
            raise ValueError(f"model_type {self.model_type!r} not supported; expected one of {ARCHS}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} not supported; expected one of {sorted(DTYPES)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (rotary embedding)")
        if self.model_type == "qwen3_moe" and not (0 < self.num_experts_per_tok <= self.num_experts):
            raise ValueError("qwen3_moe needs 0 < num_experts_per_tok <= num_experts")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def qk_norm(self) -> bool:
        return self.model_type in ("qwen3", "qwen3_moe")

    def is_moe_layer(self, layer: int) -> bool:
        return (
            self.model_type == "qwen3_moe"
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def tiny(cls, model_type: str = "qwen3", **overrides: Any) -> ModelConfig:
        """A small random-init config for tests and benchmarks."""
        base: dict[str, Any] = dict(
            model_type=model_type,
            vocab_size=320,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rope_theta=10_000.0,
            max_position_embeddings=1024,
        )
        if model_type == "qwen3_moe":
            base.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
        base.update(overrides)
        return cls(**base)

    # --- HF config.json --------------------------------------------------------------------
    @classmethod
    def from_hf(cls, d: dict[str, Any], dtype: str | None = None) -> ModelConfig:
        """Build from an HF config.json dict (transformers 4.x and 5.x spellings)."""
        model_type = d.get("model_type")
        if model_type not in ARCHS:
            raise ValueError(f"unsupported model_type {model_type!r} in config.json; supported: {ARCHS}")
        rope = d.get("rope_parameters") or {}
        scaling = d.get("rope_scaling") or {}
        if (rope.get("rope_type") or scaling.get("rope_type") or "default") != "default":
            raise ValueError(f"rope scaling {rope or scaling} is not supported")
        theta = d.get("rope_theta", rope.get("rope_theta", 10_000.0))
        heads = d["num_attention_heads"]
        hf_dtype = d.get("dtype") or d.get("torch_dtype") or "float32"
        kwargs: dict[str, Any] = dict(
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d.get("intermediate_size", 0),
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads", heads),
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            attention_bias=d.get("attention_bias", False),
            dtype=dtype or (hf_dtype if hf_dtype in DTYPES else "float32"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
        )
        if model_type == "qwen3_moe":
            kwargs.update(
                num_experts=d.get("num_experts", d.get("num_local_experts", 0)),
                num_experts_per_tok=d["num_experts_per_tok"],
                moe_intermediate_size=d["moe_intermediate_size"],
                norm_topk_prob=d.get("norm_topk_prob", True),
                decoder_sparse_step=d.get("decoder_sparse_step", 1),
                mlp_only_layers=list(d.get("mlp_only_layers") or []),
            )
        return cls(**kwargs)

    def to_hf(self) -> dict[str, Any]:
        """An HF config.json dict that transformers loads into the matching *ForCausalLM class."""
        d: dict[str, Any] = {
            "architectures": [_HF_ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "dtype": self.dtype,
            "torch_dtype": self.dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
        }
        if self.model_type == "llama":
            d["mlp_bias"] = False
        if self.model_type == "qwen3_moe":
            d.update(
                num_experts=self.num_experts,
                num_local_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=self.decoder_sparse_step,
                mlp_only_layers=list(self.mlp_only_layers),
                output_router_logits=False,
            )
        return d

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)
