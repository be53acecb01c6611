"""Plain-text columns for the command line's tables (a report's Markdown has its own)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["table"]


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
