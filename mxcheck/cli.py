"""The ``mxcheck`` command: info, formats, report, compare.

Each subcommand is one entry of ``COMMANDS``: a help line, a function that adds its
arguments, and a function that runs it and returns the exit code. Adding a subcommand
is those two small functions and one line in the table.

Exit codes: 0 success, 1 a regression (``compare``), 2 bad usage or a bad input file.
Every error is one line on stderr (``mxcheck <command>: error: ...``), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, NoReturn

import torch

import mxcheck
from mxcheck import hardware
from mxcheck.formats import FORMATS, FloatFormat
from mxcheck.report import Report, ReportError, compare_files, render_html, render_markdown
from mxcheck.report.compare import DEFAULT_MAX_DROP_DB
from mxcheck.report.environment import package_versions

__all__ = [
    "COMMANDS",
    "Command",
    "CommandError",
    "add_max_drop_option",
    "build_parser",
    "collect_info",
    "exact_text",
    "format_row",
    "main",
    "parse_max_drop_db",
]

PROG = "mxcheck"


class CommandError(Exception):
    """A failure the user can fix (bad file, bad environment): one line, exit code 2."""


class _UsageError(Exception):
    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage block and exits; we want one line and a return code.
    def error(self, message: str) -> NoReturn:
        raise _UsageError(self.prog, message)


# ---- option converters and adders (shared with the pytest plugin's --mxcheck-* options) --


def parse_max_drop_db(text: str) -> float:
    """A dB margin: a finite number >= 0. The error names the bad value."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"max-drop-db must be a number of dB >= 0, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"max-drop-db must be finite, got {value!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"max-drop-db must be >= 0, got {value!r}")
    return value


def add_max_drop_option(addoption: Callable[..., Any], prefix: str = "--") -> None:
    """``{prefix}max-drop-db``: through ``parser.add_argument`` or pytest's ``addoption``."""
    addoption(f"{prefix}max-drop-db", type=parse_max_drop_db, default=DEFAULT_MAX_DROP_DB,
              metavar="DB",
              help="an SNR drop against the baseline larger than this many dB is a "
                   "regression. Default: %(default)r")


def _add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table. "
                                                       "Default: %(default)r")


# ---- output helpers -----------------------------------------------------------------


def _out(text: str) -> None:
    """Write to stdout; a terminal that cannot show a character still gets UTF-8 bytes."""
    try:
        sys.stdout.write(text)
    except UnicodeEncodeError:
        sys.stdout.flush()
        sys.stdout.buffer.write(text.encode("utf-8"))
    sys.stdout.flush()


def _progress(command: str, message: str, quiet: bool = False) -> None:
    if not quiet:
        print(f"{PROG} {command}: {message}", file=sys.stderr, flush=True)


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> str:
    """Left-aligned columns; the last column is not padded."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(map(len, rows)))]
    lines = []
    for r in rows:
        cells = [c.ljust(widths[i]) for i, c in enumerate(r[:-1])] + [r[-1]]
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines) + "\n"


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


# ---- info ---------------------------------------------------------------------------


def _backends() -> tuple[dict[str, tuple[bool, str]] | None, str]:
    """(name -> (usable, why not), "") or (None, why the registry could not be read)."""
    try:
        # Late: a backend's factory may import its vendor package.
        registry = importlib.import_module("mxcheck.backends")
        return dict(registry.available_backends()), ""
    except (ImportError, AttributeError):
        return None, "registry not available"
    except Exception as e:  # a broken registry must not cost the rest of the report
        return None, f"registry failed: {type(e).__name__}: {e}"


def collect_info() -> dict[str, Any]:
    """What ``mxcheck info`` shows, as JSON-able data."""
    try:
        hw = hardware.detect()
    except ValueError as e:  # a malformed MXCHECK_FAKE_HARDWARE
        raise CommandError(str(e)) from None
    backends, why = _backends()
    markers = {}
    for name, help_text in hardware.MARKERS.items():
        reason = hardware.missing(name, hw)
        markers[name] = {"runs": reason is None, "reason": reason, "help": help_text}
    return {
        "mxcheck": mxcheck.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "hardware": {"vendor": hw.vendor, "arch": hw.arch, "name": hw.name,
                     "device_count": hw.device_count, "runtime": hw.runtime,
                     "faked": hw.faked, "description": hw.describe()},
        "packages": package_versions(),
        "backends": None if backends is None else {
            name: {"usable": ok, "reason": reason} for name, (ok, reason) in backends.items()},
        "backends_error": why or None,
        "markers": markers,
    }


def _info_text(info: dict[str, Any]) -> str:
    hw = info["hardware"]
    out = [f"mxcheck {info['mxcheck']} (torch {info['torch']}, python {info['python']})\n",
           "\nhardware:\n",
           _table([("device", hw["description"]), ("vendor", hw["vendor"]),
                   ("arch", hw["arch"]), ("name", hw["name"]),
                   ("devices", str(hw["device_count"])), ("runtime", hw["runtime"] or "-"),
                   ("faked", f"yes ({hardware.FAKE_HARDWARE_ENV})" if hw["faked"] else "no")]),
           "\npackages:\n",
           _table([(k, v or "not installed") for k, v in info["packages"].items()])]
    if info["backends"] is None:
        out.append(f"\nbackends: {info['backends_error']}\n")
    else:
        out.append("\nbackends:\n")
        out.append(_table([(name, "usable" if b["usable"] else f"not usable: {b['reason']}")
                           for name, b in info["backends"].items()]) or "  (none registered)\n")
    out.append("\nmarkers here:\n")
    here = f"this machine has {hw['description']}"
    out.append(_table([(name, "runs" if m["runs"] else "skips",
                        m["reason"] if not m["runs"] else
                        f"{m['help']}; {here}" if name in hardware.HARDWARE_MARKERS else m["help"])
                       for name, m in info["markers"].items()]))
    return "".join(out)


def _info_args(p: argparse.ArgumentParser) -> None:
    _add_json_flag(p)


def run_info(args: argparse.Namespace) -> int:
    info = collect_info()
    _out(_json(info) if args.json else _info_text(info))
    return 0


# ---- formats ------------------------------------------------------------------------


def exact_text(v: float) -> str:
    """A format constant, exactly: ``448``, ``7.5``, ``2^-9 = 0.001953125``, ``2^127 ≈ 1.701e+38``.

    Small integers and short exact decimals print as they are; other powers of two and
    large values add the form n * 2^k (n odd), which is exact, and then the decimal,
    with ``=`` where it is the exact value and ``≈`` (4 digits) where it is not.
    """
    if not math.isfinite(v) or v == 0:
        return repr(v)
    num, den = Fraction(v).as_integer_ratio()
    k = -(den.bit_length() - 1)  # den is a power of two
    while num % 2 == 0:
        num //= 2
        k += 1
    if den == 1 and v < 2**24:
        return str(int(v))
    short = repr(v)
    exact_short = Fraction(short) == Fraction(v) and len(short) <= 17
    if exact_short and num != 1:
        return short
    power = f"2^{k}" if num == 1 else f"{num} * 2^{k}"
    return f"{power} = {short}" if exact_short else f"{power} ≈ {v:.4g}"


def _code(code: int | None, fmt: FloatFormat) -> str:
    return "none" if code is None else f"0x{code:0{(fmt.bits + 3) // 4}x}"


def format_row(fmt: FloatFormat) -> dict[str, Any]:
    """One format's constants as JSON-able data (min_subnormal is None without subnormals)."""
    return {"name": fmt.name, "bits": fmt.bits, "ebits": fmt.ebits, "mbits": fmt.mbits,
            "bias": fmt.bias, "emax": fmt.emax, "emin": fmt.emin, "max": fmt.max,
            "min_normal": fmt.min_normal,
            "min_subnormal": fmt.min_subnormal if fmt.subnormals else None,
            "nan_code": fmt.nan_code, "inf_code": fmt.inf_code, "nan": fmt.nan,
            "inf": fmt.inf, "signed": fmt.signed, "max_code": fmt.max_code}


def _formats_text() -> str:
    rows = [("name", "bits", "ebits", "mbits", "bias", "emax", "emin", "max", "min normal",
             "min subnormal", "NaN code", "Inf code")]
    for f in FORMATS.values():
        rows.append((f.name, str(f.bits), str(f.ebits), str(f.mbits), str(f.bias), str(f.emax),
                     str(f.emin), exact_text(f.max), exact_text(f.min_normal),
                     exact_text(f.min_subnormal) if f.subnormals else "none",
                     _code(f.nan_code, f) + ("" if f.nan == "none" else f" ({f.nan})"),
                     _code(f.inf_code, f)))
    return _table(rows, indent="")


def _formats_args(p: argparse.ArgumentParser) -> None:
    _add_json_flag(p)


def run_formats(args: argparse.Namespace) -> int:
    if args.json:
        _out(_json({name: format_row(f) for name, f in FORMATS.items()}))
    else:
        _out(_formats_text())
    return 0


# ---- report -------------------------------------------------------------------------


def _load(path: Path) -> Report:
    try:
        return Report.load(path)
    except ReportError as e:  # names the file and the problem
        raise CommandError(str(e)) from None


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise CommandError(f"{path}: cannot write: {e.strerror or e}") from None


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, metavar="IN.json", help="a report written by mxcheck")
    p.add_argument("--md", type=Path, metavar="OUT.md", help="write Markdown here")
    p.add_argument("--html", type=Path, metavar="OUT.html",
                   help="write a self-contained HTML page with plots here (needs matplotlib)")
    p.add_argument("--baseline", type=Path, metavar="BASE.json",
                   help="add a column with the change against this report")
    add_max_drop_option(p.add_argument)
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr. Default: %(default)r")


def run_report(args: argparse.Namespace) -> int:
    say = lambda msg: _progress("report", msg, args.quiet)  # noqa: E731
    report = _load(args.input)
    baseline = None if args.baseline is None else _load(args.baseline)
    n = f"{len(report.records)} records"
    try:
        if args.md is not None or args.html is None:
            say(f"rendering Markdown ({n})...")
            md = render_markdown(report, baseline, args.max_drop_db)
            if args.md is None:
                _out(md)
            else:
                _write(args.md, md)
                say(f"wrote {args.md}")
        if args.html is not None:
            say(f"rendering HTML ({n}, one plot per recipe and backend)...")
            _write(args.html, render_html(report, baseline, args.max_drop_db))
            say(f"wrote {args.html}")
    except (ImportError, ValueError) as e:  # no matplotlib; duplicate records in a report
        raise CommandError(str(e)) from None
    return 0


# ---- compare ------------------------------------------------------------------------


def _compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", type=Path, metavar="BASE.json", help="the report to compare against")
    p.add_argument("new", type=Path, metavar="NEW.json", help="the report of this run")
    add_max_drop_option(p.add_argument)


def run_compare(args: argparse.Namespace) -> int:
    code, text = compare_files(args.base, args.new, args.max_drop_db)
    if code == 2:  # text is already "mxcheck compare: error: <file>: <problem>"
        sys.stderr.write(text)
    else:
        _out(text)
    return code


# ---- divergence ---------------------------------------------------------------------


def _divergence_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", nargs="?", metavar="A", help="a profile, e.g. primus_turbo.mxfp4")
    p.add_argument("b", nargs="?", metavar="B", help="the profile to compare it with, e.g. ocp")
    p.add_argument("--fmt", metavar="FMT", help="the element format where both profiles are "
                   "families (ocp, torchao.floor, ...). Default: %(default)r")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed of the generated inputs. Default: %(default)r")
    p.add_argument("--table", action="store_true", help="print how mxcheck reaches each case of "
                   "reference_emulators.md section 8 instead. Default: %(default)r")
    _add_json_flag(p)


def run_divergence(args: argparse.Namespace) -> int:
    from mxcheck import divergence  # noqa: PLC0415  (generates inputs only when asked)
    from mxcheck.profiles import PROFILES  # noqa: PLC0415

    if args.table:
        _out(_json(divergence.table_json()) if args.json else divergence.table_text())
        return 0
    known = f"known profiles: {', '.join(PROFILES)}"
    if args.a is None or args.b is None:
        raise CommandError(f"give two profiles A B (or --table); {known}")
    for name in (args.a, args.b):
        if name not in PROFILES:
            raise CommandError(f"unknown profile {name!r}; {known}")
    try:
        report = divergence.divergence(args.a, args.b, seed=args.seed, fmt=args.fmt)
    except ValueError as e:  # two pinned formats, a family pair without --fmt, a bad --fmt
        raise CommandError(str(e)) from None
    _out(_json(report.to_json()) if args.json else report.to_text())
    return 0


# ---- the table of subcommands --------------------------------------------------------


@dataclass(frozen=True)
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {
    "info": Command("hardware, packages, backends, and which markers run here",
                    _info_args, run_info),
    "formats": Command("the constants of every element format", _formats_args, run_formats),
    "report": Command("render a JSON report to Markdown (default: stdout) and/or HTML",
                      _report_args, run_report),
    "compare": Command("compare two reports; exit 1 on a regression", _compare_args,
                       run_compare),
    "divergence": Command("where two profiles give different bits", _divergence_args, run_divergence),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="mxcheck: numerics checks for low-precision "
                     "training. Exit codes: 0 ok, 1 regression (compare), 2 bad usage or input.")
    parser.add_argument("--version", action="version", version=f"{PROG} {mxcheck.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``mxcheck`` with argv (sys.argv[1:] when None); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as e:
        print(f"{e.prog}: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help and --version
        return e.code if isinstance(e.code, int) else 0
    if args.command is None:
        print(f"{PROG}: error: a command is required, one of {', '.join(COMMANDS)} "
              f"(see {PROG} --help)", file=sys.stderr)
        return 2
    try:
        return args.run(args)
    except CommandError as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
        return 2
