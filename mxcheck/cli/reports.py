"""``mxcheck report`` and ``mxcheck compare``: render a JSON report, compare two."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mxcheck.cli.common import (
    CommandError,
    add_allow_incomplete_option,
    add_max_drop_option,
    load_report,
    out,
    progress,
    write_text,
)
from mxcheck.report import ReportError, compare_files, render_html, render_markdown
from mxcheck.report.compare import require_complete
from mxcheck.report.markdown import DEFAULT_ARTIFACT, DEFAULT_MAX_CHARS

__all__ = ["compare_args", "report_args", "run_compare", "run_report"]


# ---- report -------------------------------------------------------------------------


def report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, metavar="IN.json", help="a report written by mxcheck")
    p.add_argument("--md", type=Path, metavar="OUT.md", help="write Markdown here")
    p.add_argument("--html", type=Path, metavar="OUT.html",
                   help="write a self-contained HTML page with plots here (needs matplotlib)")
    p.add_argument("--baseline", type=Path, metavar="BASE.json",
                   help="add a column with the change against this report")
    add_max_drop_option(p.add_argument)
    add_allow_incomplete_option(p.add_argument)
    p.add_argument("--max-chars", type=_max_chars, default=DEFAULT_MAX_CHARS, metavar="N",
                   help="cut the Markdown to at most N characters (GitHub refuses a comment "
                        "over 65,536), keeping the summary and failures first and saying how "
                        "many records were cut; 0: no limit. Default: %(default)r")
    p.add_argument("--artifact", default=DEFAULT_ARTIFACT, metavar="NAME",
                   help="the artifact a cut comment points to for the full report. "
                        "Default: %(default)r")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr. Default: %(default)r")


def _max_chars(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"max-chars must be a number of characters >= 0 "
                                         f"(0: no limit), got {text!r}")
    return value or None


def run_report(args: argparse.Namespace) -> int:
    say = lambda msg: progress("report", msg, args.quiet)  # noqa: E731
    report = load_report(args.input)
    baseline = None if args.baseline is None else load_report(args.baseline)
    if baseline is not None and not args.allow_incomplete_baseline:
        try:
            require_complete(baseline, str(args.baseline))
        except ReportError as e:
            raise CommandError(str(e)) from None
    n = f"{len(report.records)} records"
    try:
        if args.md is not None or args.html is None:
            say(f"rendering Markdown ({n})...")
            md = render_markdown(report, baseline, args.max_drop_db, max_chars=args.max_chars,
                                 artifact=args.artifact)
            if args.md is None:
                out(md)
            else:
                write_text(args.md, md)
                say(f"wrote {args.md}")
        if args.html is not None:
            say(f"rendering HTML ({n}, one plot per recipe and backend)...")
            write_text(args.html, render_html(report, baseline, args.max_drop_db))
            say(f"wrote {args.html}")
    except (ImportError, ValueError) as e:  # no matplotlib; duplicate records in a report
        raise CommandError(str(e)) from None
    return 0


# ---- compare ------------------------------------------------------------------------


def compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", type=Path, metavar="BASE.json", help="the report to compare against")
    p.add_argument("new", type=Path, metavar="NEW.json", help="the report of this run")
    add_max_drop_option(p.add_argument)
    add_allow_incomplete_option(p.add_argument)


def run_compare(args: argparse.Namespace) -> int:
    code, text = compare_files(args.base, args.new, args.max_drop_db,
                               allow_incomplete_baseline=args.allow_incomplete_baseline)
    if code == 2:  # text is already "mxcheck compare: error: <file>: <problem>"
        sys.stderr.write(text)
    else:
        out(text)
    return code
