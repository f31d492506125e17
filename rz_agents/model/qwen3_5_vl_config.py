"""A Qwen3.5 vision-language checkpoint's configuration (config.json model_type ``qwen3_5`` / ``qwen3_5_moe``
with a ``vision_config``): the hybrid text decoder (`Qwen35Config`), the vision tower and the multimodal RoPE.

The tower is Qwen3-VL's (`VisionConfig`, model/vision.py) without deepstack; the text decoder rotates only the
first ``rotary_dim`` dimensions of a head, and its interleaved M-RoPE split (``mrope_section``) divides those
``rotary_dim / 2`` frequencies between the temporal, height and width axes (transformers' default [11, 11, 10]
of Qwen3.5's 64-dimensional rotary part).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rz_agents.model.qwen3_5_config import Qwen35Config
from rz_agents.model.qwen3_vl_config import VisionConfig

_TOKEN_FIELDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
VL_MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")  # config.json model_types that may hold a vision tower


@dataclass
class Qwen35VLConfig:
    """A Qwen3.5 vision-language model: ``text`` (the hybrid decoder), ``vision`` (a tower without
    deepstack), the M-RoPE split of the rotary frequencies and the image placeholders' token ids."""

    text: Qwen35Config
    vision: VisionConfig
    mrope_section: list[int] = field(default_factory=lambda: [11, 11, 10])
    image_token_id: int = 248056
    video_token_id: int = 248057
    vision_start_token_id: int = 248053
    vision_end_token_id: int = 248054

    def __post_init__(self) -> None:
        half = self.text.rotary_dim // 2
        if len(self.mrope_section) != 3 or sum(self.mrope_section) != half:
            raise ValueError(
                f"mrope_section {self.mrope_section} must be 3 numbers summing to rotary_dim // 2 = {half}"
            )
        if self.vision.out_hidden_size != self.text.hidden_size:
            raise ValueError(
                f"vision_config.out_hidden_size {self.vision.out_hidden_size} must equal the text "
                f"hidden_size {self.text.hidden_size}"
            )
        if self.vision.deepstack_visual_indexes:
            raise ValueError(
                "Qwen3.5's vision tower has no deepstack (deepstack_visual_indexes must be empty)"
            )

    @property
    def model_type(self) -> str:
        return "qwen3_5_moe" if self.text.num_experts else "qwen3_5"

    def vision_token_names(self) -> dict[int, str]:
        """The token string of each vision placeholder id (as Qwen3VLConfig.vision_token_names)."""
        return {
            self.vision_start_token_id: "<|vision_start|>",
            self.vision_end_token_id: "<|vision_end|>",
            self.image_token_id: "<|image_pad|>",
            self.video_token_id: "<|video_pad|>",
        }

    @classmethod
    def tiny(cls, vision: dict[str, Any] | None = None, moe: bool = False, **text: Any) -> Qwen35VLConfig:
        """A small random-init config (tests, CPU demos): ``Qwen35Config.tiny`` with a 2-block tower
        (``vision``: its `VisionConfig` fields) and placeholder ids 300..303 (a Qwen-sized vocabulary:
        Qwen3.5's own ids)."""
        t = Qwen35Config.tiny(moe=moe, **text)
        fields = {"depth": 2, "out_hidden_size": t.hidden_size, **(vision or {})}
        try:
            tower = VisionConfig(**fields)
        except TypeError as e:
            raise ValueError(f"model.tiny_overrides.vision: {e}") from None
        half = t.rotary_dim // 2
        h = w = (half * 11 // 32) or 1  # Qwen3.5's proportions [11, 11, 10] of 32, rounded
        ids = (
            {}
            if t.vocab_size > cls.video_token_id
            else dict(zip(_TOKEN_FIELDS, (300, 301, 302, 303), strict=True))
        )
        return cls(t, tower, [half - h - w, h, w], **ids)

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> Qwen35VLConfig:
        """From a config.json dict of model_type qwen3_5 / qwen3_5_moe with a vision_config."""
        if d.get("model_type") not in VL_MODEL_TYPES or "vision_config" not in d:
            raise ValueError(
                f"expected a qwen3_5 vision-language config.json (model_type {VL_MODEL_TYPES} with a "
                f"vision_config), got model_type {d.get('model_type')!r}"
            )
        t = dict(d.get("text_config") or {})
        t["tie_word_embeddings"] = d.get("tie_word_embeddings", t.get("tie_word_embeddings", False))
        t.setdefault("dtype", d.get("dtype") or d.get("torch_dtype"))
        rope = t.get("rope_parameters") or {}
        if rope.get("mrope_interleaved") is False:
            raise ValueError("mrope_interleaved: false is not supported (Qwen3.5 interleaves its M-RoPE)")
        vision = dict(d["vision_config"] or {})
        vision.pop("deepstack_visual_indexes", None)
        return cls(
            Qwen35Config.from_hf(t),
            VisionConfig.from_hf(vision),
            list(rope.get("mrope_section") or [11, 11, 10]),
            **{k: d[k] for k in _TOKEN_FIELDS if k in d},
        )

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict transformers loads into Qwen3_5(Moe)ForConditionalGeneration."""
        text = self.text.to_hf()
        for k in ("architectures", "dtype", "tie_word_embeddings"):
            text.pop(k, None)
        text["rope_parameters"].update(mrope_section=list(self.mrope_section), mrope_interleaved=True)
        vision = self.vision.to_hf()
        vision.pop("deepstack_visual_indexes")
        vision["model_type"] = f"{self.model_type}_vision"
        arch = f"Qwen3_5{'Moe' if self.text.num_experts else ''}ForConditionalGeneration"
        return {
            "architectures": [arch],
            "model_type": self.model_type,
            "dtype": self.text.dtype,
            "tie_word_embeddings": self.text.tie_word_embeddings,
            "text_config": text,
            "vision_config": vision,
            **{k: getattr(self, k) for k in _TOKEN_FIELDS},
        }

    def replace_text(self, **changes: Any) -> Qwen35VLConfig:
        """This config with text fields changed (e.g. the dtype)."""
        return dataclasses.replace(self, text=dataclasses.replace(self.text, **changes))
