"""A request body as JSON the server can use, or an OpenAI-style 400 saying why not.

``json.loads`` alone lets through what later fails as a plain 500: nesting deep enough to exhaust the
recursion limit, integers longer than Python converts (``ValueError``), and lone UTF-16 surrogates
(``"\\ud800"``) that parse into a ``str`` no encoder accepts. Each is refused here, before any field is read.
"""

from __future__ import annotations

import json
from typing import Any

from rz_agents.serve.openai_schema import OpenAIError

MAX_DEPTH = 64  # far beyond any OpenAI request (messages -> content parts -> a tool schema's nesting)


def parse_json(raw: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``raw`` parsed; OpenAIError (400) for bad JSON, nesting deeper than ``max_depth``, an integer too
    long to convert, or a string (key or value) that is not valid Unicode."""
    if _nesting(raw) > max_depth:
        raise OpenAIError(f"the JSON body is nested deeper than {max_depth} levels", None)
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise OpenAIError(f"We could not parse the JSON body of your request: {e}") from None
    except (ValueError, RecursionError) as e:  # e.g. "Exceeds the limit (4300 digits)"
        raise OpenAIError(f"We could not parse the JSON body of your request: {e}") from None
    bad = _first_invalid_string(value)
    if bad is not None:
        raise OpenAIError(f"the JSON body has a string that is not valid Unicode (at {bad})", bad or None)
    return value


def _nesting(raw: bytes) -> int:
    """The deepest bracket nesting of ``raw``, ignoring brackets inside strings (one pass, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _first_invalid_string(value: Any) -> str | None:
    """The path of the first key or string that cannot be encoded as UTF-8 (a lone surrogate), else None."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if not _is_unicode(item):
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                if not _is_unicode(key):
                    return path or "body"
                stack.append((child, f"{path}.{key}" if path else key))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def read_json(request) -> Any:
    """The request's body as checked JSON (``parse_json``)."""
    return parse_json(await request.body())
