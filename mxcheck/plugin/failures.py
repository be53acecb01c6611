"""What a failing conformance check prints: its verdict, not pytest's traceback of mxcheck's
own check code. A check's :class:`~mxcheck.outcome.NumericsError` already says what differs,
where and why; the frames around it (echoed source and locals of the suite and the checks)
are noise to a kernel engineer. ``--mxcheck-full-trace`` (``mxcheck conform --full-trace``)
keeps pytest's report.
"""

from __future__ import annotations

from typing import Any

import pytest

from mxcheck.outcome import NumericsError

__all__ = ["COUNTS_KEPT", "MAX_VERDICT_LINES", "SEE_MORE", "is_conformance_test", "short_report", "verdict_text"]

# The verdict's head (lost-tensor line, counts, causes) comes first and its blocks after: the
# first lines carry the finding, and 60 of them hold the head and a few blocks of each field.
MAX_VERDICT_LINES = 60
COUNTS_KEPT = 8  # differing-field counts shown ahead of the cause
SEE_MORE = ("more: the full trace with --full-trace (mxcheck conform) or --mxcheck-full-trace (pytest); "
            "every differing block with --dump DIR (--mxcheck-dump DIR)")


def is_conformance_test(item: pytest.Item) -> bool:
    """A test of the installed conformance suite: one parametrized by a backend's claim."""
    return "claim" in getattr(item, "fixturenames", ())


def verdict_text(excinfo: pytest.ExceptionInfo[BaseException]) -> str | None:
    """The failure as the check's verdict, at most MAX_VERDICT_LINES + 2 lines; None where
    pytest's own report is already short (``pytest.fail(..., pytrace=False)``).

    A NumericsError is the check's verdict: its message alone. Anything else (the backend
    raised, or mxcheck did) keeps the frames in pytest's short style, the last ones: where
    it was raised and what."""
    exc = excinfo.value
    if isinstance(exc, pytest.fail.Exception) and not exc.pytrace:
        return None
    if isinstance(exc, NumericsError):
        lines = _counts_elided(str(exc).splitlines())
        kept, dropped = lines[:MAX_VERDICT_LINES], lines[MAX_VERDICT_LINES:]
        tail = [f"... {len(dropped):,} more lines of differing blocks"] if dropped else []
    else:
        lines = str(excinfo.getrepr(style="short", chain=True)).splitlines()
        kept, dropped = lines[-MAX_VERDICT_LINES:], lines[:-MAX_VERDICT_LINES]
        tail = []
        if dropped:
            kept = [f"... {len(dropped):,} earlier lines of the traceback", *kept]
    return "\n".join([*kept, *tail, SEE_MORE])


def _counts_elided(lines: list[str]) -> list[str]:
    """The verdict with its list of differing-field counts (the indented lines between the
    head and ``cause:``) cut to COUNTS_KEPT: a kernel wrong on every input lists a count for
    each of its 60-odd comparisons, which would push the cause out of the lines kept. Each
    comparison's count is repeated with its cause further down."""
    if "cause:" not in lines:
        return lines
    cause = lines.index("cause:")
    counts = [i for i in range(cause) if lines[i].startswith("  ")]
    if len(counts) <= COUNTS_KEPT:
        return lines
    cut = counts[COUNTS_KEPT:]
    dropped = set(cut)
    note = f"  ... {len(cut):,} more differing fields (each comparison's count follows its cause below)"
    return [*lines[:cut[0]], note, *(line for i, line in enumerate(lines) if i > cut[0] and i not in dropped)]


def short_report(item: pytest.Item, call: pytest.CallInfo[Any], report: pytest.TestReport) -> None:
    """Replace a failing conformance test's long report by its verdict, unless the run asked
    for the full trace."""
    if not (report.failed and call.excinfo is not None and is_conformance_test(item)):
        return
    if item.config.getoption("mxcheck_full_trace", False):
        return
    text = verdict_text(call.excinfo)
    if text is not None:
        report.longrepr = text
