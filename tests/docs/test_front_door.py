"""The README stays a front door: short, with its two commands, and every link in it and in docs/ resolves."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_at_most_150_lines_and_keeps_its_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "bash scripts/demo.sh" in text and "bash scripts/test.sh" in text
    assert (ROOT / "scripts" / "demo.sh").exists() and (ROOT / "scripts" / "test.sh").exists()


def test_every_relative_link_in_the_readme_and_docs_resolves():
    broken = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_the_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    missing = [
        p.name
        for p in (ROOT / "docs").glob("*.md")
        if p.name != "README.md" and f"]({p.name})" not in index
    ]
    assert missing == []
