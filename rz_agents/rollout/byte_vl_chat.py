"""The byte ChatML template of ``byte_chat`` for a vision-language model (Qwen3-VL's image format).

An image part of a message renders as Qwen3-VL's ``<|vision_start|>`` + one ``<|image_pad|>`` per merged
patch of the image after preprocessing + ``<|vision_end|>``, in the order of the parts (text parts are their
UTF-8 bytes); the special ids are the model's (``Qwen3VLConfig``: image_token_id, vision_start_token_id,
vision_end_token_id). The template says it renders images (``renders_images = True``, what the agent loop
checks), and turns a trajectory's images (PNG bytes, in order) into the engine's request
(``image_prompt``) with ``png_image_inputs``, the function the learner re-encodes them with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rz_agents.images import as_pil
from rz_agents.rollout.byte_chat import IM_END, IM_START, ByteChatTemplate, ByteTokenizer


class ByteVLChatTemplate(ByteChatTemplate):
    """ChatML over byte tokens whose messages may hold image parts (rendered as Qwen3-VL image runs)."""

    renders_images = True

    def __init__(self, vl_config) -> None:
        self.vl_config = vl_config
        self.vision = vl_config.vision
        self.image_token_id = int(vl_config.image_token_id)
        self.vision_start_id = int(vl_config.vision_start_token_id)
        self.vision_end_id = int(vl_config.vision_end_token_id)

    @property
    def vision_token_ids(self) -> tuple[int, ...]:
        """Ids only the template writes (a policy that samples one made a malformed turn)."""
        ids = (self.image_token_id, self.vision_start_id, self.vision_end_id, self.vl_config.video_token_id)
        return tuple(int(i) for i in ids)

    def image_tokens(self, image: Any) -> list[int]:
        """``<|vision_start|>`` + one ``<|image_pad|>`` per merged patch of ``image`` + ``<|vision_end|>``."""
        from rz_agents.model.vl_processor import image_pad_count

        n = image_pad_count(as_pil(image), self.vision)
        return [self.vision_start_id, *[self.image_token_id] * n, self.vision_end_id]

    def _content(self, tokenizer: ByteTokenizer, content: str | Sequence[dict[str, Any]]) -> list[int]:
        if isinstance(content, str):
            return tokenizer.encode(content)
        ids: list[int] = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                ids += tokenizer.encode(part["text"])
            elif kind == "image":
                ids += self.image_tokens(part["image"])
            else:
                raise ValueError(f"content[{i}] is not a text or image part: {part!r:.80}")
        return ids

    def _message(self, tokenizer: ByteTokenizer, m: dict[str, Any]) -> list[int]:
        head = tokenizer.encode(f"{m['role']}\n")
        return [IM_START, *head, *self._content(tokenizer, m["content"]), IM_END, *tokenizer.encode("\n")]

    def image_prompt(self, pngs: Sequence[bytes]):
        """The engine's ``ImagePrompt`` of a transcript's images (PNG bytes, in order of appearance)."""
        from rz_agents.engine.images import ImagePrompt
        from rz_agents.model.vl_processor import png_image_inputs

        pixels, grids = png_image_inputs(pngs, self.vision)
        return ImagePrompt(pixels, grids)
