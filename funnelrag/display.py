"""How values are shown to a person: one formatter for summaries, tables and progress lines."""
from __future__ import annotations

from typing import Any


def format_value(v: Any) -> str:
    """A value as printed in a table, summary or progress line: ``–`` for none, floats to 4
    significant digits, whole-numbered floats (counts: MLflow keeps every metric as a float) and
    floats from 1e5 up as integers with thousands separators, ints with thousands separators,
    anything else as ``str``."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1e5 or (v.is_integer() and abs(v) >= 1) else f"{v:.4g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)
