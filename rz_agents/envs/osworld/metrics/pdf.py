"""PDF metrics: page counts and text similarity (pypdf reads the files)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from rz_agents.envs.osworld.metrics.general import fuzz_ratio


def _reader(path: str) -> Any:
    from pypdf import PdfReader

    return PdfReader(path)


def pdf_text(path: str) -> str:
    """The text of every page, concatenated and stripped."""
    return "".join(page.extract_text() or "" for page in _reader(path).pages).strip()


def check_pdf_pages(pdf_file: str | None, rules: dict[str, Any], **_: Any) -> float:
    """1 when the page count satisfies ``rules["relation"]`` (``eq``, ``lt``, ...) against ``ref_value``."""
    if not pdf_file:
        return 0.0
    try:
        pages = len(_reader(pdf_file).pages)
    except Exception:
        return 0.0  # not a PDF
    return float(getattr(operator, rules["relation"])(pages, rules["ref_value"]))


def compare_pdfs(pdf1: str | list[str] | None, pdf2: str | list[str] | None, **_: Any) -> float:
    """Mean text similarity (in [0, 1]) of the PDFs, pairwise; a pair that cannot be read scores 0."""
    firsts = pdf1 if isinstance(pdf1, list) else [pdf1]
    seconds = pdf2 if isinstance(pdf2, list) else [pdf2]
    total = 0.0
    for a, b in zip(firsts, seconds, strict=False):
        try:
            total += fuzz_ratio(pdf_text(a), pdf_text(b)) / 100.0
        except Exception:
            continue
    return total / len(seconds) if seconds else 0.0


METRICS: dict[str, Callable[..., float]] = {"check_pdf_pages": check_pdf_pages, "compare_pdfs": compare_pdfs}
