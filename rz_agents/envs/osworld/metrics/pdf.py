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


def _render(path: str, out_dir: str) -> list[bytes]:
    """Each page rendered to RGB pixels (``pdftoppm``, 72 dpi as PyMuPDF's default pixmap)."""
    import glob
    import os
    import subprocess

    from PIL import Image

    os.makedirs(out_dir, exist_ok=True)
    prefix = os.path.join(out_dir, "page")
    subprocess.run(
        ["pdftoppm", "-r", "72", "-png", path, prefix], check=True, capture_output=True, timeout=300
    )
    return [Image.open(p).convert("RGB").tobytes() for p in sorted(glob.glob(prefix + "*.png"))]


def compare_pdf_images(pdf1_path: str | None, pdf2_path: str | None, **_: Any) -> float:
    """1 when both PDFs render to the same number of pages with identical pixels.

    OSWorld rewrites both files with borb, then renders each page with PyMuPDF; here poppler's
    ``pdftoppm`` renders them (``BLOCKERS`` says when it is missing). Same decision when the two
    renderers agree on equality; the pixels themselves differ between renderers.
    """
    import shutil
    import tempfile

    if not pdf1_path or not pdf2_path:
        return 0.0
    if not shutil.which("pdftoppm"):
        raise RuntimeError(f"compare_pdf_images: {_render_blocker()}")
    with tempfile.TemporaryDirectory(prefix="rz_pdf_") as tmp:
        a, b = _render(pdf1_path, tmp + "/a"), _render(pdf2_path, tmp + "/b")
    return float(len(a) == len(b) and a == b)


def _render_blocker() -> str | None:
    import shutil

    return (
        None
        if shutil.which("pdftoppm")
        else "rendering PDF pages needs pdftoppm (apt-get install poppler-utils)"
    )


BLOCKERS: dict[str, Callable[[], str | None]] = {"compare_pdf_images": _render_blocker}

METRICS: dict[str, Callable[..., float]] = {
    "check_pdf_pages": check_pdf_pages,
    "compare_pdfs": compare_pdfs,
    "compare_pdf_images": compare_pdf_images,
}
