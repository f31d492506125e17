"""Text-document metrics (.docx through python-docx, .odt through its XML), as OSWorld's Writer checks.

``compare_docx_files(a, b, **options)``: paragraph texts equal; by default whitespace runs are
collapsed over the whole text (``ignore_blanks``), with ``ignore_case``, ``ignore_order``,
``delete_empty_lines``, ``content_only``/``fuzzy_match`` (a similarity score instead of 0/1).
Several checks first require the documents to match (``compare_docx_files``) and then test one
formatting property of the result: line spacing, strike-through, italic size, highlight, colours.
"""

from __future__ import annotations

import math
import re
import zipfile
from collections.abc import Callable
from typing import Any
from xml.etree import ElementTree as ET

from rz_agents.envs.osworld.metrics.general import fuzz_ratio

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
ODF_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
ODF_STYLE = "urn:oasis:names:tc:opendocument:xmlns:style:1.0"
ODF_FO = "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0"


def _docx(path: str) -> Any:
    from docx import Document

    return Document(path)


def _odt_content(path: str) -> ET.Element:
    with zipfile.ZipFile(path) as z:
        return ET.fromstring(z.read("content.xml"))


def odt_paragraphs(path: str) -> list[str]:
    """Texts of the ``text:p`` paragraphs: their own text and that of their direct spans."""
    out = []
    for p in _odt_content(path).iter(f"{{{ODF_TEXT}}}p"):
        parts = [p.text or ""]
        for child in p:
            if child.tag == f"{{{ODF_TEXT}}}span":
                parts.append(child.text or "")
            parts.append(child.tail or "")
        out.append("".join(parts))
    return out


def _paragraphs(path: str) -> list[str] | None:
    if path.endswith(".docx"):
        return [p.text for p in _docx(path).paragraphs]
    if path.endswith(".odt"):
        return odt_paragraphs(path)
    return None


def compare_docx_files(file1: str | None, file2: str | None, **options: Any) -> float:
    """1 (or a similarity) when the documents' paragraph texts match (see the module doc for options)."""
    if not file1 or not file2 or file1.rsplit(".", 1)[-1] != file2.rsplit(".", 1)[-1]:
        return 0.0
    try:
        p1, p2 = _paragraphs(file1), _paragraphs(file2)
    except Exception:
        return 0.0  # unreadable document
    if p1 is None or p2 is None:
        return 0.0
    ignore_case = options.get("ignore_case", False)
    if options.get("ignore_order", False):
        p1, p2 = sorted(p1), sorted(p2)
    if options.get("delete_empty_lines", False):
        p1, p2 = [p for p in p1 if p.strip()], [p for p in p2 if p.strip()]

    def joined(ps: list[str]) -> str:
        text = re.sub(r"\s+", " ", "\n".join(ps)).strip()
        return text.lower() if ignore_case else text

    if options.get("content_only", False):
        return fuzz_ratio(joined(p1), joined(p2)) / 100.0
    if options.get("ignore_blanks", True):
        if options.get("fuzzy_match", False):
            return fuzz_ratio(joined(p1), joined(p2)) / 100.0
        return float(joined(p1) == joined(p2))
    if len(p1) != len(p2):
        return 0.0
    fold = str.lower if ignore_case else (lambda s: s)
    if options.get("fuzzy_match", False):
        return (
            sum(fuzz_ratio(fold(a), fold(b)) / 100.0 for a, b in zip(p1, p2, strict=True)) / len(p1)
            if p1
            else 1.0
        )
    return float(all(fold(a) == fold(b) for a, b in zip(p1, p2, strict=True)))


def _both(file1: str | None, file2: str | None) -> tuple[Any, Any] | None:
    if not file1 or not file2:
        return None
    try:
        return _docx(file1), _docx(file2)
    except Exception:
        return None


def compare_docx_lines(file1: str | None, file2: str | None, **_: Any) -> float:
    """1 when the sets of non-empty (stripped) paragraphs are equal (order ignored)."""
    docs = _both(file1, file2)
    if docs is None:
        return 0.0
    lines = [{p.text.strip() for p in d.paragraphs if p.text.strip()} for d in docs]
    return float(lines[0] == lines[1])


def compare_init_lines(file1: str | None, file2: str | None, **_: Any) -> float:
    """1 when the paragraphs match pairwise as far as the shorter document goes."""
    docs = _both(file1, file2)
    if docs is None:
        return 0.0
    return float(all(a.text == b.text for a, b in zip(docs[0].paragraphs, docs[1].paragraphs, strict=False)))


def compare_docx_tables(file1: str | None, file2: str | None, **_: Any) -> float:
    """1 when both documents have the same tables: count, dimensions and (stripped) cell texts."""
    docs = _both(file1, file2)
    if docs is None:
        return 0.0
    t1, t2 = docs[0].tables, docs[1].tables
    if len(t1) != len(t2):
        return 0.0
    for a, b in zip(t1, t2, strict=True):
        if len(a.rows) != len(b.rows) or len(a.columns) != len(b.columns):
            return 0.0
        for i in range(len(a.rows)):
            for j in range(len(a.columns)):
                if a.cell(i, j).text.strip() != b.cell(i, j).text.strip():
                    return 0.0
    return 1.0


def compare_line_spacing(file1: str | None, file2: str | None, **_: Any) -> float:
    """1 when the documents match and every paragraph has the same line spacing."""
    if not compare_docx_files(file1, file2):
        return 0.0
    docs = _both(file1, file2)
    if docs is None or len(docs[0].paragraphs) != len(docs[1].paragraphs):
        return 0.0
    return float(
        all(
            a.paragraph_format.line_spacing == b.paragraph_format.line_spacing
            for a, b in zip(docs[0].paragraphs, docs[1].paragraphs, strict=True)
        )
    )


def _aligned_runs(docs: tuple[Any, Any]) -> Any:
    """Pairs of runs at the same place (paragraph, run) in both documents, as far as both go."""
    for p1, p2 in zip(docs[0].paragraphs, docs[1].paragraphs, strict=False):
        yield from zip(p1.runs, p2.runs, strict=False)


def compare_subscript_contains(file1: str | None, file2: str | None, **_: Any) -> float:
    """1 when some aligned pair of runs is subscript in both documents."""
    docs = _both(file1, file2)
    return float(
        docs is not None and any(r1.font.subscript and r2.font.subscript for r1, r2 in _aligned_runs(docs))
    )


def compare_contains_image(file1: str | None, file2: str | None, **_: Any) -> float:
    """1 when aligned runs agree on holding a picture (``graphicData``)."""
    docs = _both(file1, file2)
    if docs is None:
        return 0.0
    return float(
        all(
            ("graphicData" in r1._element.xml) == ("graphicData" in r2._element.xml)
            for r1, r2 in _aligned_runs(docs)
        )
    )


def compare_docx_images(file1: str | None, file2: str | None, **_: Any) -> float:
    """1 when both documents embed the same images (same count, same pixels, in order)."""
    docs = _both(file1, file2)
    if docs is None:
        return 0.0
    import io

    from PIL import Image

    def images(doc: Any) -> list[bytes]:
        blobs = [rel.target_part.blob for rel in doc.part.rels.values() if "image" in rel.reltype]
        return [Image.open(io.BytesIO(b)).tobytes() for b in blobs]

    return float(images(docs[0]) == images(docs[1]))


def has_page_numbers_in_footers(file: str | None, **_: Any) -> float:
    """1 when every section's footer (its first paragraph) holds a digit."""
    if not file:
        return 0.0
    doc = _docx(file)
    for section in doc.sections:
        paragraphs = section.footer.paragraphs
        text = paragraphs[0].text if paragraphs else ""
        if not any(ch.isdigit() for ch in text):
            return 0.0
    return 1.0


def is_first_line_centered(file: str | None, **_: Any) -> float:
    """1 when the first paragraph is centred."""
    if not file:
        return 0.0
    from docx.enum.text import WD_PARAGRAPH_ALIGNMENT

    paragraphs = _docx(file).paragraphs
    return float(
        bool(paragraphs) and paragraphs[0].paragraph_format.alignment == WD_PARAGRAPH_ALIGNMENT.CENTER
    )


def compare_font_names(file: str | None, rules: dict[str, Any], **_: Any) -> float:
    """1 when every run uses font ``rules["font_name"]``."""
    if not file:
        return 0.0
    want = rules["font_name"]
    return float(all(run.font.name == want for p in _docx(file).paragraphs for run in p.runs))


def contains_page_break(file: str | None, rules: dict[str, Any] | None = None, **_: Any) -> float:
    """1 when the document has a page break (exactly ``rules["page_break_count"]`` when given)."""
    if not file:
        return 0.0
    count = sum(
        1
        for p in _docx(file).paragraphs
        for run in p.runs
        for br in run.element.iter(f"{{{W}}}br")
        if br.get(f"{{{W}}}type") == "page"
    )
    want = (rules or {}).get("page_break_count")
    if want is not None and count != want:
        return 0.0
    return float(count > 0)


def evaluate_strike_through_last_paragraph(file1: str | None, file2: str | None, **_: Any) -> float:
    """1 when the documents match and every run of the result's last paragraph is struck through."""
    if not compare_docx_files(file1, file2):
        return 0.0
    paragraphs = _docx(file1).paragraphs
    return float(bool(paragraphs) and all(run.font.strike for run in paragraphs[-1].runs))


def check_italic_font_size_14(file1: str | None, file2: str | None, **_: Any) -> float:
    """1 when the documents match and every italic run of the result is 14 pt."""
    if not compare_docx_files(file1, file2):
        return 0.0
    for p in _docx(file1).paragraphs:
        for run in p.runs:
            if run.italic and (run.font.size is None or run.font.size.pt != 14):
                return 0.0
    return 1.0


def check_highlighted_words(file1: str | None, file2: str | None, **_: Any) -> float:
    """1 when the documents match and the result (.odt) has no yellow-highlighted span left."""
    if not compare_docx_files(file1, file2):
        return 0.0
    root = _odt_content(file1)
    yellow = {
        s.get(f"{{{ODF_STYLE}}}name")
        for s in root.iter(f"{{{ODF_STYLE}}}style")
        for props in s.iter(f"{{{ODF_STYLE}}}text-properties")
        if (props.get(f"{{{ODF_FO}}}background-color") or "").lower() == "#ffff00"
    }
    used = {span.get(f"{{{ODF_TEXT}}}style-name") for span in root.iter(f"{{{ODF_TEXT}}}span")}
    return float(not (yellow & used))


def _srgb_to_lab(rgb: tuple[int, int, int]) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB colour given as 0..255 components."""

    def linear(c: float) -> float:
        c /= 255.0
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in rgb)
    x = (0.4124564 * r + 0.3575761 * g + 0.1804375 * b) / 0.95047
    y = 0.2126729 * r + 0.7151522 * g + 0.0721750 * b
    z = (0.0193339 * r + 0.1191920 * g + 0.9503041 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29

    fx, fy, fz = f(x), f(y), f(z)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def delta_e_ciede2000(lab1: tuple[float, float, float], lab2: tuple[float, float, float]) -> float:
    """The CIEDE2000 colour difference (Sharma, Wu and Dalal's formulation)."""
    l1, a1, b1 = lab1
    l2, a2, b2 = lab2
    c_bar = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_bar**7 / (c_bar**7 + 25**7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1p = math.degrees(math.atan2(b1, a1p)) % 360 if c1p else 0.0
    h2p = math.degrees(math.atan2(b2, a2p)) % 360 if c2p else 0.0
    dl, dc = l2 - l1, c2p - c1p
    if c1p * c2p == 0:
        dh = 0.0
    elif abs(h2p - h1p) <= 180:
        dh = h2p - h1p
    else:
        dh = h2p - h1p - 360 if h2p > h1p else h2p - h1p + 360
    dhh = 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dh / 2))
    l_bar, c_bar_p = (l1 + l2) / 2, (c1p + c2p) / 2
    if c1p * c2p == 0:
        h_bar = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        h_bar = (h1p + h2p) / 2
    else:
        h_bar = (h1p + h2p + 360) / 2 if h1p + h2p < 360 else (h1p + h2p - 360) / 2
    t = (
        1
        - 0.17 * math.cos(math.radians(h_bar - 30))
        + 0.24 * math.cos(math.radians(2 * h_bar))
        + 0.32 * math.cos(math.radians(3 * h_bar + 6))
        - 0.20 * math.cos(math.radians(4 * h_bar - 63))
    )
    sl = 1 + 0.015 * (l_bar - 50) ** 2 / math.sqrt(20 + (l_bar - 50) ** 2)
    sc, sh = 1 + 0.045 * c_bar_p, 1 + 0.015 * c_bar_p * t
    rt = (
        -2
        * math.sqrt(c_bar_p**7 / (c_bar_p**7 + 25**7))
        * math.sin(math.radians(60 * math.exp(-(((h_bar - 275) / 25) ** 2))))
    )
    return math.sqrt((dl / sl) ** 2 + (dc / sc) ** 2 + (dhh / sh) ** 2 + rt * (dc / sc) * (dhh / sh))


def evaluate_colored_words_in_tables(file1: str | None, file2: str | None, **options: Any) -> float:
    """1 when the documents match and, in the result's tables, words starting with a vowel are red
    and the others blue (CIEDE2000 distance within ``threshold``, default 3.5)."""
    if not compare_docx_files(file1, file2):
        return 0.0
    threshold = float(options.get("threshold", 3.5))
    red, blue = _srgb_to_lab((255, 0, 0)), _srgb_to_lab((0, 0, 255))
    for table in _docx(file1).tables:
        for row in table.rows:
            for cell in row.cells:
                for p in cell.paragraphs:
                    for run in p.runs:
                        if not run.text:
                            continue
                        rgb = (
                            run.font.color.rgb if run.font.color is not None and run.font.color.type else None
                        )
                        if rgb is None:
                            return 0.0
                        want = red if run.text[0].lower() in "aeiou" else blue
                        if delta_e_ciede2000(_srgb_to_lab(tuple(rgb)), want) > threshold:
                            return 0.0
    return 1.0


def check_tabstops(file1: str | None, file2: str | None, **options: Any) -> float:
    """Similarity of the tab stops of the non-empty paragraphs (1 minus the mean position offset over
    the text width); 0 when alignments or counts differ. ``word_number_split_by_tabstop``: the
    result's text before tab ``index`` must hold that many words."""
    docs = _both(file1, file2)
    if docs is None:
        return 0.0
    from docx.enum.text import WD_TAB_ALIGNMENT

    p1 = [p for p in docs[0].paragraphs if p.text.strip()]
    p2 = [p for p in docs[1].paragraphs if p.text.strip()]
    if len(p1) != len(p2) or not p1:
        return 0.0
    words = options.get("word_number_split_by_tabstop")
    if words is not None:
        index = int(options.get("index", 0))
        for p in p1:
            parts = p.text.split("\t")
            if index >= len(parts) or len([w for w in re.split(r"\s", parts[index]) if w.strip()]) != words:
                return 0.0
    section = docs[1].sections[0]
    width = section.page_width - section.left_margin - section.right_margin

    def kept(p: Any) -> list[Any]:
        return [
            t
            for t in p.paragraph_format.tab_stops
            if not (
                t.alignment == WD_TAB_ALIGNMENT.CLEAR
                or (t.alignment == WD_TAB_ALIGNMENT.LEFT and t.position == 0)
            )
        ]

    minus = 0.0
    for a, b in zip(p1, p2, strict=True):
        ta, tb = kept(a), kept(b)
        if len(ta) != len(tb) or any(x.alignment != y.alignment for x, y in zip(ta, tb, strict=True)):
            return 0.0
        minus += sum(abs(x.position - y.position) for x, y in zip(ta, tb, strict=True)) / width
    return 1.0 - minus / len(p1)


def _docx(path: str) -> Any:
    from docx import Document

    return Document(path)


def compare_docx_files_and_ignore_new_lines(file1: str | None, file2: str | None, **options: Any) -> float:
    """1 when the .docx files' non-empty paragraphs agree.

    ``ignore_blanks`` (default True): the paragraphs joined by newlines, whitespace runs collapsed
    and stripped, are equal; otherwise the paragraph lists are equal. Both files must be .docx.
    """
    if not file1 or not file2:
        return 0.0
    if not (file1.endswith(".docx") and file2.endswith(".docx")):
        return 0.0
    try:
        p1 = [p.text for p in _docx(file1).paragraphs if p.text != ""]
        p2 = [p.text for p in _docx(file2).paragraphs if p.text != ""]
    except Exception:
        return 0.0
    if options.get("ignore_blanks", True):
        norm = lambda ps: re.sub(r"\s+", " ", "\n".join(ps)).strip()  # noqa: E731
        return float(norm(p1) == norm(p2))
    return float(p1 == p2)


def _highlighted_texts(path: str) -> list[str | None]:
    """The first ``w:t`` text of every run with a ``w:highlight`` other than ``none``."""
    with zipfile.ZipFile(path) as z:
        root = ET.fromstring(z.read("word/document.xml"))
    out = []
    for run in root.iter(f"{{{W}}}r"):
        mark = run.find(f".//{{{W}}}highlight")
        if mark is not None and mark.get(f"{{{W}}}val") != "none":
            t = run.find(f".//{{{W}}}t")
            if t is not None:
                out.append(t.text)
    return out


def compare_highlighted_text(file1: str | None, file2: str | None, **_: Any) -> float:
    """1 when the sets of highlighted run texts are equal (runs, not words or phrases)."""
    if not file1 or not file2:
        return 0.0
    return float(set(_highlighted_texts(file1)) == set(_highlighted_texts(file2)))


def compare_insert_equation(docx_file1: str | None, docx_file2: str | None, **_: Any) -> float:
    """1 when ``compare_docx_files`` passes and some paired run holds an OLE object (``w:object``) in
    both documents (OSWorld's test for an inserted equation)."""
    if not docx_file1 or not docx_file2:
        return 0.0
    if not compare_docx_files(docx_file1, docx_file2):
        return 0.0
    try:
        d1, d2 = _docx(docx_file1), _docx(docx_file2)
    except Exception:
        return 0.0
    for para1, para2 in zip(d1.paragraphs, d2.paragraphs, strict=False):
        for run1, run2 in zip(para1.runs, para2.runs, strict=False):
            if run1.element.xpath(".//w:object") and run2.element.xpath(".//w:object"):
                return 1.0
    return 0.0


def compare_image_text(image_path: str | None, rule: dict[str, Any], **_: Any) -> float:
    """1 when ``rule["text"]`` occurs in the image's OCR text (OSWorld: EasyOCR, English)."""
    if not image_path:
        return 0.0
    if rule["type"] != "text":
        raise ValueError("compare_image_text: unsupported rule type")
    try:
        import easyocr  # type: ignore[import-not-found]
    except ImportError as exc:
        raise RuntimeError(f"compare_image_text: {_ocr_blocker()}") from exc
    found = " ".join(entry[1] for entry in easyocr.Reader(["en"]).readtext(image_path))
    return float(rule["text"] in found)


def _ocr_blocker() -> str | None:
    import importlib.util

    if importlib.util.find_spec("easyocr") is None:
        # easyocr itself is on PyPI, but its CRAFT detector and English recogniser download from GitHub
        # at first use; Tesseract (apt) reads text differently, so it would not score as OSWorld does.
        return (
            "OCR needs easyocr and its model weights (easyocr fetches them from GitHub at first use: no "
            "internet here; OSWorld's choice, no stand-in: Tesseract reads text differently)"
        )
    return None


def compare_references(file1: str | None, file2: str | None, **options: Any) -> float:
    """Similarity of the reference lists after the first ``reference_indicator`` paragraph.

    Both without the heading: 1; one without: 0; different counts of non-empty references: 0.
    Otherwise the mean fuzz ratio ``r`` of paired references, rescaled above
    ``reference_base_result`` (default 0.5): ``(r - base) / (1 - base)``, 0 below it.
    """
    if not file1 or not file2:
        return 0.0
    indicator = options.get("reference_indicator", "References")
    base = options.get("reference_base_result", 0.5)
    if not (file1.endswith(".docx") and file2.endswith(".docx")):
        return 0.0
    try:
        p1 = [p.text for p in _docx(file1).paragraphs]
        p2 = [p.text for p in _docx(file2).paragraphs]
    except Exception:
        return 0.0
    i1 = p1.index(indicator) if indicator in p1 else -1
    i2 = p2.index(indicator) if indicator in p2 else -1
    if i1 == -1 and i2 == -1:
        return 1.0
    if i1 == -1 or i2 == -1:
        return 0.0
    r1 = [p for p in p1[i1 + 1 :] if p.strip()]
    r2 = [p for p in p2[i2 + 1 :] if p.strip()]
    if len(r1) != len(r2):
        return 0.0
    if not r1:
        raise ZeroDivisionError("compare_references: no references after the heading")  # as OSWorld
    mean = sum(fuzz_ratio(a, b) / 100.0 for a, b in zip(r1, r2, strict=True)) / len(r1)
    return (mean - base) / (1 - base) if mean >= base else 0.0


BLOCKERS: dict[str, Callable[[], str | None]] = {"compare_image_text": _ocr_blocker}

METRICS: dict[str, Callable[..., float]] = {
    "compare_docx_files": compare_docx_files,
    "compare_docx_files_and_ignore_new_lines": compare_docx_files_and_ignore_new_lines,
    "compare_highlighted_text": compare_highlighted_text,
    "compare_insert_equation": compare_insert_equation,
    "compare_image_text": compare_image_text,
    "compare_references": compare_references,
    "compare_docx_lines": compare_docx_lines,
    "compare_init_lines": compare_init_lines,
    "compare_docx_tables": compare_docx_tables,
    "compare_docx_images": compare_docx_images,
    "compare_line_spacing": compare_line_spacing,
    "compare_subscript_contains": compare_subscript_contains,
    "compare_contains_image": compare_contains_image,
    "has_page_numbers_in_footers": has_page_numbers_in_footers,
    "is_first_line_centered": is_first_line_centered,
    "compare_font_names": compare_font_names,
    "contains_page_break": contains_page_break,
    "evaluate_strike_through_last_paragraph": evaluate_strike_through_last_paragraph,
    "check_italic_font_size_14": check_italic_font_size_14,
    "check_highlighted_words": check_highlighted_words,
    "evaluate_colored_words_in_tables": evaluate_colored_words_in_tables,
    "check_tabstops": check_tabstops,
}
