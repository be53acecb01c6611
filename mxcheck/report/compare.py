"""What moved between two reports, and whether any of it is a regression.

Records match on (test_id, layer, direction, backend, recipe, kind): kind is part of the
match because one test may record an SNR and a bitwise check for the same GEMM.

A check the base has and the new report lacks is "not run": listed, never counted as passing.
A report of a run that did not finish (``Report.complete`` false) is refused as a base unless
the caller allows it: every check it never ran would read as "new" in the next report.

A regression is any of: the SNR dropped by more than ``max_drop_db``, a check that
passed now fails, a result that was bit-equal no longer is. SNR arithmetic follows the
values' meaning: Inf (bit-exact against truth) falling to any finite value is an
infinite drop, and a NaN SNR (no signal, e.g. an all-zero gradient) where there was a
number is a regression whatever the margin.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from mxcheck.report.schema import Record, Report, ReportError

__all__ = [
    "DEFAULT_MAX_DROP_DB",
    "NOT_RUN",
    "Change",
    "Comparison",
    "compare",
    "compare_files",
    "describe",
    "format_comparison",
    "match_key",
    "require_complete",
    "snr_drop_db",
]

# A drop smaller than this is noise from a new seed or a new library version, not a
# regression; the CLI and the Markdown baseline column use it unless told otherwise.
DEFAULT_MAX_DROP_DB = 0.5
NOT_RUN = "not run"  # what a check in the base and missing from the new report is called
ALLOW_INCOMPLETE_HINT = "pass --allow-incomplete-baseline to compare against it anyway"


def require_complete(base: Report, source: str, hint: str = ALLOW_INCOMPLETE_HINT) -> None:
    """ReportError naming ``source`` and why, if ``base`` comes from a run that did not finish."""
    if not base.complete:
        raise ReportError(f"{source}: the base report is incomplete "
                          f"({base.incomplete_reason or 'no reason recorded'}): a baseline "
                          f"must come from a run that finished; {hint}")


def match_key(record: Record) -> tuple[str, ...]:
    """The identity of a check across runs: its key plus its kind."""
    return (*record.key, record.kind)


def snr_drop_db(base: float | None, new: float | None) -> float | None:
    """How far the SNR fell (positive) or rose (negative); None where either is missing."""
    if base is None or new is None:
        return None
    if math.isnan(new):
        return None if math.isnan(base) else math.inf  # lost its signal: always a drop
    if math.isnan(base):
        return -math.inf  # gained a signal
    drop = base - new
    return 0.0 if math.isnan(drop) else drop  # inf - inf: unchanged


@dataclass(frozen=True)
class Change:
    """One record present in both reports, with the reasons it counts as moved."""

    base: Record
    new: Record
    reasons: tuple[str, ...]

    @property
    def drop_db(self) -> float | None:
        return snr_drop_db(self.base.snr_db, self.new.snr_db)


@dataclass
class Comparison:
    """The result of ``compare``: every record is in exactly one bucket."""

    max_drop_db: float
    regressions: list[Change] = field(default_factory=list)
    improvements: list[Change] = field(default_factory=list)
    added: list[Record] = field(default_factory=list)
    removed: list[Record] = field(default_factory=list)
    unchanged: list[Change] = field(default_factory=list)  # matched, moved within the margin
    environment: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # key -> (base, new)
    incomplete: str = ""  # why the new report's run did not finish; "" when it did

    @property
    def ok(self) -> bool:
        """No regression. Added and not-run (removed) checks are reported but do not fail."""
        return not self.regressions


def _index(report: Report, which: str) -> dict[tuple[str, ...], Record]:
    out: dict[tuple[str, ...], Record] = {}
    for r in report.records:
        key = match_key(r)
        if key in out:
            # Two records with one identity cannot be paired with the other side's.
            raise ValueError(f"{which} report has two records for {key}; each check needs a "
                             "unique (test_id, layer, direction, backend, recipe, kind)")
        out[key] = r
    return out


def _regression_reasons(base: Record, new: Record, max_drop_db: float) -> list[str]:
    reasons = []
    drop = snr_drop_db(base.snr_db, new.snr_db)
    if drop is not None and drop > max_drop_db:
        reasons.append(f"SNR {_db(base.snr_db)} -> {_db(new.snr_db)} dB "
                       f"(drop {_db(drop)} dB > {max_drop_db:g})")
    if base.passed and not new.passed:
        reasons.append("passed -> FAILED")
    if base.bit_equal is True and new.bit_equal is False:
        reasons.append(f"bit-equal -> {_mismatches(new)} differ")
    return reasons


def _improvement_reasons(base: Record, new: Record, max_drop_db: float) -> list[str]:
    reasons = []
    drop = snr_drop_db(base.snr_db, new.snr_db)
    if drop is not None and drop < -max_drop_db:
        reasons.append(f"SNR {_db(base.snr_db)} -> {_db(new.snr_db)} dB (+{_db(-drop)} dB)")
    if not base.passed and new.passed:
        reasons.append("failed -> passed")
    if base.bit_equal is False and new.bit_equal is True:
        reasons.append("now bit-equal")
    return reasons


def compare(base: Report, new: Report, max_drop_db: float = DEFAULT_MAX_DROP_DB) -> Comparison:
    """Match records of two reports and sort each into regressions, improvements, etc."""
    if not (isinstance(max_drop_db, (int, float)) and math.isfinite(max_drop_db)
            and max_drop_db >= 0):
        raise ValueError(f"max_drop_db={max_drop_db!r}; expected a finite number of dB >= 0")
    old, cur = _index(base, "base"), _index(new, "new")
    c = Comparison(max_drop_db=float(max_drop_db),
                   incomplete="" if new.complete else (new.incomplete_reason or "no reason recorded"))
    for key in sorted(old.keys() | cur.keys()):
        if key not in cur:
            c.removed.append(old[key])
        elif key not in old:
            c.added.append(cur[key])
        elif worse := _regression_reasons(old[key], cur[key], max_drop_db):
            c.regressions.append(Change(old[key], cur[key], tuple(worse)))
        elif better := _improvement_reasons(old[key], cur[key], max_drop_db):
            c.improvements.append(Change(old[key], cur[key], tuple(better)))
        else:
            c.unchanged.append(Change(old[key], cur[key], ()))
    for k in sorted(base.environment.keys() | new.environment.keys()):
        if base.environment.get(k) != new.environment.get(k):
            c.environment[k] = (base.environment.get(k), new.environment.get(k))
    return c


def _db(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _mismatches(r: Record) -> str:
    count = "?" if r.mismatches is None else f"{r.mismatches:,}"
    return count if r.total is None else f"{count} of {r.total:,}"


def describe(r: Record) -> str:
    """A one-line name for a check: recipe/backend direction layer [test id] (kind)."""
    parts = [f"{r.recipe}/{r.backend}", r.direction or "", r.layer or ""]
    kind = "" if r.kind == "snr" else f" ({r.kind})"
    return " ".join(p for p in parts if p) + f" [{r.test_id}]{kind}"


def _section(title: str, lines: list[str]) -> list[str]:
    return [f"{title} ({len(lines)}):", *(f"  {line}" for line in lines)] if lines else []


def format_comparison(c: Comparison) -> str:
    """Terminal text: a summary line, then each non-empty bucket, then the verdict."""
    counts = (f"{len(c.regressions)} regressed, {len(c.improvements)} improved, "
              f"{len(c.added)} added, {len(c.removed)} {NOT_RUN}, {len(c.unchanged)} unchanged")
    out = [f"mxcheck compare: {counts} (max drop {c.max_drop_db:g} dB)"]
    out += _section("REGRESSIONS", [f"{describe(ch.new)}: {'; '.join(ch.reasons)}"
                                    for ch in c.regressions])
    out += _section("Improvements", [f"{describe(ch.new)}: {'; '.join(ch.reasons)}"
                                     for ch in c.improvements])
    # A check that is new and already failing does not fail the comparison, but must show.
    out += _section("Added", [f"{describe(r)}: SNR {_db(r.snr_db)} dB"
                              f"{'' if r.passed else ', FAILED'}" for r in c.added])
    out += _section(f"{NOT_RUN.capitalize()} (in the base, missing from this report)",
                    [describe(r) for r in c.removed])
    out += _section("Environment changed", [f"{k}: {a!r} -> {b!r}"
                                            for k, (a, b) in c.environment.items()])
    verdict = "OK" if c.ok else f"FAIL: {len(c.regressions)} regression(s)"
    if c.incomplete:  # an unfinished run's missing checks are unknown, not passing
        verdict += f"; INCOMPLETE: the new report's run did not finish ({c.incomplete})"
    out.append(verdict)
    return "\n".join(out) + "\n"


def compare_files(base_path: str | os.PathLike[str], new_path: str | os.PathLike[str],
                  max_drop_db: float = DEFAULT_MAX_DROP_DB, *,
                  allow_incomplete_baseline: bool = False) -> tuple[int, str]:
    """(exit code, text) for ``mxcheck compare``: 0 no regression, 1 regression or a new
    report whose run did not finish, 2 bad input.

    A file that cannot be read, two records with one identity, or an incomplete base report
    (unless ``allow_incomplete_baseline``) is exit code 2 with the reason as the text, so the
    CLI never shows a traceback for a user's bad file.
    """
    try:
        base = Report.load(base_path)
        if not allow_incomplete_baseline:
            require_complete(base, str(base_path))
        c = compare(base, Report.load(new_path), max_drop_db)
    except (ReportError, ValueError) as e:
        return 2, f"mxcheck compare: error: {e}\n"
    return (0 if c.ok and not c.incomplete else 1), format_comparison(c)
