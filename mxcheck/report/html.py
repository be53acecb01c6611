"""A report as one self-contained HTML page: plots (inline PNG), tables, environment.

The tables follow the Markdown layout (rows come from ``markdown.group_rows``). Each
(recipe, backend) gets a plot of SNR per layer and direction with each check's threshold
drawn beside it, and the baseline's SNR as hollow markers when a baseline is given.
A report that carries block statistics (``mxcheck.stats``: ``BlockStats.to_json()`` or
``StatsProbe.to_json()`` entries under the top-level ``block_stats`` key, which
``Report`` keeps as an unknown key) gets a section with their table and, per operand,
histograms of scale exponents and per-block SNR.
matplotlib is optional (``pip install mxcheck[plots]``) and loaded only here, through its
Agg canvas and never pyplot, so rendering changes no global backend state. Without it the
page has every table and a note saying why it has no plots.
"""

from __future__ import annotations

import base64
import io
import math
import re
from html import escape
from typing import Any

from mxcheck.report.compare import DEFAULT_MAX_DROP_DB, Comparison, compare, match_key
from mxcheck.report.markdown import (
    Row,
    baseline_summary,
    bits_text,
    db_text,
    environment_line,
    group_rows,
    shape_text,
    short_test_id,
    summary_text,
    worst,
    worst_text,
)
from mxcheck.report.outcomes import UNJUDGED_OUTCOMES, outcome_of
from mxcheck.report.schema import DIRECTIONS, Report

__all__ = ["BLOCK_STATS_KEY", "block_stats_figure", "render_html", "snr_figure"]

BLOCK_STATS_KEY = "block_stats"

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
th{background:#f3f3f3}tr.fail{background:#fde8e8}td.bad{color:#b00;font-weight:bold}
small{color:#666}img{max-width:100%;display:block;margin:.5em 0}
.summary{font-size:1.1em}.note{background:#fff6d5;padding:4px 8px}
"""
# Inf (bit-exact against truth) and NaN (no signal) cannot sit on the axis: they are
# drawn on its edges with their own markers.
_MARKERS = {"finite": "o", "inf": "^", "nan": "X"}
_COLORS = {"fwd": "#1f77b4", "dgrad": "#ff7f0e", "wgrad": "#2ca02c", "bgrad": "#9467bd",
           "quantize": "#8c564b", "": "#7f7f7f"}


def _natural(label: str) -> list[Any]:
    # double_blocks.2 before double_blocks.10: the order layers have in the model.
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", label)]


_LABEL_CHARS = 32  # longer tick labels squeeze the plot; the table has the full name


def _label(row: Row) -> str:
    r = row.record
    label = r.layer or r.test_id.rsplit("::", 1)[-1]
    return label if len(label) <= _LABEL_CHARS else label[: _LABEL_CHARS - 1] + "…"


def _y(value: float, lo: float, hi: float) -> float:
    """Where to draw an SNR: Inf (bit-exact) on the top edge, NaN (no signal) on the bottom."""
    if math.isnan(value):
        return lo
    return hi if math.isinf(value) else value


def _limits(values: list[float]) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)] or [0.0, 1.0]
    pad = max(1.0, 0.08 * (max(finite) - min(finite)))
    return min(finite) - pad, max(finite) + pad


def snr_figure(title: str, rows: list[Row],
               base_snr: dict[tuple[str, ...], float]) -> Any | None:
    """A matplotlib Figure of SNR per layer and direction; None when no row has an SNR.

    ``base_snr`` maps ``match_key`` to the baseline's SNR. The data artists carry a gid
    ("snr", "threshold", "baseline", "failed") so a test can read back what was drawn.
    """
    rows = [row for row in rows if row.record.snr_db is not None]
    if not rows:
        return None
    labels = sorted({_label(row) for row in rows}, key=_natural)
    slot = {label: i for i, label in enumerate(labels)}
    values = [row.record.snr_db for row in rows]
    values += [row.record.threshold_db for row in rows if row.record.threshold_db is not None]
    values += [base_snr[k] for k in (match_key(row.record) for row in rows) if k in base_snr]
    lo, hi = _limits(values)

    fig = _figure(min(16.0, max(7.0, 2.0 + 0.45 * len(labels))), 4.2)
    ax = fig.add_subplot()
    _draw_points(ax, rows, slot, base_snr, lo, hi)
    # "$" starts mathtext in matplotlib; a literal one in a test id must not.
    ax.set_xticks(range(len(labels)), [t.replace("$", r"\$") for t in labels],
                  rotation=40, ha="right", fontsize=7)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylim(lo - 0.5, hi + 0.5)
    ax.set_ylabel("SNR (dB)")
    ax.set_title(title.replace("$", r"\$"), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return fig


def _matplotlib() -> tuple[Any, Any]:
    """matplotlib's (Figure, FigureCanvasAgg); ImportError saying how to install it."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(f"the plots need matplotlib, which is not installed ({e}); "
                          "pip install mxcheck[plots]") from e
    return Figure, FigureCanvasAgg


def _no_plots_reason() -> str | None:
    try:
        _matplotlib()
    except ImportError as e:
        return str(e)
    return None


def _figure(width: float, height: float) -> Any:
    """A matplotlib Figure on its own Agg canvas (no pyplot, no global state)."""
    Figure, FigureCanvasAgg = _matplotlib()
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _plot_png(title: str, rows: list[Row], base_snr: dict[tuple[str, ...], float]) -> str | None:
    """``snr_figure`` as base64 PNG text for a data: URL."""
    fig = snr_figure(title, rows, base_snr)
    return None if fig is None else _png(fig)


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    # No "Software" metadata: the same report renders to the same bytes.
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight", metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _draw_points(ax: Any, rows: list[Row], slot: dict[str, int],
                 base_snr: dict[tuple[str, ...], float], lo: float, hi: float) -> None:
    """Per direction: SNR dots, threshold ticks, baseline hollow diamonds; failures ringed."""
    present = [d for d in (*DIRECTIONS, "") if any((row.record.direction or "") == d
                                                   for row in rows)]
    width = 0.7 / len(present)
    for j, d in enumerate(present):
        mine = [row for row in rows if (row.record.direction or "") == d]
        x = [slot[_label(row)] - 0.35 + width * (j + 0.5) for row in mine]
        snr = [_y(row.record.snr_db, lo, hi) for row in mine]
        color = _COLORS[d]
        marker = [_MARKERS.get(_finiteness(row.record.snr_db), "o") for row in mine]
        for m in sorted(set(marker)):
            pts = [(xi, yi) for xi, yi, mi in zip(x, snr, marker, strict=True) if mi == m]
            ax.scatter(*zip(*pts, strict=True), s=22 if m == "o" else 40, marker=m, color=color,
                       zorder=3, gid="snr")
        # The legend shows the direction's colour on a plain dot, whatever markers it used.
        ax.scatter([], [], s=22, color=color, label=d or "(none)")
        thr = [(xi, row.record.threshold_db) for xi, row in zip(x, mine, strict=True)
               if row.record.threshold_db is not None]
        if thr:
            ax.scatter(*zip(*thr, strict=True), marker="_", s=160, linewidths=2, color=color,
                       alpha=0.8, zorder=2, gid="threshold")
        base = [(xi, _y(base_snr[match_key(row.record)], lo, hi), yi)
                for xi, yi, row in zip(x, snr, mine, strict=True)
                if match_key(row.record) in base_snr]
        if base:
            bx, by, ny = zip(*base, strict=True)
            ax.vlines(bx, by, ny, color=color, alpha=0.5, linewidth=1, zorder=1)
            ax.scatter(bx, by, s=26, marker="D", facecolors="none", edgecolors=color,
                       linewidths=1, zorder=2, gid="baseline")
        failed = [(xi, yi) for xi, yi, row in zip(x, snr, mine, strict=True)
                  if not row.record.passed]
        if failed:
            ax.scatter(*zip(*failed, strict=True), s=110, facecolors="none", edgecolors="#d00",
                       linewidths=1.5, zorder=4, gid="failed")
    _legend_keys(ax, any(row.record.threshold_db is not None for row in rows), bool(base_snr),
                 any(not row.record.passed for row in rows),
                 {_finiteness(row.record.snr_db) for row in rows} - {"finite"})


def _finiteness(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if math.isinf(x) else "finite")


def _legend_keys(ax: Any, threshold: bool, baseline: bool, failed: bool,
                 nonfinite: set[str]) -> None:
    # Invisible artists give the legend one entry each for the shared marker meanings.
    for kind, label in (("inf", "SNR inf (top edge)"), ("nan", "SNR NaN (bottom edge)")):
        if kind in nonfinite:
            ax.scatter([], [], marker=_MARKERS[kind], s=40, color="#555", label=label)
    if threshold:
        ax.scatter([], [], marker="_", s=160, linewidths=2, color="#555", label="threshold")
    if baseline:
        ax.scatter([], [], marker="D", s=26, facecolors="none", edgecolors="#555",
                   label="baseline")
    if failed:
        ax.scatter([], [], s=110, facecolors="none", edgecolors="#d00", label="failed")


def _histogram(ax: Any, hist: dict[str, Any], gid: str, title: str, xlabel: str) -> None:
    points = sorted((int(k), int(v)) for k, v in hist.items())
    if points:
        ax.bar(*zip(*points, strict=True), width=0.85, color="#1f77b4", gid=gid)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel("blocks", fontsize=8)
    ax.tick_params(labelsize=7)


def block_stats_figure(name: str, stats: dict[str, Any]) -> Any:
    """Two bar charts of one operand's ``BlockStats.to_json()``: blocks per scale exponent
    (gid "scale_exponents") and per floor(block SNR dB) (gid "block_snr")."""
    fig = _figure(9.0, 2.8)
    left, right = fig.subplots(1, 2)
    _histogram(left, stats.get("scale_exponents", {}), "scale_exponents",
               "scale exponent", "exponent (binade of the block scale)")
    exact = stats.get("exact_blocks", 0)
    _histogram(right, stats.get("snr_histogram", {}), "block_snr",
               "block SNR" + (f" ({exact} exact blocks not drawn)" if exact else ""), "SNR (dB)")
    fig.suptitle(name.replace("$", r"\$"), fontsize=9)
    fig.tight_layout()
    return fig


def _block_stats_entries(report: Report) -> list[tuple[str, dict[str, Any]]]:
    raw = report.unknown.get(BLOCK_STATS_KEY)
    # Report.merge keeps differing values of an unknown key as a list of them.
    groups = raw if isinstance(raw, list) else [raw]
    return [(str(k), v) for g in groups if isinstance(g, dict) for k, v in sorted(g.items())
            if isinstance(v, dict)]


def _stat(stats: dict[str, Any], key: str, pct: bool = False) -> str:
    v = stats.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return f"{100 * v:.2f}%" if pct else f"{v:.2f}"
    return "–" if v is None else str(v)


def _block_stats_section(entries: list[tuple[str, dict[str, Any]]], plots: bool) -> str:
    header = ["operand", "format", "block", "saturated", "overflow", "flushed", "SNR dB",
              "p1 block SNR dB"]
    rows = []
    for name, s in entries:
        block = "×".join(map(str, s.get("block", []))) or "–"
        cells = [f"<td>{escape(name)}</td>",
                 f"<td>{escape(str(s.get('fmt', '–')))} {escape(str(s.get('scaling', '')))}</td>",
                 _num(block), _num(_stat(s, "saturated_fraction", True)),
                 _num(_stat(s, "overflow_fraction", True)), _num(_stat(s, "flushed_fraction", True)),
                 _num(_stat(s, "snr_db")), _num(_stat(s.get("snr_db_quantiles", {}), "p1"))]
        rows.append(f"<tr>{''.join(cells)}</tr>")
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    images = [f'<img alt="{escape(name)}: block statistics" '
              f'src="data:image/png;base64,{_png(block_stats_figure(name, s))}">'
              for name, s in (entries if plots else [])]
    return (f'<section id="block-stats">\n<h2>Block statistics ({len(entries)} operands)</h2>\n'
            f"<table>\n<tr>{head}</tr>\n" + "\n".join(rows) + "\n</table>\n"
            + "\n".join(images) + "\n</section>")


def _num(text: str, bad: bool = False) -> str:
    return f'<td class="num{" bad" if bad else ""}">{escape(text)}</td>'


def _html_row(row: Row, with_baseline: bool) -> str:
    r = row.record
    check = escape(short_test_id(r.test_id))
    check = f"{escape(r.layer)}<br><small>{check}</small>" if r.layer else check
    unjudged = outcome_of(r) in UNJUDGED_OUTCOMES
    if r.kind != "snr":
        check += f" <small>({escape(r.kind)}{' ' + UNJUDGED_OUTCOMES[outcome_of(r)] if unjudged else ''})</small>"
    if (not r.passed or unjudged) and r.message:
        check += f"<br><small>↳ {escape(r.message)}</small>"
    cells = [f"<td>{check}</td>", f"<td>{escape(r.direction or '–')}</td>",
             _num(shape_text(r)), _num(db_text(r.snr_db)), _num(db_text(r.threshold_db)),
             _num(db_text(r.margin_db, signed=True), bad=not r.passed and r.margin_db is not None)]
    if with_baseline:
        delta = "new" if row.status == "new" else db_text(row.delta_db, signed=True)
        cells.append(_num(delta, bad=row.status == "regressed"))
    cells += [_num(bits_text(r), bad=r.bit_equal is False), _num("–" if unjudged else "pass" if r.passed else "FAIL", bad=not r.passed)]
    return f'<tr{"" if r.passed else " class=fail"}>{"".join(cells)}</tr>'


def _html_table(rows: list[Row], with_baseline: bool) -> str:
    header = ["check", "dir", "M×N×K", "SNR dB", "threshold", "margin"]
    header += ["Δ baseline"] if with_baseline else []
    header += ["mismatches", "pass"]
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "\n".join(_html_row(row, with_baseline) for row in rows)
    return f"<table>\n<tr>{head}</tr>\n{body}\n</table>"


def _group_section(name: tuple[str, str], rows: list[Row], c: Comparison | None,
                   base_snr: dict[tuple[str, ...], float], plots: bool) -> str:
    records = [row.record for row in rows]
    title = f"{name[0]} / {name[1]}"
    failed = sum(not r.passed for r in records)
    heading = f"{title}: {len(rows)} checks, {failed} failed"
    w = worst(records)
    heading += f", {worst_text(w)}" if w is not None else ""
    png = _plot_png(f"{title}: SNR per layer and direction", rows, base_snr) if plots else None
    img = ("" if png is None else
           f'<img alt="{escape(title)}: SNR per layer and direction" '
           f'src="data:image/png;base64,{png}">')
    return (f"<section>\n<h2>{escape(heading)}</h2>\n{img}\n"
            f"{_html_table(rows, c is not None)}\n</section>")


def _flatten(env: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k in sorted(env):
        v = env[k]
        out += _flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return out


def _env_value(key: str, v: Any) -> str:
    if v is None:
        return "not installed" if key.startswith("packages.") else "–"
    return ", ".join(map(str, v)) if isinstance(v, list) else str(v)


def _key_value_table(pairs: list[tuple[str, str]], header: tuple[str, str]) -> str:
    rows = "\n".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in pairs)
    return (f"<table>\n<tr><th>{escape(header[0])}</th><th>{escape(header[1])}</th></tr>\n"
            f"{rows}\n</table>")


def render_html(report: Report, baseline: Report | None = None,
                max_drop_db: float = DEFAULT_MAX_DROP_DB) -> str:
    """The whole report as one HTML page with no external resources.

    Without matplotlib the page has no plots and says so (and how to install it).
    """
    c = None if baseline is None else compare(baseline, report, max_drop_db)
    base_snr = {} if c is None else {
        match_key(ch.new): ch.base.snr_db for ch in (*c.regressions, *c.improvements, *c.unchanged)
        if ch.base.snr_db is not None}
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>mxcheck report</title>", f"<style>{_CSS}</style></head><body>",
             "<h1>mxcheck report</h1>",
             f'<p class="summary"><b>mxcheck</b>: {escape(summary_text(report))}</p>',
             f"<p><small>{escape(environment_line(report.environment))}</small></p>"]
    if c is not None:
        parts.append(f"<p>{escape(baseline_summary(c))}</p>")
    no_plots = _no_plots_reason()
    if no_plots is not None:
        parts.append(f'<p class="note">No plots on this page: {escape(no_plots)}. '
                     "The tables have every number.</p>")
    parts += [_group_section(name, rows, c, base_snr, plots=no_plots is None)
              for name, rows in group_rows(report, c).items()]
    entries = _block_stats_entries(report)
    if entries:
        parts.append(_block_stats_section(entries, plots=no_plots is None))
    if c is not None and c.removed:
        parts.append(f"<h2>In the baseline, missing from this run ({len(c.removed)})</h2>")
        parts.append(_key_value_table(
            [(f"{r.recipe}/{r.backend} {r.direction or ''} {r.layer or ''}", r.test_id)
             for r in c.removed], ("check", "test id")))
    if report.skipped:
        skipped = sorted(report.skipped, key=lambda s: (s["test_id"], s["reason"]))
        parts.append(f"<h2>Skipped ({len(skipped)})</h2>")
        parts.append(_key_value_table([(s["test_id"], s["reason"]) for s in skipped],
                                      ("test id", "reason")))
    parts.append("<h2>Environment</h2>")
    parts.append(_key_value_table([(k, _env_value(k, v)) for k, v in _flatten(report.environment)],
                                  ("key", "value")))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
