"""Plain-text columns for the command line's tables (a report's Markdown has its own)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

__all__ = ["did_you_mean", "table"]


def table(rows: Sequence[Sequence[str]], indent: str = "  ") -> str:
    """Left-aligned columns two spaces apart, each line indented; the last column is not
    padded and no line ends in spaces."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(map(len, rows)))]
    lines = []
    for r in rows:
        cells = [c.ljust(widths[i]) for i, c in enumerate(r[:-1])] + [r[-1]]
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines) + "\n"


def did_you_mean(name: str, known: Sequence[str]) -> str:
    """"; did you mean 'x'?" naming the nearest of ``known`` to a misspelt ``name``, or ""."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
