"""Model configuration: HF `config.json` field names, for Llama, Qwen2, Qwen3, Qwen3-MoE and DeepSeek-V3."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

ARCHS = ("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}
# RoPE scalings the model code implements (rz_agents/model/rope_scaling.py), per family.
_ROPE_TYPES = {"qwen2": ("default", "yarn"), "deepseek_v3": ("default", "yarn")}


@dataclass
class ModelConfig:
    """Architecture hyper-parameters. `model_type` selects the family:

    - llama: RMSNorm, GQA, RoPE, SwiGLU (e.g. SmolLM2)
    - qwen2: llama + biases on the q/k/v projections (Qwen2, Qwen2.5, DeepSeek-R1-Distill-Qwen)
    - qwen3: llama + RMSNorm on queries and keys per head (q_norm / k_norm)
    - qwen3_moe: qwen3 with sparse MoE MLPs (top-k routing over num_experts)
    - deepseek_v3: multi-head latent attention (low-rank q and kv projections, a decoupled RoPE part,
      YaRN) and DeepSeek MoE (shared experts, sigmoid routing with a correction bias, group-limited top-k,
      the first `first_k_dense_replace` layers dense); see model/mla.py and model/deepseek_moe.py.
      `head_dim` is derived: the head dim of the attention call and the KV cache (see `mla_head_dim`).
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
    # RoPE scaling (HF `rope_scaling` / `rope_parameters` minus rope_theta): None or
    # {"rope_type": "yarn", ...}
    rope_scaling: dict[str, Any] | None = None
    # deepseek_v3 only (HF names): MLA ...
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = True
    # ... and DeepSeek MoE (num_experts is HF's n_routed_experts)
    n_shared_experts: int = 0
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    first_k_dense_replace: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # Training memory, not architecture (never written to config.json): recompute each decoder layer's
    # activations (and each LM-head chunk's logits) in the backward instead of keeping them, so a
    # long sequence trains in memory linear in its length. No effect on forward values.
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.rope_scaling is not None:  # HF's rope_parameters spelling carries rope_theta: kept apart here
            self.rope_scaling = {
                k: v for k, v in self.rope_scaling.items() if k not in ("rope_theta", "type")
            }
        if self.model_type == "deepseek_v3":
            # MLA expands K/V to one head per query head, stored at the padded attention head dim.
            self.num_key_value_heads = self.num_attention_heads
            self.head_dim = mla_head_dim(self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim)
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
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", "default")
            if kind not in _ROPE_TYPES.get(self.model_type, ("default",)):
                raise ValueError(f"rope scaling {self.rope_scaling} is not supported for {self.model_type}")
        if self.model_type == "deepseek_v3":
            self._validate_deepseek()

    def _validate_deepseek(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"deepseek_v3 needs {name} > 0, got {getattr(self, name)}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (rotary embedding), got {self.qk_rope_head_dim}")
        if self.q_lora_rank is not None and self.q_lora_rank <= 0:
            raise ValueError(f"q_lora_rank must be positive or null, got {self.q_lora_rank}")
        if any(self.is_moe_layer(i) for i in range(self.num_hidden_layers)):
            if not (0 < self.num_experts_per_tok <= self.num_experts):
                raise ValueError("deepseek_v3 needs 0 < num_experts_per_tok <= n_routed_experts")
            if self.n_group < 1 or self.num_experts % self.n_group:
                raise ValueError(
                    f"n_routed_experts {self.num_experts} must be a multiple of n_group {self.n_group}"
                )
            if not (0 < self.topk_group <= self.n_group):
                raise ValueError(f"deepseek_v3 needs 0 < topk_group <= n_group, got {self.topk_group}")
            if self.num_experts // self.n_group < 2:
                raise ValueError(
                    "deepseek_v3 group scores sum the top 2 experts: each group needs >= 2 experts"
                )
            if self.num_experts_per_tok > self.topk_group * (self.num_experts // self.n_group):
                raise ValueError("num_experts_per_tok exceeds the experts of the topk_group selected groups")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def qk_norm(self) -> bool:
        return self.model_type in ("qwen3", "qwen3_moe")

    @property
    def qkv_bias(self) -> bool:
        """Whether q/k/v carry a bias (always in Qwen2; HF's `attention_bias` elsewhere)."""
        return self.attention_bias or self.model_type == "qwen2"

    @property
    def rope_dim(self) -> int:
        """The rotated dims of a head (MLA rotates only its decoupled part)."""
        return self.qk_rope_head_dim if self.model_type == "deepseek_v3" else self.head_dim

    def is_moe_layer(self, layer: int) -> bool:
        if self.model_type == "deepseek_v3":
            return self.num_experts > 0 and layer >= self.first_k_dense_replace
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
        if model_type == "deepseek_v3":
            base.update(
                num_hidden_layers=3,
                q_lora_rank=32,
                kv_lora_rank=32,
                qk_nope_head_dim=16,
                qk_rope_head_dim=8,
                v_head_dim=16,
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                n_shared_experts=1,
                n_group=2,
                topk_group=1,
                routed_scaling_factor=2.5,
                first_k_dense_replace=1,
            )
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
        rope_type = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
        if rope_type not in _ROPE_TYPES.get(model_type, ("default",)):
            raise ValueError(f"rope scaling {rope or scaling} is not supported for {model_type}")
        rope_scaling = None
        if rope_type != "default":
            rope_scaling = {k: v for k, v in {**scaling, **rope}.items() if k not in ("rope_theta", "type")}
            rope_scaling["rope_type"] = rope_type
        if model_type == "qwen2" and d.get("use_sliding_window"):
            raise ValueError(
                "qwen2 config.json sets use_sliding_window: sliding-window attention is not supported "
                "(every layer attends to its whole context here); set use_sliding_window to false"
            )
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
            rope_scaling=rope_scaling,
        )
        if model_type == "qwen2":
            kwargs["attention_bias"] = False  # Qwen2's q/k/v biases are implied (ModelConfig.qkv_bias)
        if model_type == "deepseek_v3":
            kwargs.update(_deepseek_from_hf(d))
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
        d = self._to_hf_common()
        if self.rope_scaling is not None:
            d["rope_scaling"] = dict(self.rope_scaling)
            d["rope_parameters"] = {**self.rope_scaling, "rope_theta": self.rope_theta}
        if self.model_type == "qwen2":
            d.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_hidden_layers)
            d.pop("attention_bias")
        if self.model_type == "deepseek_v3":
            d.update(_deepseek_to_hf(self))
        return d

    def _to_hf_common(self) -> dict[str, Any]:
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


def mla_head_dim(qk_head_dim: int, v_head_dim: int) -> int:
    """The head dim MLA's attention runs at and its K/V cache stores: the larger of the q/k head dim
    (qk_nope + qk_rope) and the value head dim, rounded up to a power of two (at least 16), the head dims
    the Triton attention kernels take. q and k are padded with zeros (their dot products are unchanged:
    each added term is 0 * 0) and so is v (its extra output columns are exact zeros, dropped)."""
    need = max(qk_head_dim, v_head_dim, 16)
    return 1 << (need - 1).bit_length()


_DEEPSEEK_FIELDS = (
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "n_shared_experts",
    "routed_scaling_factor",
    "n_group",
    "topk_group",
    "first_k_dense_replace",
    "rope_interleave",
)


def _deepseek_from_hf(d: dict[str, Any]) -> dict[str, Any]:
    out = {name: d[name] for name in _DEEPSEEK_FIELDS if name in d and d[name] is not None}
    out["q_lora_rank"] = d.get("q_lora_rank")  # null: a full-rank q_proj (DeepSeek-V2-Lite style)
    out.update(
        num_experts=d.get("n_routed_experts") or 0,
        num_experts_per_tok=d.get("num_experts_per_tok") or 0,
        moe_intermediate_size=d.get("moe_intermediate_size") or 0,
        norm_topk_prob=d.get("norm_topk_prob", True),
        head_dim=0,  # derived (mla_head_dim)
    )
    if (d.get("topk_method") or "noaux_tc") != "noaux_tc":
        raise ValueError(f"deepseek_v3 topk_method {d['topk_method']!r} not supported (only noaux_tc)")
    if (d.get("scoring_func") or "sigmoid") != "sigmoid":
        raise ValueError(f"deepseek_v3 scoring_func {d['scoring_func']!r} not supported (only sigmoid)")
    return out


def _deepseek_to_hf(c: ModelConfig) -> dict[str, Any]:
    d: dict[str, Any] = {name: getattr(c, name) for name in _DEEPSEEK_FIELDS}
    d.update(
        n_routed_experts=c.num_experts,
        num_local_experts=c.num_experts,
        num_experts_per_tok=c.num_experts_per_tok,
        moe_intermediate_size=c.moe_intermediate_size,
        norm_topk_prob=c.norm_topk_prob,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        head_dim=c.qk_rope_head_dim,  # what transformers sets (the rotary dim)
        num_key_value_heads=c.num_attention_heads,
        num_mtp_layers=0,
        output_router_logits=False,
    )
    return d
