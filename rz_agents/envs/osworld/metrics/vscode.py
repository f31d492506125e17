"""VS Code and code-task metrics: settings text, extensions listed, zip archives, test suites, results.

Semantics follow OSWorld's ``metrics/vscode.py`` (commit 8942695); a missing result scores 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from typing import Any

from rz_agents.envs.osworld.metrics.general import read_text
from rz_agents.envs.osworld.metrics.libraries import missing, require

TEST_SUITE_TIMEOUT_S = 120


def compare_config(actual: str | None, rules: dict[str, Any], **_: Any) -> float:
    """1 when the file's whole text equals ``rules["expected"]`` (no normalisation at all)."""
    if not actual:
        return 0.0
    with open(actual) as f:
        return float(f.read() == rules["expected"])


def compare_answer(actual: str | None, rules: dict[str, Any], **_: Any) -> float:
    """1 when the result string equals ``rules["expected"]``."""
    if not actual:
        return 0.0
    return float(actual == rules["expected"])


def is_extension_installed(actual: Any, rules: dict[str, Any], **_: Any) -> float:
    """``contain``: ``rules["expected"]`` occurs in the command output; ``not_contain``: it does not.

    As OSWorld there is no guard for a missing output: ``None`` raises (scored 0 by the evaluator).
    """
    if rules["type"] == "contain":
        return float(rules["expected"] in actual)
    if rules["type"] == "not_contain":
        return float(rules["expected"] not in actual)
    raise ValueError(f"is_extension_installed: rule type {rules['type']!r} not supported")


_PYPDF2 = missing(("PyPDF2", "PyPDF2"))


def _pdf_text(data: bytes) -> str:
    """OSWorld's text of a PDF inside an archive: PyPDF2's, every page's, concatenated."""
    import io

    import PyPDF2

    return "".join(page.extract_text() for page in PyPDF2.PdfReader(io.BytesIO(data)).pages)


def compare_zip_files(actual: str | None, expected: str, **_: Any) -> float:
    """1 when both archives list the same names and each member matches.

    PDFs match when their texts' difflib ratio is >= 0.95 (OSWorld: PyPDF2 text, SequenceMatcher);
    other members must be byte-equal.
    """
    if not actual:
        return 0.0
    require(_PYPDF2, "compare_zip_files")
    import difflib

    with zipfile.ZipFile(actual) as z1, zipfile.ZipFile(expected) as z2:
        names = set(z1.namelist())
        if names != set(z2.namelist()):
            return 0.0
        for name in names:
            a, b = z1.read(name), z2.read(name)
            if name.lower().endswith(".pdf"):
                if difflib.SequenceMatcher(None, _pdf_text(a), _pdf_text(b)).ratio() < 0.95:
                    return 0.0
            elif a != b:
                return 0.0
    return 1.0


def check_python_file_by_test_suite(actual_files: Any, test_file: str | None, **options: Any) -> float:
    """1 when the test file's ``test_function_name`` (default ``test``) returns a truthy value.

    OSWorld imports the test file into the evaluator and calls the function; here it runs in a
    child interpreter (``-I -B``: no bytecode caches left behind, cwd = the test file's folder, the result
    files' folders first on ``sys.path``), limited to ``TEST_SUITE_TIMEOUT_S``; an exception, a falsy return
    or a timeout scores 0. The code is the task's test and the agent's files: it runs on the evaluating host.
    A test file that cannot be loaded raises, as in OSWorld.
    """
    if not test_file or not os.path.isfile(test_file):
        raise FileNotFoundError(f"check_python_file_by_test_suite: no test file {test_file!r}")
    name = options.get("test_function_name", "test")
    files = actual_files if isinstance(actual_files, list) else [actual_files]
    paths = [os.path.dirname(os.path.abspath(f)) for f in files if f] + [os.path.dirname(test_file)]
    runner = (
        "import importlib.util, sys\n"
        "sys.path[:0] = sys.argv[3:]\n"
        "spec = importlib.util.spec_from_file_location('dynamic_module', sys.argv[1])\n"
        "mod = importlib.util.module_from_spec(spec); sys.modules['dynamic_module'] = mod\n"
        "try:\n    spec.loader.exec_module(mod)\nexcept BaseException as e:\n"
        "    print('LOAD-ERROR', repr(e)); sys.exit(3)\n"
        "fn = getattr(mod, sys.argv[2])\n"
        "try:\n    ok = bool(fn())\nexcept Exception:\n    ok = False\n"
        "print('RESULT', ok)\n"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-B", "-c", runner, test_file, name, *dict.fromkeys(paths)],
            cwd=os.path.dirname(test_file),
            capture_output=True,
            text=True,
            timeout=TEST_SUITE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return 0.0
    if proc.returncode == 3 or "RESULT" not in proc.stdout:
        raise RuntimeError(
            f"check_python_file_by_test_suite: the test file did not load: {proc.stdout[-300:]}"
        )
    return float(proc.stdout.strip().endswith("RESULT True"))


def check_html_background_image(src_path: str | None, rule: dict[str, Any] | None = None, **_: Any) -> float:
    """1 when some ``<style>`` block contains ``background-image: url('<value>')`` verbatim."""
    if not src_path:
        return 0.0
    import lxml.html

    with open(src_path) as f:
        doc = lxml.html.document_fromstring(f.read())
    want = f"background-image: url('{rule['value']}')"
    return float(any(want in style.text_content() for style in doc.iter("style")))


def compare_result_files(src_path: str | None, tgt_path: str | None, **_: Any) -> float:
    """1 when the stripped texts are equal, or (gold a number) the gold text occurs in the result or
    the two numbers are within 1e-4."""
    if not src_path or not tgt_path:
        return 0.0
    src, tgt = read_text(src_path), read_text(tgt_path)
    src, tgt = (src or "").strip(), (tgt or "").strip()
    try:
        gold = float(tgt)
        if tgt in src:
            return 1.0
        return float(abs(float(src) - gold) < 1e-4)
    except ValueError:
        return float(src == tgt)


BLOCKERS: dict[str, Callable[[], str | None]] = {"compare_zip_files": _PYPDF2}

METRICS: dict[str, Callable[..., float]] = {
    "compare_config": compare_config,
    "compare_answer": compare_answer,
    "is_extension_installed": is_extension_installed,
    "compare_zip_files": compare_zip_files,
    "check_python_file_by_test_suite": check_python_file_by_test_suite,
    "check_html_background_image": check_html_background_image,
    "compare_result_files": compare_result_files,
}
