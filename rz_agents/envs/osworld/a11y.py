"""Turn the desktop's accessibility XML into the compact text an LLM agent reads.

One line per node with a name or text, tab-separated as in OSWorld's prompts:
``tag  name  text  position (top-left x&y)  size (w&h)``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

HEADER = "tag\tname\ttext\tposition (top-left x&y)\tsize (w&h)"


def linearize(xml: str | None, max_chars: int = 20000) -> str:
    """The linearised tree (cut at ``max_chars`` with a marker); an explanatory line if unparsable."""
    if not xml:
        return "(no accessibility tree)"
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        return f"(accessibility tree unreadable: {exc})"
    lines = [HEADER]
    for node in root.iter():
        name = (node.get("name") or "").replace("\t", " ").replace("\n", " ")
        text = (node.get("text") or "").replace("\t", " ").replace("\n", " ")
        if node.tag == "desktop-frame" or not (name or text):
            continue
        lines.append(f"{node.tag}\t{name}\t{text}\t{node.get('screencoord', '')}\t{node.get('size', '')}")
    out = "\n".join(lines)
    if len(out) > max_chars:
        out = out[:max_chars] + "\n[... accessibility tree truncated]"
    return out
