"""Image content parts of OpenAI requests: ``{"type": "image_url", "image_url": {"url": "data:image/...;
base64,..."}}`` (chat) and ``{"type": "input_image", "image_url": "data:..."}`` (responses), decoded into the
image parts the chat templates render (``rz_agents.images``: ``{"type": "image", "image": PIL image}``).

Only ``data:`` URIs: the server fetches nothing (a URL would let a client make it reach other hosts). The
decoded image must be within ``MAX_IMAGE_PIXELS``. Whether the served policy takes images is the server's
question (``OpenAIServer``), not the parser's. A bad part is a ValueError saying why (the request parser
makes it a 400 naming the part).
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

MAX_IMAGE_PIXELS = 4096 * 4096


def image_url_of(part: dict[str, Any]) -> str:
    """The URL of a chat ``image_url`` part (an object with ``url``, or the string itself)."""
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        raise ValueError("an image_url part needs 'image_url': {'url': 'data:...'}")
    return url


def decode_image(url: str):
    """The RGB PIL image of a ``data:image/...;base64,...`` URI (ValueError saying why not)."""
    from PIL import Image, UnidentifiedImageError

    head, comma, data = url.partition(",")
    if not url.startswith("data:") or not comma:
        raise ValueError("images must be data: URIs (data:image/png;base64,...); this server fetches no URL")
    if not head.endswith(";base64") or not head[5:].startswith("image/"):
        raise ValueError("an image data URI must be data:image/...;base64,...")
    try:
        image = Image.open(io.BytesIO(base64.b64decode(data, validate=True)))
        too_big = image.width * image.height > MAX_IMAGE_PIXELS
        size = f"{image.width}x{image.height}"
        if not too_big:
            return image.convert("RGB")
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise ValueError(f"the image data cannot be decoded: {e}") from None
    raise ValueError(f"the image is {size}: at most {MAX_IMAGE_PIXELS} pixels")


def image_part(url: str) -> dict[str, Any]:
    """The template's image part for a data URI."""
    return {"type": "image", "image": decode_image(url)}
