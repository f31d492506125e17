"""PDF metrics: page counts (pypdf), text similarity and page images (PyMuPDF, as OSWorld)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from rz_agents.envs.osworld.metrics.general import fuzz_ratio
from rz_agents.envs.osworld.metrics.libraries import missing, require

_PYMUPDF = missing(("pymupdf", "pymupdf"))


def _reader(path: str) -> Any:
    from pypdf import PdfReader

    return PdfReader(path)


def pdf_text(path: str) -> str:
    """OSWorld's ``extract_text_from_pdf``: PyMuPDF's text of every page, concatenated, stripped."""
    require(_PYMUPDF, "compare_pdfs")
    import pymupdf

    with pymupdf.open(path) as doc:
        return "".join(page.get_text() for page in doc).strip()


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
    """Mean text similarity (in [0, 1]) of the PDFs, pairwise; a pair that cannot be read adds 0.

    As OSWorld: both sides become lists only when the second is not one (a single first path
    against a list is zipped character by character there too), and the sum is divided by the
    number of second paths."""
    require(_PYMUPDF, "compare_pdfs")
    if not isinstance(pdf2, list):
        pdf1, pdf2 = [pdf1], [pdf2]
    total = 0.0
    for a, b in zip(pdf1, pdf2, strict=False):  # a None first path against a list raises, as there
        try:
            total += fuzz_ratio(pdf_text(a), pdf_text(b)) / 100.0
        except Exception:
            continue
    return total / len(pdf2)


def page_images(path: str) -> list[bytes]:
    """Each page as PyMuPDF renders it by default (72 dpi, RGB), as raw pixel bytes."""
    import pymupdf

    with pymupdf.open(path) as doc:
        return [page.get_pixmap().samples for page in doc]


def compare_pdf_images(pdf1_path: str | None, pdf2_path: str | None, **_: Any) -> float:
    """1 when both PDFs render (PyMuPDF, default pixmaps) to the same number of pages with identical
    pixels, as OSWorld; it first rewrites both files in place with borb, which is not done here (a
    rewrite that keeps the content renders the same)."""
    if not pdf1_path or not pdf2_path:
        return 0.0
    require(_PYMUPDF, "compare_pdf_images")
    a, b = page_images(pdf1_path), page_images(pdf2_path)
    return float(len(a) == len(b) and a == b)


BLOCKERS: dict[str, Callable[[], str | None]] = {"compare_pdfs": _PYMUPDF, "compare_pdf_images": _PYMUPDF}

METRICS: dict[str, Callable[..., float]] = {
    "check_pdf_pages": check_pdf_pages,
    "compare_pdfs": compare_pdfs,
    "compare_pdf_images": compare_pdf_images,
}
