"""The Qwen chat template (``model/chat_template.py``) for a Qwen3-VL policy: messages may hold image parts.

An image part renders the way Qwen3-VL's official chat template and processor do together: the template
writes ``<|vision_start|><|image_pad|><|vision_end|>`` where the image sits among the message's text parts
(no separator), and the processor widens the one ``<|image_pad|>`` to one per merged patch of the
preprocessed image (t * h * w / merge^2 of its grid). Here the widened run is written directly, so the
prompt's tokens are the processor's ``input_ids`` and the engine and learner see one placeholder per image
embedding row. Images render in user and tool messages, as in the official template; an image in a system
or assistant message (which the official template drops) is refused by name rather than dropped.

Everything else is the base template's: a conversation without image parts renders exactly as the base
template renders it (text-only prompts are unchanged), and the append-only continuation property holds for
image turns too (an observation's images render inside its own turn). The template says it renders images
(``renders_images``), names the ids only it writes (``vision_token_ids``) and makes the engine's request of
a transcript's images (``image_prompt``) with ``png_image_inputs``, the function the learner re-encodes them
with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from rz_agents.images import as_pil
from rz_agents.model.chat_template import ChatTemplate, Message, TextEncoder

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
_IMAGE_ROLES = ("user", "tool")  # where the official template renders images


@dataclasses.dataclass(frozen=True)
class QwenVLChatTemplate(ChatTemplate):
    """A ``ChatTemplate`` whose user and tool messages may hold image parts (Qwen3-VL's image format).

    Args:
        vl_config: the policy's ``Qwen3VLConfig`` (its tower's patch and merge sizes decide how many
            ``<|image_pad|>`` an image takes; its token ids must be the tokenizer's).
    """

    vl_config: Any = dataclasses.field(default=None, hash=False)  # (a Qwen3VLConfig is not hashable)
    renders_images: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vl_config is None:
            raise ValueError("QwenVLChatTemplate needs vl_config, the model's Qwen3VLConfig")

    @classmethod
    def of(cls, base: ChatTemplate, vl_config) -> QwenVLChatTemplate:
        """``base`` (its default system prompt and thinking style) rendering images for ``vl_config``."""
        return cls(
            default_system_prompt=base.default_system_prompt, thinking=base.thinking, vl_config=vl_config
        )

    # ---- text ---------------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
    ) -> str:
        """``ChatTemplate.render`` with each image part written as its widened placeholder run."""
        return super().render(self.with_image_text(messages), tools, add_generation_prompt, enable_thinking)

    def render_continuation(self, new_messages: Sequence[Message], enable_thinking: bool = True) -> str:
        """``ChatTemplate.render_continuation`` with each image part written as its placeholder run."""
        return super().render_continuation(self.with_image_text(new_messages), enable_thinking)

    def image_text(self, image: Any) -> str:
        """``<|vision_start|>`` + one ``<|image_pad|>`` per merged patch of ``image`` + ``<|vision_end|>``."""
        from rz_agents.model.vl_processor import image_pad_count

        return VISION_START + IMAGE_PAD * image_pad_count(as_pil(image), self.vl_config.vision) + VISION_END

    def with_image_text(self, messages: Sequence[Message]) -> list[Message]:
        """``messages`` with every list content joined into one string (text parts as they are, image parts
        as their placeholder runs); string contents are left as they are."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
        out: list[Message] = []
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, Mapping) else None
            if content is None or isinstance(content, str):
                out.append(message)
                continue
            if isinstance(content, (bytes, Mapping)) or not isinstance(content, Sequence):
                raise TypeError(
                    f"message {i} ({message.get('role')}): content must be a str, None or a list of parts, "
                    f"got {type(content).__name__}"
                )
            out.append({**message, "content": self._join_parts(content, i, message.get("role"))})
        return out

    def _join_parts(self, parts: Sequence[Any], index: int, role: Any) -> str:
        text: list[str] = []
        for k, part in enumerate(parts):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "text" and isinstance(part.get("text"), str):
                text.append(part["text"])
            elif kind == "image":
                if role not in _IMAGE_ROLES:
                    raise ValueError(
                        f"message {index} ({role}) content[{k}] is an image: Qwen3-VL's template renders "
                        f"images only in {' and '.join(_IMAGE_ROLES)} messages"
                    )
                text.append(self.image_text(part.get("image")))
            else:
                raise ValueError(
                    f"message {index} ({role}) content[{k}] is not a text or image part: {part!r:.80}"
                )
        return "".join(text)

    # ---- tokens -------------------------------------------------------------------------------

    def encode_prompt(
        self,
        tokenizer: TextEncoder,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
    ) -> list[int]:
        """``ChatTemplate.encode_prompt``, after checking the tokenizer's vision ids are the model's."""
        self.check_tokenizer(tokenizer)
        return super().encode_prompt(tokenizer, messages, tools, add_generation_prompt, enable_thinking)

    def check_tokenizer(self, tokenizer: TextEncoder) -> None:
        """ValueError unless ``tokenizer`` encodes the vision tokens as the model's ids (a prompt would
        otherwise hold placeholders the model does not take for images)."""
        vl = self.vl_config
        wanted = {
            VISION_START: vl.vision_start_token_id,
            IMAGE_PAD: vl.image_token_id,
            VISION_END: vl.vision_end_token_id,
        }
        for token, model_id in wanted.items():
            got = tokenizer.token_to_id(token)
            if got != model_id:
                raise ValueError(
                    f"the tokenizer's {token} is id {got} but the model's is {model_id}: the tokenizer "
                    "does not belong to this Qwen3-VL model"
                )

    @property
    def vision_token_ids(self) -> tuple[int, ...]:
        """Ids only the template writes (a policy that samples one made a malformed turn)."""
        vl = self.vl_config
        ids = (vl.image_token_id, vl.vision_start_token_id, vl.vision_end_token_id, vl.video_token_id)
        return tuple(int(i) for i in ids)

    def image_prompt(self, pngs: Sequence[bytes]):
        """The engine's ``ImagePrompt`` of a transcript's images (PNG bytes, in order of appearance)."""
        from rz_agents.engine.images import ImagePrompt
        from rz_agents.model.vl_processor import png_image_inputs

        pixels, grids = png_image_inputs(pngs, self.vl_config.vision)
        return ImagePrompt(pixels, grids)
