"""docs/results.md cites only figures and result files that are committed."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "results.md"


def test_every_figure_the_results_page_shows_is_committed():
    figures = re.findall(r"\]\((img/[^)]+\.png)\)", DOC.read_text())
    assert len(figures) >= 4
    missing = [f for f in figures if not (DOC.parent / f).is_file()]
    assert not missing, f"docs/results.md shows figures that do not exist: {missing}"


def test_every_result_file_the_results_page_names_is_committed():
    # Backticked paths relative to experiments/results/, e.g. `mismatch/part_a.json`.
    named = re.findall(r"`([a-z0-9_.\-]+/[A-Za-z0-9_.\-]+\.(?:json|jsonl|csv|md))`", DOC.read_text())
    assert len(named) >= 4
    missing = [n for n in named if not (REPO / "experiments" / "results" / n).is_file()]
    assert not missing, f"docs/results.md names result files that do not exist: {missing}"
