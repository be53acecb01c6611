"""A report as GitHub-flavoured Markdown for a pull-request comment.

The layout, shared with the HTML page (which imports the row model from here):
a summary line, a baseline line when a baseline is given, then one table per
(recipe, backend) with failures first and then the smallest margin first (the rows a
reviewer should read), then the skipped checks. Long tables fold into
``<details>``; a table with a failure is folded open.

GitHub refuses a comment over 65,536 characters, so ``render_markdown(max_chars=...)`` cuts
rows and list items, least important first, keeping the summary line and every failure that
fits, and says under the summary how many it cut and where the full report is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mxcheck.report.compare import DEFAULT_MAX_DROP_DB, NOT_RUN, Comparison, compare, match_key
from mxcheck.report.outcomes import (
    TEST_OUTCOMES,
    UNJUDGED_OUTCOMES,
    counts_text,
    outcome_of,
    run_status_text,
    skip_summary,
)
from mxcheck.report.schema import Record, Report

__all__ = [
    "COLLAPSE_ROWS",
    "DEFAULT_ARTIFACT",
    "DEFAULT_MAX_CHARS",
    "Row",
    "baseline_summary",
    "bits_text",
    "db_text",
    "environment_line",
    "group_rows",
    "md_escape",
    "render_markdown",
    "shape_text",
    "short_test_id",
    "summary_text",
    "worst",
    "worst_text",
]

COLLAPSE_ROWS = 10  # tables longer than this fold into <details> so the comment stays short
# GitHub refuses a comment body over 65,536 characters; the rest is room for the marker a
# sticky-comment action adds.
DEFAULT_MAX_CHARS = 65_000
DEFAULT_ARTIFACT = "mxcheck-report"  # what a cut comment tells the reader to download


@dataclass(frozen=True)
class Row:
    """A record as a table shows it, with its change against the baseline if one was given."""

    record: Record
    delta_db: float | None = None  # new SNR minus baseline SNR
    status: str = ""  # "" (no baseline), "new", "regressed", "improved", "same"


def _margin_order(r: Record) -> float:
    m = r.margin_db
    if m is None:
        return math.inf  # no SNR to compare: after every measured margin
    return -math.inf if math.isnan(m) else m  # NaN SNR: as bad as it gets


def worst(records: list[Record]) -> Record | None:
    """The record with the smallest margin (a NaN margin counts as smallest), if any has one;
    among equal margins, the first in ``Record.sort_key`` order."""
    measured = [r for r in records if r.margin_db is not None]
    if not measured:
        return None
    low = min(map(_margin_order, measured))
    # sort_key serialises the record: only the ties need it (a cut comment asks for the
    # worst of every table at each of its ~14 trial renders)
    return min((r for r in measured if _margin_order(r) == low), key=Record.sort_key)


def _statuses(c: Comparison | None) -> dict[tuple[str, ...], tuple[float | None, str]]:
    if c is None:
        return {}
    out: dict[tuple[str, ...], tuple[float | None, str]] = {match_key(r): (None, "new")
                                                            for r in c.added}
    for status, changes in (("regressed", c.regressions), ("improved", c.improvements),
                            ("same", c.unchanged)):
        for ch in changes:
            drop = ch.drop_db
            # 0.0 - drop, not -drop: an unchanged SNR should read +0.00, not -0.00.
            out[match_key(ch.new)] = (None if drop is None else 0.0 - drop, status)
    return out


def group_rows(report: Report,
               comparison: Comparison | None = None) -> dict[tuple[str, str], list[Row]]:
    """{(recipe, backend): rows}, groups sorted by name, rows failures first then by margin.

    ``comparison`` is ``compare(baseline, report)``; with it each row carries its change.
    """
    statuses = _statuses(comparison)
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in report.records:
        groups.setdefault((r.recipe, r.backend), []).append(r)
    out = {}
    for name in sorted(groups):
        ordered = sorted(groups[name], key=lambda r: (r.passed, _margin_order(r), r.sort_key()))
        out[name] = [Row(r, *statuses.get(match_key(r), (None, ""))) for r in ordered]
    return out


def db_text(x: float | None, signed: bool = False) -> str:
    """A dB value for a table: two decimals, "inf"/"nan" spelled out, "–" when absent."""
    if x is None:
        return "–"
    if not math.isfinite(x):
        return ("+" if signed and x > 0 else "") + ("nan" if math.isnan(x) else f"{x}")
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def shape_text(r: Record) -> str:
    if r.m is None and r.n is None and r.k is None:
        return "–"
    return "×".join("?" if v is None else str(v) for v in (r.m, r.n, r.k))


def bits_text(r: Record) -> str:
    """Mismatch count for a bitwise check: "equal", "12 / 4,096", or "–" for SNR-only."""
    if r.mismatches is None:
        return {True: "equal", False: "differ", None: "–"}[r.bit_equal]
    if r.mismatches == 0 and r.bit_equal is not False:
        return "equal"
    return f"{r.mismatches:,}" + ("" if r.total is None else f" / {r.total:,}")


def short_test_id(test_id: str) -> str:
    """The test id without its directory: the file and the test name stay readable."""
    path, sep, rest = test_id.partition("::")
    return path.rsplit("/", 1)[-1] + sep + rest


def _where(r: Record) -> str:
    return " ".join(p for p in (r.direction, r.layer or short_test_id(r.test_id)) if p)


def summary_text(report: Report) -> str:
    """"412 checks, 3 failed, 5 skipped (3 not supported by the backend, 2 not runnable here);
    worst margin -1.20 dB (...)".

    Errored, crashed and timed-out tests are counted apart where there are any; a run that
    did not finish opens with "INCOMPLETE (why)", and one that pytest failed with no failed
    record opens with its exit status (see ``outcomes.run_status_text``).
    """
    text = f"{counts_text(report.records)}, {len(report.skipped)} skipped"
    if report.skipped:
        text += f" ({skip_summary(report.skipped)})"
    w = worst(report.records)
    if w is not None:
        text += f"; {worst_text(w)} ({_where(w)}, {w.recipe}/{w.backend})"
    status = run_status_text(report)
    return f"{status}: {text}" if status else text


def worst_text(w: Record) -> str:
    """"worst margin -1.20 dB", or says the SNR is NaN (no signal) rather than "nan dB"."""
    if w.margin_db is not None and math.isnan(w.margin_db):
        return "worst: SNR is NaN"
    return f"worst margin {db_text(w.margin_db, signed=True)} dB"


def baseline_summary(c: Comparison) -> str:
    return (f"Against the baseline (a drop over {c.max_drop_db:g} dB regresses): "
            f"{len(c.regressions)} regressed, {len(c.improvements)} improved, "
            f"{len(c.added)} new, {len(c.removed)} missing")


def environment_line(env: dict[str, Any]) -> str:
    """The provenance that tells runs apart, in one line."""
    device = env.get("device")
    arch = env.get("arch")
    parts = [f"mxcheck {env.get('mxcheck', '?')}", f"torch {env.get('torch', '?')}",
             arch if device in (None, arch) else f"{arch} ({device})"]
    if env.get("git_sha"):
        parts.append(f"commit {str(env['git_sha'])[:10]}" + ("+dirty" if env.get("git_dirty") else ""))
    if env.get("seed") is not None:
        parts.append(f"seed {env['seed']}")
    return " · ".join(str(p) for p in parts if p)


def md_escape(text: str) -> str:
    """Text safe inside a GFM table cell: no raw HTML, no column break, no emphasis."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for ch in "\\|*`":
        text = text.replace(ch, "\\" + ch)
    return " ".join(text.split())


def _md_row(row: Row, with_baseline: bool) -> str:
    r = row.record
    check = md_escape(short_test_id(r.test_id))
    if r.layer:
        check = f"{md_escape(r.layer)}<br><sub>{check}</sub>"
    outcome = outcome_of(r)
    unjudged = outcome in UNJUDGED_OUTCOMES
    if r.kind != "snr" or outcome not in ("passed", "failed"):
        tag = r.kind if outcome in ("passed", "failed") else f"{r.kind} {_OUTCOME_LABELS[outcome]}"
        check += f" <sub>({md_escape(tag)})</sub>"
    if (not r.passed or unjudged) and r.message:
        check += f"<br><sub>↳ {md_escape(r.message)}</sub>"
    cells = [check, r.direction or "–", shape_text(r), db_text(r.snr_db),
             db_text(r.threshold_db), db_text(r.margin_db, signed=True)]
    if with_baseline:
        delta = "new" if row.status == "new" else db_text(row.delta_db, signed=True)
        cells.append(f"**{delta}** ⚠" if row.status == "regressed" else delta)
    cells += [bits_text(r), "–" if unjudged else "✅" if r.passed else "❌"]
    return "| " + " | ".join(cells) + " |"


_OUTCOME_LABELS = {**TEST_OUTCOMES, **UNJUDGED_OUTCOMES}


def _md_table(name: tuple[str, str], rows: list[Row], lines: list[str],
              with_baseline: bool) -> list[str]:
    """A group's table: the title counts all ``rows``; ``lines`` are the rendered rows shown."""
    records = [row.record for row in rows]
    failed = sum(not r.passed for r in records)
    title = f"{md_escape(name[0])} / {md_escape(name[1])}: {counts_text(records)}"
    w = worst(records)
    if w is not None:
        title += f", {worst_text(w)}"
    if len(lines) < len(rows):
        title += f" (showing {len(lines)})"
    header = ["check", "dir", "M×N×K", "SNR dB", "threshold", "margin"]
    header += ["Δ baseline"] if with_baseline else []
    header += ["mismatches", "pass"]
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *lines]
    if len(lines) <= COLLAPSE_ROWS:
        return [f"#### {title}", "", *table, ""]
    # GitHub needs the blank line after </summary> to render the table inside as Markdown.
    return [f"<details{' open' if failed else ''}><summary><b>{title}</b></summary>", "",
            *table, "", "</details>", ""]


def _md_list(title: str, total: int, items: list[str]) -> list[str]:
    """A bulleted list; the title counts ``total``, of which ``items`` are shown."""
    if not items:
        return []
    title = f"{title} ({total})" if len(items) == total else f"{title} ({total}, showing {len(items)})"
    body = [f"- {item}" for item in items]
    if len(items) <= COLLAPSE_ROWS:
        return [f"#### {title}", "", *body, ""]
    return [f"<details><summary><b>{title}</b></summary>", "", *body, "", "</details>", ""]


@dataclass
class _Parts:
    """Every piece of the comment, rendered once; ``keep`` picks which rows and items show."""

    head: list[str]
    groups: dict[tuple[str, str], list[Row]]
    rows: dict[tuple[str, str], list[str]]  # rendered, in the groups' order
    removed: list[str]
    skipped: list[str]
    foot: str
    with_baseline: bool

    def assemble(self, keep: set[tuple[str, Any, int]] | None = None, note: str = "") -> str:
        """The Markdown; ``keep`` holds ("row", group, i), ("removed", None, i) and
        ("skipped", None, i) (None keeps everything); ``note`` goes under the summary."""
        def shown(kind: str, group: Any, items: list[str]) -> list[str]:
            return [t for i, t in enumerate(items) if keep is None or (kind, group, i) in keep]

        out = [*self.head, *([note, ""] if note else [])]
        for name, rows in self.groups.items():
            lines = shown("row", name, self.rows[name])
            if lines or keep is None:
                out += _md_table(name, rows, lines, self.with_baseline)
        out += _md_list(f"{NOT_RUN.capitalize()}: in the baseline, missing from this run", len(self.removed),
                        shown("removed", None, self.removed))
        out += _md_list("Skipped", len(self.skipped),
                        shown("skipped", None, self.skipped))
        out.append(self.foot)
        return "\n".join(out) + "\n"

    def priority(self) -> list[tuple[str, Any, int]]:
        """Everything that can be cut, most important first: failures, regressions, checks
        the baseline had and this run lost, the other rows smallest margin first, skips."""
        rows = [(name, i, row) for name, group in self.groups.items()
                for i, row in enumerate(group)]

        def rank(entry: tuple[tuple[str, str], int, Row]) -> tuple:
            r = entry[2].record
            return (r.passed, entry[2].status != "regressed", _margin_order(r), r.sort_key())

        ordered = sorted(rows, key=rank)
        failing = [("row", name, i) for name, i, row in ordered if not row.record.passed
                   or row.status == "regressed"]
        passing = [("row", name, i) for name, i, row in ordered if row.record.passed
                   and row.status != "regressed"]
        return (failing + [("removed", None, i) for i in range(len(self.removed))] + passing
                + [("skipped", None, i) for i in range(len(self.skipped))])


def _parts(report: Report, c: Comparison | None) -> _Parts:
    head = [f"**mxcheck**: {md_escape(summary_text(report))}", ""]
    if c is not None:
        head += [baseline_summary(c), ""]
    groups = group_rows(report, c)
    removed = [] if c is None else [
        f"{md_escape(f'{r.recipe}/{r.backend} {_where(r)}')} <sub>{md_escape(r.test_id)}</sub>"
        for r in c.removed]
    skipped = [f"{md_escape(s['test_id'])}: {md_escape(s['reason'])}"
               for s in sorted(report.skipped, key=lambda s: (s["test_id"], s["reason"]))]
    return _Parts(head, groups,
                  {name: [_md_row(row, c is not None) for row in rows]
                   for name, rows in groups.items()},
                  removed, skipped, f"<sub>{md_escape(environment_line(report.environment))}</sub>",
                  c is not None)


# What the cut note counts: (kind, singular, plural).
_CUT_KINDS = (("row", "record", "records"), ("removed", "missing from the baseline", "missing from the baseline"),
              ("skipped", "skip", "skips"))


def _cut_note(parts: _Parts, keep: set[tuple[str, Any, int]], artifact: str) -> str:
    """"*… and 1,234 more records, 56 more skips; full report in the `x` artifact*", naming
    only the kinds something was cut from; "" when nothing was."""
    total = {"row": sum(map(len, parts.rows.values())), "removed": len(parts.removed),
             "skipped": len(parts.skipped)}
    left = {kind: n - sum(kind == k for k, _, _ in keep) for kind, n in total.items()}
    counts = [f"{left[kind]:,} more {one if left[kind] == 1 else many}" for kind, one, many in _CUT_KINDS
              if left[kind]]
    if not counts:
        return ""
    return (f"*… and {', '.join(counts)} (cut to fit a GitHub comment); full report in the "
            f"`{md_escape(artifact)}` artifact*")


def render_markdown(report: Report, baseline: Report | None = None,
                    max_drop_db: float = DEFAULT_MAX_DROP_DB, *, max_chars: int | None = None,
                    artifact: str = DEFAULT_ARTIFACT) -> str:
    """The report as a PR comment; with ``baseline``, a Δ column and the checks it lost.

    With ``max_chars``, a longer comment keeps the summary line and as many rows as fit, in
    the order of ``_Parts.priority`` (failures first), and says under the summary how many
    records and list items were cut and that the full report is in ``artifact``. ValueError
    if not even the summary and that note fit.
    """
    if max_chars is not None and (isinstance(max_chars, bool) or not isinstance(max_chars, int)
                                  or max_chars < 1):
        raise ValueError(f"max_chars={max_chars!r}; expected a positive int or None")
    c = None if baseline is None else compare(baseline, report, max_drop_db)
    parts = _parts(report, c)
    full = parts.assemble()
    if max_chars is None or len(full) <= max_chars:
        return full
    order = parts.priority()

    def render(n: int) -> str:
        keep = set(order[:n])
        return parts.assemble(keep, _cut_note(parts, keep, artifact))

    # The length grows with every item added, so the most that fit is found by bisection.
    lo, hi = 0, len(order)
    if len(render(0)) > max_chars:
        raise ValueError(f"max_chars={max_chars:,} is shorter than the summary and the "
                         f"note on what was cut ({len(render(0)):,} characters)")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(render(mid)) <= max_chars:
            lo = mid
        else:
            hi = mid - 1
    return render(lo)
