"""A kernel's values that overflow their dtype where the oracle's do not: a finding with its
own line, ahead of the bit counts (a scale one binade high at the top of float16 turns 65504
into +Inf; counted as one differing value, it would read as a rounding)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["overflow_lines"]


def overflow_lines(diffs: list[Any]) -> list[str]:
    """One line per comparison (a ``ValuesDiff``: operand, label, x, got, want) whose kernel
    values are +-Inf where the oracle's, in the same dtype, are finite; the first such value
    is shown with its input."""
    lines = []
    for d in diffs:
        over = torch.isinf(d.got) & torch.isfinite(d.want)
        if not bool(over.any()):
            continue
        flat = int(over.flatten().nonzero()[0])
        row, col = divmod(flat, d.x.shape[-1])
        x, g, w = (float(t.reshape(-1)[flat]) for t in (d.x, d.got, d.want))
        dtype = str(d.got.dtype).removeprefix("torch.")
        n = int(over.sum())
        lines.append(f"{d.operand} ({d.label}): {n:,} value{'s' * (n != 1)} overflow{'s' * (n == 1)} {dtype} to Inf "
                     f"where the oracle's {'are' if n != 1 else 'is'} finite, the first at [{row}, {col}]: input {x!r}, kernel {g!r} | oracle {w!r}")
    return lines
