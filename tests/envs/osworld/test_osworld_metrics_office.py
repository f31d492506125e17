"""Presentation and text-document metrics, on decks and documents the tests build."""

from __future__ import annotations

import io
import zipfile

import pytest
from docx import Document
from docx.enum.text import WD_BREAK, WD_PARAGRAPH_ALIGNMENT
from docx.shared import Pt, RGBColor
from lxml import etree
from PIL import Image
from pptx import Presentation
from pptx.dml.color import RGBColor as PptxRGB
from pptx.util import Inches
from pptx.util import Pt as PptxPt

from rz_agents.envs.osworld.metrics import METRICS
from rz_agents.envs.osworld.metrics.docs import delta_e_ciede2000

M = METRICS


def deck(path, texts=("Title", "Body"), bold=False, left=Inches(1), notes="", slides=1, background=None):
    prs = Presentation()
    for _ in range(slides):
        slide = prs.slides.add_slide(prs.slide_layouts[6])
        box = slide.shapes.add_textbox(left, Inches(1), Inches(4), Inches(1))
        for i, text in enumerate(texts):
            para = box.text_frame.paragraphs[0] if i == 0 else box.text_frame.add_paragraph()
            run = para.add_run()
            run.text = text
            run.font.bold = bold
            run.font.size = PptxPt(20)
        if notes:
            slide.notes_slide.notes_text_frame.text = notes
        if background:
            slide.background.fill.solid()
            slide.background.fill.fore_color.rgb = PptxRGB(*background)
    prs.save(path)
    return str(path)


def test_compare_pptx_files_examines_text_fonts_geometry_notes_and_count(tmp_path):
    gold = deck(tmp_path / "gold.pptx")
    assert M["compare_pptx_files"](deck(tmp_path / "same.pptx"), gold) == 1.0
    assert M["compare_pptx_files"](deck(tmp_path / "text.pptx", texts=("Title", "Bodies")), gold) == 0.0
    assert M["compare_pptx_files"](deck(tmp_path / "bold.pptx", bold=True), gold) == 0.0
    moved = deck(tmp_path / "moved.pptx", left=Inches(2))
    assert M["compare_pptx_files"](moved, gold) == 0.0
    assert M["compare_pptx_files"](moved, gold, examine_shape=False) == 1.0
    assert M["compare_pptx_files"](deck(tmp_path / "notes.pptx", notes="remember"), gold) == 0.0
    assert M["compare_pptx_files"](deck(tmp_path / "two.pptx", slides=2), gold) == 0.0
    # OSWorld's background reader always yields None: a changed background passes (its quirk, kept)
    assert M["compare_pptx_files"](deck(tmp_path / "bg.pptx", background=(0, 0, 255)), gold) == 1.0
    assert M["compare_pptx_files"](None, gold) == 0.0
    (tmp_path / "junk.pptx").write_text("junk")
    assert M["compare_pptx_files"](str(tmp_path / "junk.pptx"), gold) == 0.0


def test_slide_background_orientation_and_transition(tmp_path):
    blue = deck(tmp_path / "blue.pptx", background=(0, 0, 250), slides=2)
    assert M["evaluate_presentation_fill_to_rgb_distance"](blue, {"rgb": [0, 0, 255]}) > 0.98
    assert (
        M["evaluate_presentation_fill_to_rgb_distance"](
            blue, {"rgb": [0, 0, 255], "original_rgb": [0, 0, 250]}
        )
        == 0.0
    )
    assert (
        M["evaluate_presentation_fill_to_rgb_distance"](deck(tmp_path / "plain.pptx"), {"rgb": [0, 0, 255]})
        == 0.0
    )
    prs = Presentation()
    prs.slide_width, prs.slide_height = Inches(7.5), Inches(10)
    slide = prs.slides.add_slide(prs.slide_layouts[6])
    slide._element.append(
        etree.fromstring(
            '<p:transition xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"><p:dissolve/></p:transition>'
        )
    )
    prs.save(tmp_path / "portrait.pptx")
    portrait = str(tmp_path / "portrait.pptx")
    assert M["check_slide_orientation_Portrait"](portrait) == 1.0
    assert M["check_slide_orientation_Portrait"](blue) == 0.0
    assert M["check_transition"](portrait, {"slide_idx": 0, "transition_type": "dissolve"}) == 1.0
    assert M["check_transition"](portrait, {"slide_idx": 0, "transition_type": "fade"}) == 0.0
    assert M["check_transition"](blue, {"slide_idx": 0, "transition_type": "dissolve"}) == 0.0


def test_image_stretched_and_centred(tmp_path):
    png = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(png, "PNG")

    def with_picture(path, full):
        prs = Presentation()
        slide = prs.slides.add_slide(prs.slide_layouts[6])
        png.seek(0)
        if full:
            slide.shapes.add_picture(png, 0, 0, prs.slide_width, prs.slide_height)
        else:
            slide.shapes.add_picture(png, Inches(1), Inches(1), Inches(2), Inches(1.5))
        prs.save(path)
        return str(path)

    original = with_picture(tmp_path / "o.pptx", False)
    assert M["check_image_stretch_and_center"](with_picture(tmp_path / "m.pptx", True), original) == 1.0
    assert M["check_image_stretch_and_center"](original, original) == 0.0


def test_page_number_colour_and_left_panel(tmp_path):
    path = tmp_path / "m.pptx"
    Presentation().save(path)
    with zipfile.ZipFile(path) as z:
        parts = {n: z.read(n) for n in z.namelist()}
    master = etree.fromstring(parts["ppt/slideMasters/slideMaster1.xml"])
    a = "http://schemas.openxmlformats.org/drawingml/2006/main"
    for color in ("FF0000", "000000"):  # the one before last is the slide number's
        fill = etree.SubElement(master, f"{{{a}}}solidFill")
        etree.SubElement(fill, f"{{{a}}}srgbClr", val=color)
    parts["ppt/slideMasters/slideMaster1.xml"] = etree.tostring(master)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in parts.items():
            z.writestr(name, data)
    assert M["check_page_number_colors"](str(path), {"color": "red"}) == 1.0
    assert M["check_page_number_colors"](str(path), {"color": "blue"}) == 0.0
    tree = (
        '<desktop-frame><application name="soffice"><document-frame name="Slides View"/></application>'
        '</desktop-frame>'
    )
    assert M["check_left_panel"](tree) == 1.0
    assert M["check_left_panel"](tree.replace("Slides View", "Outline")) == 0.0


def document(path, paragraphs=("Hello world", "Second line"), edit=None):
    doc = Document()
    for text in paragraphs:
        doc.add_paragraph(text)
    if edit:
        edit(doc)
    doc.save(path)
    return str(path)


def test_compare_docx_files_options(tmp_path):
    gold = document(tmp_path / "g.docx")
    assert (
        M["compare_docx_files"](document(tmp_path / "a.docx", ("Hello   world", "Second line")), gold) == 1.0
    )
    assert (
        M["compare_docx_files"](
            document(tmp_path / "b.docx", ("Hello   world", "Second line")), gold, ignore_blanks=False
        )
        == 0.0
    )
    assert (
        M["compare_docx_files"](
            document(tmp_path / "c.docx", ("hello world", "second line")), gold, ignore_case=True
        )
        == 1.0
    )
    swapped = document(tmp_path / "d.docx", ("Second line", "Hello world"))
    assert M["compare_docx_files"](swapped, gold) == 0.0
    assert M["compare_docx_files"](swapped, gold, ignore_order=True) == 1.0
    near = M["compare_docx_files"](
        document(tmp_path / "e.docx", ("Hello world", "Second lime")), gold, fuzzy_match=True
    )
    assert 0.9 < near < 1.0
    assert M["compare_docx_lines"](swapped, gold) == 1.0
    assert M["compare_docx_files"](gold, str(tmp_path / "x.odt")) == 0.0


def test_docx_formatting_checks(tmp_path):
    def styled(doc):
        doc.paragraphs[0].alignment = WD_PARAGRAPH_ALIGNMENT.CENTER
        run = doc.paragraphs[1].runs[0]
        run.font.strike = True
        run.italic = True
        run.font.size = Pt(14)
        doc.add_paragraph().add_run().add_break(WD_BREAK.PAGE)
        doc.sections[0].footer.paragraphs[0].text = "Page 1"
        for p in doc.paragraphs:
            for r in p.runs:
                r.font.name = "Times New Roman"

    res = document(tmp_path / "r.docx", edit=styled)
    plain = document(tmp_path / "p.docx")
    assert M["is_first_line_centered"](res) == 1.0 and M["is_first_line_centered"](plain) == 0.0
    assert M["contains_page_break"](res, {}) == 1.0 and M["contains_page_break"](plain, {}) == 0.0
    assert M["contains_page_break"](res, {"page_break_count": 2}) == 0.0
    assert M["has_page_numbers_in_footers"](res) == 1.0 and M["has_page_numbers_in_footers"](plain) == 0.0
    assert M["compare_font_names"](res, {"font_name": "Times New Roman"}) == 1.0
    assert M["compare_font_names"](plain, {"font_name": "Times New Roman"}) == 0.0
    # struck-through/italic checks first require the texts to match (the page break paragraph is empty)
    gold = document(tmp_path / "g.docx", ("Hello world", "Second line", ""))
    assert M["evaluate_strike_through_last_paragraph"](res, gold) == 0.0  # the last paragraph is the break
    struck = document(
        tmp_path / "s.docx", edit=lambda d: setattr(d.paragraphs[-1].runs[0].font, "strike", True)
    )
    assert M["evaluate_strike_through_last_paragraph"](struck, plain) == 1.0
    assert M["check_italic_font_size_14"](res, gold) == 1.0
    small = document(tmp_path / "i.docx", edit=lambda d: setattr(d.paragraphs[0].runs[0], "italic", True))
    assert M["check_italic_font_size_14"](small, plain) == 0.0


def test_docx_tables_spacing_and_colours(tmp_path):
    def table(words, colours=None):
        def edit(doc):
            t = doc.add_table(rows=1, cols=len(words))
            for i, w in enumerate(words):
                run = t.cell(0, i).paragraphs[0].add_run(w)
                if colours:
                    run.font.color.rgb = RGBColor(*colours[i])

        return edit

    gold = document(tmp_path / "g.docx", edit=table(["apple", "pear"]))
    assert M["compare_docx_tables"](document(tmp_path / "a.docx", edit=table(["apple", "pear"])), gold) == 1.0
    assert M["compare_docx_tables"](document(tmp_path / "b.docx", edit=table(["apple", "plum"])), gold) == 0.0
    good = document(tmp_path / "c.docx", edit=table(["apple", "pear"], [(255, 0, 0), (0, 0, 255)]))
    bad = document(tmp_path / "d.docx", edit=table(["apple", "pear"], [(0, 0, 255), (0, 0, 255)]))
    assert M["evaluate_colored_words_in_tables"](good, gold) == 1.0
    assert M["evaluate_colored_words_in_tables"](bad, gold) == 0.0

    def spaced(value):
        return lambda doc: [setattr(p.paragraph_format, "line_spacing", value) for p in doc.paragraphs]

    assert (
        M["compare_line_spacing"](
            document(tmp_path / "e.docx", edit=spaced(1.5)), document(tmp_path / "f.docx", edit=spaced(1.5))
        )
        == 1.0
    )
    assert (
        M["compare_line_spacing"](
            document(tmp_path / "h.docx", edit=spaced(2.0)), document(tmp_path / "k.docx", edit=spaced(1.5))
        )
        == 0.0
    )


def test_ciede2000_reference_pairs():
    # Sharma, Wu and Dalal (2005), test data pairs 1 and 7
    assert delta_e_ciede2000((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485)) == pytest.approx(
        2.0425, abs=1e-4
    )
    assert delta_e_ciede2000((50.0, 0.0, 0.0), (50.0, -1.0, 2.0)) == pytest.approx(2.3669, abs=1e-4)


def odt(path, spans):
    """A minimal .odt whose first paragraph holds ``spans`` ((text, highlighted) pairs)."""
    ns = ('xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
          'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
          'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0" '
          'xmlns:fo="urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0"')  # fmt: skip
    body = "".join(f'<text:span text:style-name="{"T1" if hl else "T2"}">{t}</text:span>' for t, hl in spans)
    content = (
        f"<office:document-content {ns}><office:automatic-styles>"
        '<style:style style:name="T1" style:family="text">'
        '<style:text-properties fo:background-color="#ffff00"/></style:style><style:style style:name="T2" '
        'style:family="text"><style:text-properties fo:font-weight="bold"/></style:style>'
        f"</office:automatic-styles><office:body><office:text><text:p>{body}</text:p></office:text></office:body></office:document-content>"
    )
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("mimetype", "application/vnd.oasis.opendocument.text")
        z.writestr("content.xml", content)
    return str(path)


def test_odt_text_and_highlight_removal(tmp_path):
    gold = odt(tmp_path / "g.odt", [("Keep ", False), ("this", False)])
    clean = odt(tmp_path / "c.odt", [("Keep ", False), ("this", False)])
    marked = odt(tmp_path / "m.odt", [("Keep ", False), ("this", True)])
    assert M["compare_docx_files"](clean, gold) == 1.0
    assert M["check_highlighted_words"](clean, gold) == 1.0
    assert M["check_highlighted_words"](marked, gold) == 0.0
