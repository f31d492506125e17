"""Numbers and nested values as HTML: rounded numbers, dicts as tables, lists as rows of numbers."""

from __future__ import annotations

import html
import math
from typing import Any


def fmt_number(value: Any, digits: int = 4) -> str:
    """A readable number: ``digits`` significant digits, thousands separators for large values."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return html.escape(str(value))
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value != 0 and abs(value) >= 10**digits:
        return f"{value:,.0f}"
    if value != 0 and abs(value) < 1e-3:
        return f"{value:.{max(digits - 2, 1)}e}"
    return f"{value:.{digits}g}"


def value_html(value: Any) -> str:
    """``value`` as HTML: a dict becomes a nested table, a list of numbers one line, a number rounded."""
    if isinstance(value, dict):
        if not value:
            return "—"
        rows = "".join(
            f"<tr><th>{html.escape(str(k))}</th><td>{value_html(v)}</td></tr>" for k, v in value.items()
        )
        return f"<table>{rows}</table>"
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return ", ".join(fmt_number(v) for v in value) or "—"
        return "<br>".join(value_html(v) for v in value) or "—"
    return fmt_number(value)
