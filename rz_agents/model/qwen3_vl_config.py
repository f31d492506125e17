"""Qwen3-VL configuration: the vision tower's fields and the whole model's (HF config.json, qwen3_vl).

The language model is a Qwen3 dense decoder (q/k norms, no biases), so its part is a `ModelConfig` of
model_type "qwen3" (`text`), which the shared decoder layers read; what Qwen3-VL adds lives here: the vision
tower (`VisionConfig`), the multimodal RoPE split of the rotary frequencies (`mrope_section`: how many go to
the temporal, height and width axes) and the special token ids of the chat template's image placeholders.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rz_agents.model.config import ModelConfig

# How the vision MLP's activation names map to rz_kernels.activation.gelu's `approximate`
_VISION_ACTS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}

# OpenAI CLIP's pixel statistics: transformers' Qwen2-VL image processor defaults
_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


@dataclass
class ImageProcessing:
    """How images become pixel_values: HF's preprocessor_config.json of a Qwen-VL checkpoint.

    Each image is resized (aspect kept) so its area lies in [min_pixels, max_pixels] (HF's size.shortest_edge
    and size.longest_edge, which for these processors are areas), then normalised with image_mean/std. The
    defaults are transformers' Qwen2-VL processor defaults, which rz's tiny random-init models have always
    used (a checkpoint without preprocessor_config.json reads them). Released Qwen3-VL checkpoints use
    65,536..16,777,216 pixels and mean = std = 0.5: their preprocessor_config.json says so, and rz reads
    it."""

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: list[float] = field(default_factory=lambda: list(_CLIP_MEAN))
    image_std: list[float] = field(default_factory=lambda: list(_CLIP_STD))

    def __post_init__(self) -> None:
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(
                "image processing: need 0 < min_pixels <= max_pixels, got "
                f"{self.min_pixels}, {self.max_pixels}"
            )
        for name in ("image_mean", "image_std"):
            value = list(getattr(self, name))
            if len(value) != 3:
                raise ValueError(f"image processing: {name} needs 3 values (RGB), got {value!r}")
            setattr(self, name, [float(v) for v in value])
        if min(self.image_std) <= 0:
            raise ValueError(f"image processing: image_std must be positive, got {self.image_std}")

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> ImageProcessing:
        """From a preprocessor_config.json dict: size.shortest/longest_edge (or the older min/max_pixels)."""
        size = d.get("size") or {}
        default = cls()
        return cls(
            min_pixels=int(size.get("shortest_edge", d.get("min_pixels", default.min_pixels))),
            max_pixels=int(size.get("longest_edge", d.get("max_pixels", default.max_pixels))),
            image_mean=list(d.get("image_mean", default.image_mean)),
            image_std=list(d.get("image_std", default.image_std)),
        )

    def to_hf(self, vision: VisionConfig) -> dict[str, Any]:
        """A preprocessor_config.json dict that transformers' Qwen-VL image processors load."""
        return {
            "image_processor_type": "Qwen2VLImageProcessorFast",
            "processor_class": "Qwen3VLProcessor",
            "size": {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
            "patch_size": vision.patch_size,
            "temporal_patch_size": vision.temporal_patch_size,
            "merge_size": vision.spatial_merge_size,
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "do_resize": True,
            "do_convert_rgb": True,
        }


@dataclass
class VisionConfig:
    """HF's Qwen3VLVisionConfig fields (same names), and the checkpoint's `image_processing` (kept in HF's
    preprocessor_config.json, not in config.json)."""

    depth: int = 2
    hidden_size: int = 32
    intermediate_size: int = 64
    num_heads: int = 2
    in_channels: int = 3
    patch_size: int = 8
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_hidden_size: int = 64
    num_position_embeddings: int = 16
    deepstack_visual_indexes: list[int] = field(default_factory=list)
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10_000.0
    image_processing: ImageProcessing = field(default_factory=ImageProcessing)

    def __post_init__(self) -> None:
        if isinstance(self.image_processing, dict):  # from a YAML override or dataclasses.asdict
            self.image_processing = ImageProcessing(**self.image_processing)
        if self.hidden_act not in _VISION_ACTS:
            raise ValueError(
                f"vision_config.hidden_act {self.hidden_act!r} not supported; {list(_VISION_ACTS)}"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"vision_config.hidden_size {self.hidden_size} is not a multiple of "
                f"num_heads {self.num_heads}"
            )
        if self.head_dim % 4:
            raise ValueError(f"vision head dim {self.head_dim} must be a multiple of 4 (2D rotary embedding)")
        side = int(round(self.num_position_embeddings**0.5))
        if side * side != self.num_position_embeddings:
            raise ValueError(
                f"vision_config.num_position_embeddings {self.num_position_embeddings} is not a square"
            )
        bad = [i for i in self.deepstack_visual_indexes if not 0 <= i < self.depth]
        if bad:
            raise ValueError(f"vision_config.deepstack_visual_indexes {bad} outside the depth {self.depth}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def gelu_approximate(self) -> str:
        return _VISION_ACTS[self.hidden_act]

    @property
    def patch_dim(self) -> int:
        """Values per patch in the processor's pixel_values rows: channels x temporal x patch x patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> VisionConfig:
        names = {f.name for f in dataclasses.fields(cls)} - {"rope_theta", "image_processing"}
        kwargs = {k: d[k] for k in names if k in d}
        kwargs["deepstack_visual_indexes"] = list(d.get("deepstack_visual_indexes") or [])
        rope = d.get("rope_parameters") or {}
        if rope.get("rope_type", "axial") != "axial":
            raise ValueError(f"vision rope_type {rope['rope_type']!r} not supported (only axial)")
        kwargs["rope_theta"] = float(rope.get("rope_theta", d.get("rope_theta", 10_000.0)))
        return cls(**kwargs)

    def to_hf(self) -> dict[str, Any]:
        d = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("rope_theta", "image_processing")
        }
        d["deepstack_visual_indexes"] = list(self.deepstack_visual_indexes)
        d.update(
            model_type="qwen3_vl_vision",
            rope_parameters={"rope_type": "axial", "rope_theta": self.rope_theta},
        )
        return d


@dataclass
class Qwen3VLConfig:
    """A Qwen3-VL model: `text` (a qwen3 ModelConfig), `vision`, the M-RoPE split and the placeholder ids."""

    text: ModelConfig
    vision: VisionConfig
    mrope_section: list[int] = field(default_factory=lambda: [2, 3, 3])
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653

    def __post_init__(self) -> None:
        if self.text.model_type != "qwen3":
            raise ValueError(
                f"Qwen3-VL's language model is qwen3, got text.model_type {self.text.model_type!r}"
            )
        if len(self.mrope_section) != 3 or sum(self.mrope_section) != self.text.head_dim // 2:
            raise ValueError(
                f"mrope_section {self.mrope_section} must be 3 numbers summing to head_dim // 2 = "
                f"{self.text.head_dim // 2}"
            )
        if self.vision.out_hidden_size != self.text.hidden_size:
            raise ValueError(
                f"vision_config.out_hidden_size {self.vision.out_hidden_size} must equal the text "
                "hidden_size "
                f"{self.text.hidden_size}"
            )
        if len(self.vision.deepstack_visual_indexes) > self.text.num_hidden_layers:
            raise ValueError("more deepstack_visual_indexes than text layers to feed")

    @property
    def model_type(self) -> str:
        return "qwen3_vl"

    def vision_token_names(self) -> dict[int, str]:
        """Qwen3-VL's token string for each of this model's vision placeholder ids (what a display shows
        for them when the run's tokenizer has no text for them: the byte tokenizer ends at id 258)."""
        return {
            self.vision_start_token_id: "<|vision_start|>",
            self.vision_end_token_id: "<|vision_end|>",
            self.image_token_id: "<|image_pad|>",
            self.video_token_id: "<|video_pad|>",
        }

    @classmethod
    def tiny(cls, **text_overrides: Any) -> Qwen3VLConfig:
        """A small random-init config for tests: 2 text layers, a 3-block tower feeding 2 deepstack layers."""
        text = ModelConfig.tiny("qwen3", **text_overrides)
        vision = VisionConfig(depth=3, out_hidden_size=text.hidden_size, deepstack_visual_indexes=[0, 1])
        half = text.head_dim // 2
        h = w = (half * 3 // 8) or 1  # Qwen's proportions [24, 20, 20] of 64, rounded
        return cls(text, vision, [half - h - w, h, w], image_token_id=300, video_token_id=301,
                   vision_start_token_id=302, vision_end_token_id=303)  # fmt: skip

    @classmethod
    def from_hf(cls, d: dict[str, Any], dtype: str | None = None) -> Qwen3VLConfig:
        """Build from an HF config.json dict of model_type qwen3_vl."""
        if d.get("model_type") != "qwen3_vl":
            raise ValueError(f"expected model_type 'qwen3_vl' in config.json, got {d.get('model_type')!r}")
        t = dict(d.get("text_config") or {})
        rope = dict(t.get("rope_parameters") or t.get("rope_scaling") or {})
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"Qwen3-VL text rope_type {rope['rope_type']!r} not supported (only default)")
        section = list(rope.get("mrope_section") or [24, 20, 20])
        # transformers 5 keeps rope_theta in rope_parameters, 4.x beside rope_scaling
        theta = float(rope.get("rope_theta", t.get("rope_theta", 5_000_000.0)))
        t.update(
            model_type="qwen3",
            rope_parameters={"rope_type": "default", "rope_theta": theta},
            rope_scaling=None,
            rope_theta=theta,
            tie_word_embeddings=d.get("tie_word_embeddings", t.get("tie_word_embeddings", False)),
        )
        t.setdefault("dtype", d.get("dtype") or d.get("torch_dtype"))
        return cls(
            ModelConfig.from_hf(t, dtype=dtype),
            VisionConfig.from_hf(d.get("vision_config") or {}),
            section,
            **{k: d[k] for k in _TOKEN_FIELDS if k in d},
        )

    def to_hf(self) -> dict[str, Any]:
        """An HF config.json dict that transformers loads into Qwen3VLForConditionalGeneration."""
        text = self.text.to_hf()
        for k in ("architectures", "dtype", "torch_dtype", "tie_word_embeddings", "rope_theta"):
            text.pop(k, None)
        text.update(
            model_type="qwen3_vl_text",
            rope_parameters={
                "rope_type": "default",
                "rope_theta": self.text.rope_theta,
                "mrope_section": list(self.mrope_section),
                "mrope_interleaved": True,
            },
        )
        return {
            "architectures": ["Qwen3VLForConditionalGeneration"],
            "model_type": "qwen3_vl",
            "dtype": self.text.dtype,
            "tie_word_embeddings": self.text.tie_word_embeddings,
            "text_config": text,
            "vision_config": self.vision.to_hf(),
            **{k: getattr(self, k) for k in _TOKEN_FIELDS},
        }


_TOKEN_FIELDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
