"""Find the final answer of a completion: the content of its last ``\\boxed{...}``."""

from __future__ import annotations

import re

_BOX_OPENERS = ("\\boxed", "\\fbox")


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced.

    Nested braces are kept (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``); ``\\boxed 5`` (no
    braces) gives ``5``. Returns None when there is no complete box (e.g. unbalanced braces).
    """
    if not isinstance(text, str):
        return None
    best: tuple[int, str] | None = None
    for opener in _BOX_OPENERS:
        start = text.rfind(opener)
        while start != -1:
            content = _box_content(text, start + len(opener))
            if content is not None:
                if best is None or start > best[0]:
                    best = (start, content)
                break
            start = text.rfind(opener, 0, start)
    return None if best is None else best[1].strip()


def _box_content(text: str, i: int) -> str | None:
    """Content of the box whose name ends at ``i``; None when malformed."""
    if i < len(text) and text[i] == " ":
        # "\boxed 5": the answer runs to the next whitespace or "$"
        m = re.match(r" +([^\s$]+)", text[i:])
        return m.group(1) if m else None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        ch = text[j]
        if ch == "\\" and j + 1 < len(text) and text[j + 1] in "{}":
            continue  # an escaped brace \{ or \} does not nest
        if ch == "{" and (j == i or text[j - 1] != "\\"):
            depth += 1
        elif ch == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


_TEXT_WRAP = re.compile(r"\\(?:text|mathrm|textbf|mbox)\{([^{}]*)\}")


def normalize_answer(answer: str) -> str:
    """A light canonical form for cheap exact comparison (not a substitute for math-verify).

    Drops whitespace, ``$``, ``\\!``, ``\\,``, ``\\left``/``\\right``, a trailing period, thousands
    separators in plain numbers, and ``\\text{...}`` wrappers.
    """
    s = _TEXT_WRAP.sub(r"\1", answer)
    for junk in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "$"):
        s = s.replace(junk, "")
    s = re.sub(r"\s+", "", s).rstrip(".")
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    s = s.replace("dfrac", "frac").replace("tfrac", "frac")
    return s
