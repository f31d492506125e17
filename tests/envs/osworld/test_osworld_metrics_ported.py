"""Metrics ported from OSWorld's code (commit 8942695), on files the tests make.

Each test pins one branch of the official function: its guard, its comparison, its quirk.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import shutil
import zipfile

import numpy as np
import openpyxl
import pytest
from docx import Document
from docx.enum.text import WD_COLOR_INDEX
from docx.oxml import parse_xml
from PIL import Image, ImageFilter

from rz_agents.envs.osworld.metrics import METRICS, blocker
from rz_agents.envs.osworld.metrics.general import fuzz_ratio, lcs_length

M = METRICS


def write(path, text):
    path.write_text(text)
    return str(path)


# --- VS Code ------------------------------------------------------------------------------------


def test_compare_config_is_exact_text_equality(tmp_path):
    rule = {"expected": '{"workbench.colorTheme": "Visual Studio Dark"}\n'}
    assert M["compare_config"](write(tmp_path / "a", rule["expected"]), rule) == 1.0
    assert M["compare_config"](write(tmp_path / "b", rule["expected"].strip()), rule) == 0.0  # newline
    assert M["compare_config"](None, rule) == 0.0


def test_is_extension_installed_contain_and_not_contain():
    assert M["is_extension_installed"]("a\ntest.py\n", {"type": "contain", "expected": "test.py"}) == 1.0
    assert M["is_extension_installed"]("a\n", {"type": "contain", "expected": "test.py"}) == 0.0
    assert M["is_extension_installed"]("a\n", {"type": "not_contain", "expected": "test.py"}) == 1.0
    with pytest.raises(ValueError):
        M["is_extension_installed"]("a", {"type": "regex", "expected": "a"})
    with pytest.raises(TypeError):
        M["is_extension_installed"](None, {"type": "contain", "expected": "a"})  # no guard, as OSWorld


def test_compare_zip_files_needs_same_names_and_bytes(tmp_path):
    def z(name, members):
        with zipfile.ZipFile(tmp_path / name, "w") as f:
            for k, v in members.items():
                f.writestr(k, v)
        return str(tmp_path / name)

    gold = z("g.zip", {"a.txt": "x", "b/c.txt": "y"})
    assert M["compare_zip_files"](z("s.zip", {"b/c.txt": "y", "a.txt": "x"}), gold) == 1.0
    assert M["compare_zip_files"](z("d.zip", {"a.txt": "x", "b/c.txt": "Y"}), gold) == 0.0
    assert M["compare_zip_files"](z("n.zip", {"a.txt": "x"}), gold) == 0.0
    assert M["compare_zip_files"](None, gold) == 0.0


def _pdf_bytes(pages: list[str]) -> bytes:
    import pymupdf

    doc = pymupdf.open()
    for text in pages:
        doc.new_page(width=300, height=200).insert_text((20, 100), text)
    return doc.tobytes()


def test_compare_zip_files_compares_pdf_members_by_pypdf2_text_at_0_95(tmp_path):
    def z(name, pdf):
        with zipfile.ZipFile(tmp_path / name, "w") as f:
            f.writestr("report.pdf", pdf)
        return str(tmp_path / name)

    text = "Quarterly results for the northern region, all figures in thousands of euros."
    gold = z("g.zip", _pdf_bytes([text]))
    assert M["compare_zip_files"](z("same.zip", _pdf_bytes([text])), gold) == 1.0  # other bytes, same text
    assert M["compare_zip_files"](z("near.zip", _pdf_bytes([text[:-1] + "!"])), gold) == 1.0  # ratio >= 0.95
    assert M["compare_zip_files"](z("far.zip", _pdf_bytes(["Something else entirely."])), gold) == 0.0


def test_compare_pdfs_pairs_lists_only_when_the_second_is_one_and_opens_a_missing_result_empty(tmp_path):
    def pdf(name, pages):
        (tmp_path / name).write_bytes(_pdf_bytes(pages))
        return str(tmp_path / name)

    hello, blank = pdf("h.pdf", ["Hello"]), pdf("b.pdf", [""])
    assert M["compare_pdfs"]([hello, blank], [hello, hello]) == 0.5  # the mean over the second list
    assert M["compare_pdfs"](hello, [hello, hello]) == 0.0  # a path against a list: zipped by character
    assert M["compare_pdfs"](None, blank) == 1.0  # PyMuPDF opens None as an empty document: "" == ""
    assert M["compare_pdfs"](None, hello) == 0.0


def test_compare_pdf_images_needs_equal_page_counts_and_pixels(tmp_path):
    def pdf(name, pages):
        (tmp_path / name).write_bytes(_pdf_bytes(pages))
        return str(tmp_path / name)

    gold = pdf("g.pdf", ["One", "Two"])
    assert M["compare_pdf_images"](pdf("same.pdf", ["One", "Two"]), gold) == 1.0
    assert M["compare_pdf_images"](pdf("other.pdf", ["One", "Tw0"]), gold) == 0.0  # one glyph differs
    assert M["compare_pdf_images"](pdf("short.pdf", ["One"]), gold) == 0.0
    assert M["compare_pdf_images"](None, gold) == 0.0


def test_check_python_file_by_test_suite_runs_the_named_function(tmp_path):
    code = tmp_path / "work"
    code.mkdir()
    write(code / "mod.py", "def add(a, b):\n    return a + b\n")
    test = write(
        tmp_path / "t.py",
        "def test():\n    import mod\n    return mod.add(2, 3) == 5\ndef bad():\n    1 / 0\n",
    )
    files = [str(code / "mod.py")]
    assert M["check_python_file_by_test_suite"](files, test) == 1.0
    assert M["check_python_file_by_test_suite"](files, test, test_function_name="bad") == 0.0  # raises
    write(code / "mod.py", "def add(a, b):\n    return a - b\n")
    assert M["check_python_file_by_test_suite"](files, test) == 0.0
    broken = write(tmp_path / "broken.py", "def test(:\n")
    with pytest.raises(RuntimeError):
        M["check_python_file_by_test_suite"](files, broken)


def test_check_html_background_image_reads_style_blocks_verbatim(tmp_path):
    rule = {"type:": "value", "value": "anmi_sharper.png"}
    ok = "<html><head><style>body { background-image: url('anmi_sharper.png'); }</style></head></html>"
    assert M["check_html_background_image"](write(tmp_path / "a.html", ok), rule) == 1.0
    quoted = ok.replace("'anmi_sharper.png'", '"anmi_sharper.png"')
    assert M["check_html_background_image"](write(tmp_path / "b.html", quoted), rule) == 0.0
    inline = "<body style=\"background-image: url('anmi_sharper.png')\"></body>"
    assert M["check_html_background_image"](write(tmp_path / "c.html", inline), rule) == 0.0


def test_compare_result_files_numbers_substrings_and_text(tmp_path):
    gold = write(tmp_path / "g", "42.5\n")
    assert M["compare_result_files"](write(tmp_path / "a", "The answer is 42.5"), gold) == 1.0
    assert M["compare_result_files"](write(tmp_path / "b", "42.50001"), gold) == 1.0
    assert M["compare_result_files"](write(tmp_path / "c", "42.6"), gold) == 0.0
    text_gold = write(tmp_path / "tg", " hello ")
    assert M["compare_result_files"](write(tmp_path / "d", "hello"), text_gold) == 1.0
    assert M["compare_result_files"](write(tmp_path / "e", "hello!"), text_gold) == 0.0


# --- desktop state ----------------------------------------------------------------------------


def test_is_in_vm_clickboard_takes_the_rule_first():
    assert M["is_in_vm_clickboard"]({"expected": ["a", "b"]}, "xx a b") == 1.0
    assert M["is_in_vm_clickboard"]({"expected": ["a", "c"]}, "xx a b") == 0.0
    assert M["is_in_vm_clickboard"]({"expected": "b"}, "xx a b") == 1.0


def test_is_utc_0_reads_the_fourth_line():
    out = "  Local time: x\n Universal time: y\n RTC time: z\n Time zone: Etc/UTC (UTC, +0000)\n"
    assert M["is_utc_0"](out) == 1.0
    assert M["is_utc_0"](out.replace("+0000", "+0100")) == 0.0
    with pytest.raises(IndexError):
        M["is_utc_0"]("one line")


def test_gnome_favourites_and_text_scaling():
    rule = {"expected": ["a.desktop", "b.desktop"]}
    assert M["check_gnome_favorite_apps"]("['b.desktop', 'a.desktop']\n", rule) == 1.0
    assert M["check_gnome_favorite_apps"]("['a.desktop', 'a.desktop', 'b.desktop']", rule) == 0.0
    assert M["check_text_enlarged"]("1.25\n") == 1.0
    assert M["check_text_enlarged"]("1.0") == 0.0


# --- media ---------------------------------------------------------------------------------------


def test_check_mp3_meta_matches_each_tag_rule(tmp_path):
    from mutagen.easyid3 import EasyID3

    path = tmp_path / "song.mp3"
    path.write_bytes(b"\xff\xfb\x90\x00" + b"\x00" * 400)
    tags = EasyID3()
    tags["title"], tags["artist"] = "Missing You", ["Cheng", "Xiang"]
    tags.save(str(path))
    rule = {"title": {"method": "eq", "ref": "Missing You"}, "artist": {"method": "eq", "ref": "Cheng,Xiang"}}
    assert M["check_mp3_meta"](str(path), rule) == 1.0
    assert M["check_mp3_meta"](str(path), {"album": {"method": "eq", "ref": ""}}) == 1.0  # missing tag is ""
    assert M["check_mp3_meta"](str(path), {"title": {"method": "eq", "ref": "Other"}}) == 0.0
    assert M["check_mp3_meta"](None, rule) == 0.0
    bare = tmp_path / "bare.mp3"
    bare.write_bytes(b"\x00" * 100)
    with pytest.raises(Exception):  # noqa: B017 -- mutagen's ID3NoHeaderError, as in OSWorld
        M["check_mp3_meta"](str(bare), rule)


def _epub(path, html, ident="id-1", nav="<navPoint id='n1'/>"):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("toc.ncx", f"<ncx>\n{nav}\n<docTitle>Book</docTitle>\n</ncx>")
        z.writestr(
            "content.opf",
            f"<package>\n<dc:identifier>{ident}</dc:identifier>\n<dc:title>T</dc:title>\n</package>",
        )
        z.writestr("ch1.html", html)
    return str(path)


def test_compare_epub_ignores_identifiers_nav_points_and_line_breaks(tmp_path):
    gold = _epub(tmp_path / "g.epub", "<html><body><p>One</p><p>Two</p></body></html>")
    same = _epub(
        tmp_path / "s.epub", "<html>\n<body><p>One</p>\n<p>Two</p></body></html>", "id-2", "<navPoint/>"
    )
    assert M["compare_epub"](same, gold) == 1.0
    other = _epub(tmp_path / "o.epub", "<html><body><p>One</p><p>Three</p></body></html>")
    assert 0.0 < M["compare_epub"](other, gold) < 1.0
    assert M["compare_epub"](None, gold) == 0.0


def _wav(path, signal, rate=22050):
    from scipy.io import wavfile

    wavfile.write(path, rate, (np.clip(signal, -1, 1) * 32767).astype(np.int16))
    return str(path)


def test_compare_audios_scores_one_for_the_same_sound_and_less_for_another(tmp_path):
    t = np.arange(22050) / 22050
    a = _wav(tmp_path / "a.wav", 0.5 * np.sin(2 * np.pi * 440 * t))
    b = _wav(tmp_path / "b.wav", 0.5 * np.sign(np.sin(2 * np.pi * 97 * t)))
    assert M["compare_audios"](a, a) == pytest.approx(1.0)
    assert M["compare_audios"](a, b) < 0.5
    assert M["compare_audios"](None, a) == 0.0


def _without_module(monkeypatch, name):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a, **k: None if n == name else real(n, *a, **k)
    )


def _ffmpeg(*args):
    import subprocess

    subprocess.run(["ffmpeg", "-v", "error", "-y", *map(str, args)], check=True, timeout=120)


def test_compare_audios_without_librosa_or_fastdtw_says_which(tmp_path, monkeypatch):
    a = _wav(tmp_path / "a.wav", np.zeros(2205))
    for module, package in (("librosa", "librosa"), ("fastdtw", "fastdtw")):
        with monkeypatch.context() as m:
            _without_module(m, module)
            with pytest.raises(RuntimeError, match=f"needs {package}"):
                M["compare_audios"](a, a)
            assert f"pip install {package}" in blocker("compare_audios")
    assert blocker("compare_audios") is None


def test_compare_audios_equals_librosa_mfcc_and_fastdtw_computed_directly(tmp_path):
    # the official pipeline, step by step: load, MFCC, row-normalise, FastDTW with cosine distance
    import librosa
    from fastdtw import fastdtw
    from scipy.spatial.distance import cosine

    t = np.arange(22050) / 22050
    a = _wav(tmp_path / "a.wav", 0.5 * np.sin(2 * np.pi * 440 * t) * t)
    b = _wav(tmp_path / "b.wav", 0.5 * np.sin(2 * np.pi * 660 * t), rate=16000)  # resampled on load
    feats = [
        librosa.util.normalize(librosa.feature.mfcc(y=y, sr=sr), axis=1)
        for y, sr in map(librosa.load, (a, b))
    ]
    distance = fastdtw(feats[0].T, feats[1].T, dist=lambda x, y: cosine(x, y))[0]
    assert M["compare_audios"](a, b) == 1.0 / (1.0 + distance) and 0 < distance


@pytest.mark.skipif(not shutil.which("ffmpeg"), reason="needs ffmpeg (apt) to make the MP3s")
def test_compare_audios_reads_mp3_stereo_at_its_own_rate_like_the_wav_of_the_same_sound(tmp_path):
    t = np.arange(44100) / 44100
    tone = 0.5 * np.sin(2 * np.pi * 440 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2  # a swelling tone
    other = 0.5 * np.sign(np.sin(2 * np.pi * 97 * t))
    wav_tone, wav_other = _wav(tmp_path / "t.wav", tone, 44100), _wav(tmp_path / "o.wav", other, 44100)
    _ffmpeg("-i", wav_tone, "-ac", "2", "-b:a", "192k", tmp_path / "t.mp3")  # stereo MP3 at 44.1 kHz
    _ffmpeg("-i", wav_other, "-b:a", "192k", tmp_path / "o.mp3")
    mp3_tone, mp3_other = str(tmp_path / "t.mp3"), str(tmp_path / "o.mp3")
    same = M["compare_audios"](mp3_tone, wav_tone)
    assert same > 0.5 and same > 3 * M["compare_audios"](mp3_tone, mp3_other)
    assert M["compare_audios"](mp3_tone, mp3_tone) == pytest.approx(1.0)
    with pytest.raises(Exception):  # noqa: B017 - a file librosa cannot load raises, as OSWorld's does
        M["compare_audios"](str(tmp_path / "missing.mp3"), mp3_tone)


def _video(tmp_path, name, n, change_from=None, size=(64, 96)):
    """A lossless MP4 of ``n`` frames: a bar growing frame by frame, inverted from ``change_from``."""
    d = tmp_path / name
    d.mkdir()
    for i in range(n):
        img = np.zeros((*size, 3), np.uint8)
        img[:, : 8 + 4 * i] = (255, 40, 0)
        if change_from is not None and i >= change_from:
            img = 255 - img
        Image.fromarray(img).save(d / f"{i:03d}.png")
    out = tmp_path / f"{name}.mp4"
    _ffmpeg("-framerate", 10, "-i", d / "%03d.png", "-c:v", "libx264", "-qp", 0, "-pix_fmt", "yuv444p", out)
    return str(out)


@pytest.mark.skipif(not shutil.which("ffmpeg"), reason="needs ffmpeg (apt) to make the MP4s")
def test_compare_videos_counts_frame_hash_mismatches_in_mp4s(tmp_path):
    gold = _video(tmp_path, "g", 12)
    assert M["compare_videos"](gold, _video(tmp_path, "same", 12)) == 1.0
    assert M["compare_videos"](_video(tmp_path, "short", 11), gold) == 0.0  # one ended first
    assert M["compare_videos"](_video(tmp_path, "inv", 12, change_from=2), gold) == 0.0  # 10 mismatches > 5
    assert M["compare_videos"](_video(tmp_path, "few", 12, change_from=8), gold) == 1.0  # 4 mismatches <= 5
    assert (
        M["compare_videos"](_video(tmp_path, "long", 14), gold, max_frames_to_check=12) == 1.0
    )  # no further
    assert M["compare_videos"](None, gold) == 0.0


def test_compare_videos_without_opencv_or_imagehash_says_which(tmp_path, monkeypatch):
    for module, package in (("cv2", "opencv-python-headless"), ("imagehash", "imagehash")):
        with monkeypatch.context() as m:
            _without_module(m, module)
            with pytest.raises(RuntimeError, match=f"needs {package}"):
                M["compare_videos"](str(tmp_path / "v.mp4"), str(tmp_path / "w.mp4"))
            assert f"pip install {package}" in blocker("compare_videos")


# --- Chrome and HTML -----------------------------------------------------------------------------


def test_installed_extensions_search_query_and_cart():
    assert M["is_expected_installed_extensions"](["A", "B", "C"], {"expected": ["A", "C"]}) == 1.0
    assert M["is_expected_installed_extensions"](["A"], {"expected": ["A", "C"]}) == 0.0
    rule = {"expect": {"pattern": r"www\.google\.com.*?/search\?q=Nereida&"}}
    assert M["is_expected_search_query"]({"url": "https://www.google.com/search?q=Nereida&x=1"}, rule) == 1.0
    assert M["is_expected_search_query"]({"url": "https://www.google.com/search?q=Nereida"}, rule) == 0.0
    cart = {"content": "Your cart: The Dota 2 Official Soundtrack"}
    assert M["is_added_to_steam_cart"](cart, {"items": ["The Dota 2 Official Soundtrack"]}) == 1.0
    assert M["is_added_to_steam_cart"](cart, {"items": ["Portal"]}) == 0.0


def test_compare_htmls_compares_tags_text_attributes_and_stops_at_the_shorter(tmp_path):
    gold = write(tmp_path / "g.html", "<html><body><p class='a b'>Hi</p><p>There</p></body></html>")
    assert (
        M["compare_htmls"](
            write(tmp_path / "s.html", "<html><body><p class='a  b'>Hi</p><p>There</p></body></html>"), gold
        )
        == 1.0
    )
    assert (
        M["compare_htmls"](
            write(tmp_path / "t.html", "<html><body><p class='a b'>Ho</p><p>There</p></body></html>"), gold
        )
        == 0.0
    )
    assert (
        M["compare_htmls"](
            write(tmp_path / "c.html", "<html><body><p class='b a'>Hi</p><p>There</p></body></html>"), gold
        )
        == 0.0
    )
    assert (
        M["compare_htmls"](
            write(tmp_path / "i.html", "<html><body><p id='x' class='a b'>Hi</p><p>There</p></body></html>"),
            gold,
        )
        == 0.0
    )
    # a document whose nodes are a prefix of the other's, node by node, passes (zip stops early)
    prefix = write(tmp_path / "p.html", "<html><body><p class='a b'>Hi</p></body></html>")
    assert M["compare_htmls"](prefix, gold) == 0.0  # <body>'s text differs ("Hi" vs "HiThere")


def test_compare_archive_scores_each_file_with_the_file_type_metric(tmp_path):
    def archive(name, files):
        d = tmp_path / (name + "_src")
        (d / "slides").mkdir(parents=True)
        for k, v in files.items():
            (d / "slides" / k).write_text(v)
        return shutil.make_archive(str(tmp_path / name), "zip", d)

    gold = archive("gold", {"a.txt": "one", "b.txt": "two"})
    opts = {"file_path": "slides", "file_type": "text"}
    assert M["compare_archive"](archive("same", {"a.txt": "one", "b.txt": "two"}), gold, **opts) == 1.0
    assert M["compare_archive"](archive("half", {"a.txt": "one", "b.txt": "2"}), gold, **opts) == 0.5
    assert M["compare_archive"](archive("names", {"a.txt": "one", "c.txt": "two"}), gold, **opts) == 0.0
    assert M["compare_archive"](None, gold, **opts) == 0.0
    with pytest.raises(ValueError):
        M["compare_archive"](gold, gold, file_path="slides", file_type="rar")


# --- documents -------------------------------------------------------------------------------------


def docx(path, paragraphs):
    doc = Document()
    for p in paragraphs:
        doc.add_paragraph(p)
    doc.save(path)
    return str(path)


def test_compare_docx_files_and_ignore_new_lines(tmp_path):
    gold = docx(tmp_path / "g.docx", ["A b", "C"])
    spaced = docx(tmp_path / "s.docx", ["A  b", "", "C"])
    assert M["compare_docx_files_and_ignore_new_lines"](spaced, gold) == 1.0  # ignore_blanks default
    assert M["compare_docx_files_and_ignore_new_lines"](spaced, gold, ignore_blanks=False) == 0.0
    blank_lines = docx(tmp_path / "b.docx", ["A b", "", "", "C"])
    assert M["compare_docx_files_and_ignore_new_lines"](blank_lines, gold, ignore_blanks=False) == 1.0
    assert M["compare_docx_files_and_ignore_new_lines"](str(tmp_path / "g.odt"), gold) == 0.0


def test_compare_highlighted_text_compares_sets_of_highlighted_runs(tmp_path):
    def doc(name, marks):
        d = Document()
        p = d.add_paragraph()
        for text, colour in marks:
            p.add_run(text).font.highlight_color = colour
        d.save(tmp_path / name)
        return str(tmp_path / name)

    gold = doc("g.docx", [("alpha", WD_COLOR_INDEX.YELLOW), (" mid ", None), ("beta", WD_COLOR_INDEX.YELLOW)])
    swapped = doc(
        "s.docx", [("beta", WD_COLOR_INDEX.BRIGHT_GREEN), (" mid ", None), ("alpha", WD_COLOR_INDEX.YELLOW)]
    )
    assert M["compare_highlighted_text"](swapped, gold) == 1.0  # a set: order and colour ignored
    assert M["compare_highlighted_text"](doc("m.docx", [("alpha", WD_COLOR_INDEX.YELLOW)]), gold) == 0.0


def test_compare_insert_equation_needs_an_object_in_both(tmp_path):
    def doc(name, with_object):
        d = Document()
        run = d.add_paragraph().add_run("x = 1")
        if with_object:
            run._r.append(
                parse_xml(
                    '<w:object xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"/>'
                )
            )
        d.save(tmp_path / name)
        return str(tmp_path / name)

    gold = doc("g.docx", True)
    assert M["compare_insert_equation"](doc("a.docx", True), gold) == 1.0
    assert M["compare_insert_equation"](doc("b.docx", False), gold) == 0.0


def test_compare_references_rescales_the_mean_similarity(tmp_path):
    gold = docx(tmp_path / "g.docx", ["Body", "References", "Smith 2020. A title.", "Doe 2019. B."])
    assert (
        M["compare_references"](
            docx(tmp_path / "s.docx", ["Other", "References", "Smith 2020. A title.", "", "Doe 2019. B."]),
            gold,
        )
        == 1.0
    )
    close = docx(tmp_path / "c.docx", ["References", "Smith 2020. A titel.", "Doe 2019. B."])
    score = M["compare_references"](close, gold, reference_base_result=0.5)
    mean = (fuzz_ratio("Smith 2020. A titel.", "Smith 2020. A title.") / 100 + 1) / 2
    assert score == pytest.approx((mean - 0.5) / 0.5)
    assert M["compare_references"](docx(tmp_path / "n.docx", ["no heading"]), gold) == 0.0
    assert M["compare_references"](docx(tmp_path / "x.docx", ["x"]), docx(tmp_path / "y.docx", ["y"])) == 1.0
    assert (
        M["compare_references"](docx(tmp_path / "one.docx", ["References", "Smith"]), gold) == 0.0
    )  # counts


def test_compare_image_text_reports_its_missing_ocr(tmp_path):
    if blocker("compare_image_text") is None:
        pytest.skip("easyocr is installed")
    img = tmp_path / "i.png"
    Image.new("RGB", (10, 10)).save(img)
    with pytest.raises(RuntimeError, match="easyocr"):
        M["compare_image_text"](str(img), {"type": "text", "text": "Ls"})


def test_fuzz_ratio_is_the_exact_indel_similarity():
    assert lcs_length("kitten", "sitting") == 4
    assert fuzz_ratio("kitten", "sitting") == pytest.approx(100 * 8 / 13)
    assert fuzz_ratio("", "") == 100.0 and fuzz_ratio("a", "") == 0.0


# --- text files, spreadsheets, images, slides ------------------------------------------------------


def test_file_contains_and_check_line_number(tmp_path):
    report = write(tmp_path / "r.txt", "CPU %user %idle\n10:00:01 x\n10:00:02 y\n25:00:00 z\n")
    assert M["file_contains"](report, {"expected": ["CPU", "%idle"]}) == 1.0
    assert M["file_contains"](report, {"expected": ["%steal"]}) == 0.0
    assert M["check_line_number"](report, {"expected": "2"}) == 1.0  # 25:00:00 is no time of day
    assert M["check_line_number"](str(tmp_path / "missing"), {"expected": "2"}) == 0.0


def test_compare_python_pure_text_ignores_all_whitespace(tmp_path):
    gold = write(tmp_path / "g.py", "def f(x):\n    return x\n")
    assert M["compare_python_pure_text"](write(tmp_path / "a.py", "def f(x):\n\treturn  x"), gold) == 1.0
    assert M["compare_python_pure_text"](write(tmp_path / "b.py", "def f(y):\n    return y\n"), gold) == 0.0


def test_compare_time_in_speedtest_results_uses_the_clock_time(tmp_path):
    now = dt.datetime.now().strftime("%H:%M")
    assert (
        M["compare_time_in_speedtest_results"](
            write(tmp_path / "a.csv", f"h,date,down\n1,2024-01-01 {now},93\n"), "60"
        )
        == 1.0
    )
    far = (dt.datetime.now() + dt.timedelta(hours=3)).strftime("%H:%M")
    assert (
        M["compare_time_in_speedtest_results"](
            write(tmp_path / "b.csv", f"h,date,down\n1,2024-01-01 {far},93\n"), "60"
        )
        == 0.0
    )
    assert M["compare_time_in_speedtest_results"](write(tmp_path / "c.csv", "h\n"), "60") == 0.0
    # the date as the last field keeps its newline in OSWorld's slice: never parsed, 0
    last = write(tmp_path / "d.csv", f"h,date\n1,2024-01-01 {now}\n")
    assert M["compare_time_in_speedtest_results"](last, "60") == 0.0


def test_fuzzy_place_math_needs_exactly_three_words(tmp_path):
    rule = {"expected": ["alpha", "beta", "gamma"]}
    assert M["fuzzy_place_math"](docx(tmp_path / "a.docx", ["alpha", "beta gamma"]), rule) == 1.0
    assert M["fuzzy_place_math"](docx(tmp_path / "b.docx", ["alpha beta"]), rule) == 0.0
    part = M["fuzzy_place_math"](docx(tmp_path / "c.docx", ["alpha beta gamme"]), rule)
    assert part == pytest.approx((1 + 1 + 0.8) / 3)


def test_compare_conference_city_in_order(tmp_path):
    cities = ["Scottsdale", "Montréal"] + [f"C{i}" for i in range(19)]
    wb = openpyxl.Workbook()
    for i, c in enumerate(cities, 2):
        wb.active[f"C{i}"] = c + ", somewhere"
    wb.save(tmp_path / "c.xlsx")
    rule = {"expected": ["Scottsdale", ["Montreal", "Montréal"]] + [f"C{i}" for i in range(19)]}
    assert M["compare_conference_city_in_order"](str(tmp_path / "c.xlsx"), rule) == 1.0
    assert (
        M["compare_conference_city_in_order"](str(tmp_path / "c.xlsx"), {"expected": rule["expected"][:20]})
        == 0.0
    )
    wb.active["C5"] = None
    wb.save(tmp_path / "d.xlsx")
    assert M["compare_conference_city_in_order"](str(tmp_path / "d.xlsx"), rule) == 0.0


def test_check_image_file_size_and_check_sharper(tmp_path):
    rng = np.random.default_rng(1)
    sharp = Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))
    sharp.save(tmp_path / "s.png")
    sharp.filter(ImageFilter.GaussianBlur(2)).save(tmp_path / "b.png")
    size = (tmp_path / "s.png").stat().st_size
    assert M["check_image_file_size"](str(tmp_path / "s.png"), {"max_size": size + 1}) == 1.0
    assert M["check_image_file_size"](str(tmp_path / "s.png"), {"max_size": size}) == 0.0  # strictly below
    assert M["check_sharper"](str(tmp_path / "s.png"), str(tmp_path / "b.png")) == 1.0
    assert M["check_sharper"](str(tmp_path / "b.png"), str(tmp_path / "s.png")) == 0.0


def test_laplacian_matches_a_hand_computed_value(tmp_path):
    from rz_agents.envs.osworld.metrics.images import laplacian_variance

    img = np.zeros((3, 3, 3), np.uint8)
    img[1, 1] = 255  # grey 255 at the centre; reflect-101 borders mirror it onto the edge centres
    Image.fromarray(img).save(tmp_path / "p.png")
    lap = np.array([[0, 510, 0], [510, -1020, 510], [0, 510, 0]], float)
    assert laplacian_variance(str(tmp_path / "p.png")) == pytest.approx(float(np.var(lap)))


def test_contains_mp4_video_finds_an_embedded_video(tmp_path):
    from pptx import Presentation
    from pptx.util import Inches

    prs = Presentation()
    prs.slides.add_slide(prs.slide_layouts[6])
    prs.save(tmp_path / "none.pptx")
    assert M["contains_mp4_video"](str(tmp_path / "none.pptx")) == 0.0
    video = tmp_path / "v.mp4"
    video.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64)
    slide = prs.slides[0]
    slide.shapes.add_movie(str(video), Inches(1), Inches(1), Inches(2), Inches(2), mime_type="video/mp4")
    prs.save(tmp_path / "video.pptx")
    assert M["contains_mp4_video"](str(tmp_path / "video.pptx")) == 1.0
