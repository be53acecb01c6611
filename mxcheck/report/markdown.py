"""A report as GitHub-flavoured Markdown for a pull-request comment.

The layout, shared with the HTML page (which imports the row model from here):
a summary line, a baseline line when a baseline is given, then one table per
(recipe, backend) with failures first and then the smallest margin first (the rows a
reviewer should read), then the checks skipped on this hardware. Long tables fold into
``<details>``; a table with a failure is folded open.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mxcheck.report.compare import DEFAULT_MAX_DROP_DB, Comparison, compare, match_key
from mxcheck.report.schema import Record, Report

__all__ = [
    "COLLAPSE_ROWS",
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
    """The record with the smallest margin (a NaN margin counts as smallest), if any has one."""
    measured = [r for r in records if r.margin_db is not None]
    return min(measured, key=lambda r: (_margin_order(r), r.sort_key())) if measured else None


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
    """"412 checks, 3 failed, 5 skipped on this hardware; worst margin -1.20 dB (...)"."""
    failed = sum(not r.passed for r in report.records)
    text = (f"{len(report.records)} checks, {failed} failed, "
            f"{len(report.skipped)} skipped on this hardware")
    w = worst(report.records)
    if w is not None:
        text += f"; {worst_text(w)} ({_where(w)}, {w.recipe}/{w.backend})"
    return text


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
    if r.kind != "snr":
        check += f" <sub>({md_escape(r.kind)})</sub>"
    if not r.passed and r.message:
        check += f"<br><sub>↳ {md_escape(r.message)}</sub>"
    cells = [check, r.direction or "–", shape_text(r), db_text(r.snr_db),
             db_text(r.threshold_db), db_text(r.margin_db, signed=True)]
    if with_baseline:
        delta = "new" if row.status == "new" else db_text(row.delta_db, signed=True)
        cells.append(f"**{delta}** ⚠" if row.status == "regressed" else delta)
    cells += [bits_text(r), "✅" if r.passed else "❌"]
    return "| " + " | ".join(cells) + " |"


def _md_table(name: tuple[str, str], rows: list[Row], with_baseline: bool) -> list[str]:
    records = [row.record for row in rows]
    failed = sum(not r.passed for r in records)
    title = f"{md_escape(name[0])} / {md_escape(name[1])}: {len(rows)} checks, {failed} failed"
    w = worst(records)
    if w is not None:
        title += f", {worst_text(w)}"
    header = ["check", "dir", "M×N×K", "SNR dB", "threshold", "margin"]
    header += ["Δ baseline"] if with_baseline else []
    header += ["mismatches", "pass"]
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += [_md_row(row, with_baseline) for row in rows]
    if len(rows) <= COLLAPSE_ROWS:
        return [f"#### {title}", "", *table, ""]
    # GitHub needs the blank line after </summary> to render the table inside as Markdown.
    return [f"<details{' open' if failed else ''}><summary><b>{title}</b></summary>", "",
            *table, "", "</details>", ""]


def _md_list(title: str, items: list[str]) -> list[str]:
    if not items:
        return []
    body = [f"- {item}" for item in items]
    if len(items) <= COLLAPSE_ROWS:
        return [f"#### {title} ({len(items)})", "", *body, ""]
    return [f"<details><summary><b>{title} ({len(items)})</b></summary>", "", *body, "",
            "</details>", ""]


def render_markdown(report: Report, baseline: Report | None = None,
                    max_drop_db: float = DEFAULT_MAX_DROP_DB) -> str:
    """The report as a PR comment; with ``baseline``, a Δ column and the checks it lost."""
    c = None if baseline is None else compare(baseline, report, max_drop_db)
    out = [f"**mxcheck**: {md_escape(summary_text(report))}", ""]
    if c is not None:
        out += [baseline_summary(c), ""]
    for name, rows in group_rows(report, c).items():
        out += _md_table(name, rows, c is not None)
    if c is not None:
        out += _md_list("In the baseline, missing from this run",
                        [f"{md_escape(f'{r.recipe}/{r.backend} {_where(r)}')} "
                         f"<sub>{md_escape(r.test_id)}</sub>" for r in c.removed])
    out += _md_list("Skipped on this hardware",
                    [f"{md_escape(s['test_id'])}: {md_escape(s['reason'])}"
                     for s in sorted(report.skipped, key=lambda s: (s["test_id"], s["reason"]))])
    out.append(f"<sub>{md_escape(environment_line(report.environment))}</sub>")
    return "\n".join(out) + "\n"
