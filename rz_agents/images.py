"""Images in chat messages: the content-part shape envs use for screenshots and rendered pictures.

A message's ``content`` is either a string or a list of parts, in the OpenAI / Hugging Face
processor shape that vision-language chat templates read::

    {"role": "user", "content": [
        {"type": "image", "image": <PIL.Image.Image, RGB>},
        {"type": "text", "text": "Given the screenshot as below. What's the next step ...?"},
    ]}

An image part holds a decoded image (``PIL.Image.Image``, or an ``HxWx3`` ``uint8`` array, which
``as_pil`` converts), never a path or a URL: the env owns the pixels, the model's processor turns
them into patches. A trajectory keeps its images as PNG bytes (``to_png``; lossless, so a learner
re-encodes exactly the pixels the policy saw), one entry per image part, in the order the parts
appear in the episode's messages (``message_images``).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from typing import Any

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PART_TYPES = ("text", "image")


def is_image(x: Any) -> bool:
    """True for a ``PIL.Image.Image`` or an ``HxWx3`` ``uint8`` numpy array."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is a core dependency
        Image = None
    if Image is not None and isinstance(x, Image.Image):
        return True
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    return shape is not None and len(shape) == 3 and shape[2] == 3 and str(dtype) == "uint8"


def as_pil(image: Any):
    """``image`` as an RGB ``PIL.Image.Image`` (an ``HxWx3 uint8`` array is wrapped, other modes
    converted)."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image if image.mode == "RGB" else image.convert("RGB")
    if is_image(image):
        return Image.fromarray(image, mode="RGB")
    raise TypeError(f"an image must be a PIL image or an HxWx3 uint8 array, got {type(image).__name__}")


def image_part(image: Any) -> dict[str, Any]:
    """An image content part holding ``image`` (checked)."""
    if not is_image(image):
        raise TypeError(
            f"an image part needs a PIL image or an HxWx3 uint8 array, got {type(image).__name__}"
        )
    return {"type": "image", "image": image}


def text_part(text: str) -> dict[str, Any]:
    """A text content part."""
    return {"type": "text", "text": str(text)}


def check_content(content: Any, where: str = "content") -> None:
    """Raise ValueError naming the bad part unless ``content`` is a str or a list of text/image parts."""
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ValueError(f"{where} must be a str or a list of content parts, got {type(content).__name__}")
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in PART_TYPES:
            raise ValueError(f"{where}[{i}] must be a dict with type in {PART_TYPES}, got {part!r:.120}")
        if kind == "text" and not isinstance(part.get("text"), str):
            raise ValueError(f"{where}[{i}] is a text part without a str 'text'")
        if kind == "image" and not is_image(part.get("image")):
            got = type(part.get("image")).__name__
            raise ValueError(
                f"{where}[{i}] is an image part whose 'image' is {got}, not a PIL image or HxWx3 uint8 array"
            )


def content_text(content: str | Sequence[dict[str, Any]]) -> str:
    """The text of a message's content (its text parts joined); images are left out."""
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p.get("type") == "text")


def message_images(messages: Iterable[dict[str, Any]]) -> list[Any]:
    """Every image of ``messages``, in order of appearance (the order a trajectory stores them)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            out.extend(p["image"] for p in content if isinstance(p, dict) and p.get("type") == "image")
    return out


def has_images(messages: Iterable[dict[str, Any]]) -> bool:
    """True when any message holds an image part."""
    return bool(message_images(messages))


def to_png(image: Any, compress_level: int = 1) -> bytes:
    """Lossless PNG bytes of ``image`` (RGB). Level 1: fast, and the pixels are the same at any level."""
    buf = io.BytesIO()
    as_pil(image).save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue()


def from_png(data: bytes):
    """The RGB ``PIL.Image.Image`` of PNG bytes (ValueError when they are not a PNG)."""
    from PIL import Image

    if not isinstance(data, (bytes, bytearray)):
        raise ValueError(f"PNG data must be bytes, got {type(data).__name__}")
    if bytes(data[:8]) != PNG_SIGNATURE:
        raise ValueError(f"not PNG bytes (they start {bytes(data[:8])!r})")
    img = Image.open(io.BytesIO(data))
    img.load()
    return img.convert("RGB") if img.mode != "RGB" else img
