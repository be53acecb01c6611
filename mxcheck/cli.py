"""The ``mxcheck`` command: info, formats, report, compare, divergence, and the deployment
checks lint, tuned-coverage and aiter-log.

Each subcommand is one entry of ``COMMANDS``: a help line, a function that adds its
arguments, and a function that runs it and returns the exit code. Adding a subcommand
is those two small functions and one line in the table.

Exit codes: 0 success, 1 a regression (``compare``) or a failed deployment check (an error
finding, a missing tuned shape, a logged miss), 2 bad usage or a bad input file.
Every error is one line on stderr (``mxcheck <command>: error: ...``), never a traceback; an
unexpected exception too is exit 2 with one line naming the command's files (``main``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
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
from mxcheck.report.markdown import DEFAULT_ARTIFACT, DEFAULT_MAX_CHARS

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
    say = lambda msg: _progress("report", msg, args.quiet)  # noqa: E731
    report = _load(args.input)
    baseline = None if args.baseline is None else _load(args.baseline)
    n = f"{len(report.records)} records"
    try:
        if args.md is not None or args.html is None:
            say(f"rendering Markdown ({n})...")
            md = render_markdown(report, baseline, args.max_drop_db, max_chars=args.max_chars,
                                 artifact=args.artifact)
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


# ---- deployment checks: lint, tuned-coverage, aiter-log ------------------------------


def _positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}")
        return value
    return parse


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CommandError(f"{path}: cannot read {what}: {getattr(e, 'strerror', None) or e}") \
            from None


def _add_token_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--img-tokens", type=_positive_int("img-tokens"), default=256, metavar="N",
                   help="image tokens per sample. Default: %(default)r")
    p.add_argument("--txt-tokens", type=_positive_int("txt-tokens"), default=256, metavar="N",
                   help="text tokens per sample. Default: %(default)r")


def _lint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", type=Path, metavar="RECIPE.yaml",
                   help="a Primus experiment YAML (modules.pre_trainer.overrides) or a flat one")
    env = p.add_mutually_exclusive_group()
    env.add_argument("--env", action="store_true",
                     help="also check this process's environment. Default: %(default)r")
    env.add_argument("--env-file", type=Path, metavar="FILE",
                     help="also check the KEY=VALUE lines of FILE as the launch environment")
    p.add_argument("--txt-tokens", type=_positive_int("txt-tokens"), default=256, metavar="N",
                   help="text tokens of seq_length (the rest are image tokens). "
                        "Default: %(default)r")
    p.add_argument("--dp-size", type=_positive_int("dp-size"), metavar="N",
                   help="data-parallel size, for the one-microbatch rule (else from "
                        "data_parallel_size, WORLD_SIZE or NNODES x GPUS_PER_NODE)")
    _add_json_flag(p)


def run_lint(args: argparse.Namespace) -> int:
    from mxcheck.deploy import lint, load_recipe, parse_env_file  # noqa: PLC0415

    env: dict[str, str] | None = dict(os.environ) if args.env else None
    if args.env_file is not None:
        try:
            env = parse_env_file(_read_text(args.env_file, "env file"), source=str(args.env_file))
        except ValueError as e:
            raise CommandError(str(e)) from None
    try:
        recipe = load_recipe(args.recipe, env)
    except OSError as e:
        raise CommandError(f"{args.recipe}: cannot read recipe: {e.strerror or e}") from None
    except ValueError as e:
        raise CommandError(str(e)) from None
    result = lint(recipe, env, txt_tokens=args.txt_tokens, dp_size=args.dp_size)
    _out(_json(result.to_json()) if args.json else result.to_text())
    return result.exit_code


def _tuned_coverage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("csv", type=Path, metavar="CSV", help="an AITER tuned GEMM CSV "
                   "(gfx,cu_num,M,N,K,kernelId,splitK,us,kernelName,...)")
    p.add_argument("--model", default="flux-12b", metavar="NAME",
                   help="flux-12b, flux-12b-schnell or flux-535m. Default: %(default)r")
    p.add_argument("--mbs", type=_positive_int("mbs"), required=True, metavar="N",
                   help="micro batch size")
    p.add_argument("--cu-num", type=_positive_int("cu-num"), default=256, metavar="N",
                   help="compute units of the GPU (MI355X: 256). Default: %(default)r")
    p.add_argument("--gfx", default="gfx950", metavar="ARCH",
                   help="GPU arch, matched where the CSV has a gfx column. Default: %(default)r")
    _add_token_args(p)
    _add_json_flag(p)


def run_tuned_coverage(args: argparse.Namespace) -> int:
    from mxcheck.deploy import read_tuned_csv, tuned_coverage  # noqa: PLC0415

    try:
        table = read_tuned_csv(_read_text(args.csv, "tuned CSV"), source=str(args.csv))
        coverage = tuned_coverage(table, args.model, args.mbs, img_tokens=args.img_tokens,
                                  txt_tokens=args.txt_tokens, cu_num=args.cu_num, gfx=args.gfx)
    except ValueError as e:  # a malformed CSV, an unknown model
        raise CommandError(str(e)) from None
    _out(_json(coverage.to_json()) if args.json else coverage.to_text())
    return coverage.exit_code


def _aiter_log_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", type=Path, metavar="LOG", help="a training log with AITER's "
                   "tuned-config lines (hits need AITER_LOG_TUNED_CONFIG=1)")
    _add_json_flag(p)


def run_aiter_log(args: argparse.Namespace) -> int:
    from mxcheck.deploy import audit_log  # noqa: PLC0415

    audit = audit_log(_read_text(args.log, "log").splitlines(), source=str(args.log))
    _out(_json(audit.to_json()) if args.json else audit.to_text())
    return audit.exit_code


# ---- Flux: shapes, sweep ---------------------------------------------------------------


def _shapes_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="flux-12b", metavar="NAME",
                   help="a Flux config (flux-12b, flux-12b-schnell, flux-535m, ...). Default: %(default)r")
    p.add_argument("--mbs", type=_positive_int("mbs"), default=64, metavar="N",
                   help="micro batch size. Default: %(default)r")
    _add_token_args(p)
    p.add_argument("--all", action="store_true", help="list every linear, not only those a "
                   "Primus local spec quantizes. Default: %(default)r")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--csv", action="store_true", help="CSV: layer,stream,direction,M,N,K. "
                     "Default: %(default)r")
    _add_json_flag(out)


def run_shapes(args: argparse.Namespace) -> int:
    from mxcheck.flux import flux_linear_shapes, shapes_csv, unique_gemms  # noqa: PLC0415

    try:
        rows = flux_linear_shapes(args.model, args.mbs, args.img_tokens, args.txt_tokens,
                                  replaced_only=not args.all)
    except ValueError as e:
        raise CommandError(str(e)) from None
    if args.csv:
        _out(shapes_csv(rows))
    elif args.json:
        _out(_json([{"layer": g.layer, "stream": r.linear.stream, "direction": g.direction,
                     "m": g.m, "n": g.n, "k": g.k} for r in rows for g in r.gemms()]))
    else:
        unique = unique_gemms(rows)
        table = [["direction", "M", "N", "K", "layers"]]
        table += [[d, str(m), str(n), str(k), f"{len(names)} ({names[0]}...)"]
                  for (d, m, n, k), names in unique.items()]
        _out(f"{args.model}, micro batch {args.mbs}, {args.img_tokens} image + {args.txt_tokens} text "
             f"tokens: {len(rows)} linears, {len(unique)} unique GEMMs\n{_table(table)}")
    return 0


def _sweep_args(p: argparse.ArgumentParser) -> None:
    from mxcheck.sweep import DEFAULT_RECIPES  # noqa: PLC0415

    p.add_argument("--model", default="flux-12b", metavar="NAME",
                   help="a Flux config. Default: %(default)r")
    p.add_argument("--recipes", nargs="+", default=list(DEFAULT_RECIPES), metavar="RECIPE",
                   help="recipes to run. Default: %(default)r")
    p.add_argument("--backend", default="auto", metavar="NAME",
                   help="a backend name, 'pkg.module:factory', or auto (per recipe the first "
                        "usable of triton, torch, emulated). Default: %(default)r")
    p.add_argument("--mbs", type=_positive_int("mbs"), default=64, metavar="N",
                   help="micro batch size. Default: %(default)r")
    p.add_argument("--tokens", type=_positive_int("tokens"), metavar="N",
                   help="force M of every linear (default: the shape table's M on a GPU, "
                        "256 on a CPU)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="write sweep.json, sweep.md and sweep.html (needs matplotlib) here")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="input seed. Default: %(default)r")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr. Default: %(default)r")


def run_sweep_command(args: argparse.Namespace) -> int:
    from mxcheck.backends import BackendLoadError  # noqa: PLC0415
    from mxcheck.sweep import run_sweep  # noqa: PLC0415

    say = lambda msg: _progress("sweep", msg, args.quiet)  # noqa: E731
    try:
        report = run_sweep(args.model, args.recipes, args.backend, batch=args.mbs, tokens=args.tokens,
                           seed=args.seed, progress=say)
    except (ValueError, BackendLoadError) as e:
        raise CommandError(str(e)) from None
    md = render_markdown(report)
    if args.out is None:
        _out(md)
    else:
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CommandError(f"{args.out}: cannot create: {e.strerror or e}") from None
        report.save(args.out / "sweep.json")
        _write(args.out / "sweep.md", md)
        try:
            _write(args.out / "sweep.html", render_html(report))
        except ImportError as e:
            say(f"no HTML: {e}")
        say(f"wrote {args.out}/sweep.{{json,md,html}}")
    failed = [r for r in report.records if not r.passed]
    say(f"{len(report.records)} records, {len(failed)} failed, {len(report.skipped)} skipped, "
        f"{report.environment['sweep']['wall_s']} s")
    return 1 if failed else 0


# ---- stats ----------------------------------------------------------------------------


def _shape_arg(text: str) -> tuple[int, int]:
    rows, _, cols = text.lower().partition("x")
    try:
        shape = int(rows), int(cols)
    except ValueError:
        shape = 0, 0
    if min(shape) < 1:
        raise argparse.ArgumentTypeError(f"shape must be ROWSxCOLS with positive integers "
                                         f"(e.g. 256x3072), got {text!r}")
    return shape


def _stats_args(p: argparse.ArgumentParser) -> None:
    from mxcheck.recipes import OPERANDS, RECIPES  # noqa: PLC0415
    from mxcheck.stats import DISTRIBUTIONS  # noqa: PLC0415

    p.add_argument("--recipe", default="mxfp4", choices=list(RECIPES), metavar="NAME",
                   help=f"one of {', '.join(RECIPES)}. Default: %(default)r")
    p.add_argument("--operand", default="x_row", choices=OPERANDS, metavar="OPERAND",
                   help=f"the operand copy whose spec to use: {', '.join(OPERANDS)}. "
                        "Default: %(default)r")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--shape", type=_shape_arg, default="256x3072", metavar="ROWSxCOLS",
                     help="shape of a synthetic float32 operand (COLS is the contraction axis). "
                          "Default: %(default)r")
    src.add_argument("--pt", type=Path, metavar="FILE.pt",
                     help="a tensor or a dict of tensors saved with torch.save (each viewed as "
                          "[-1, last dim]; float64 read as float32)")
    p.add_argument("--key", metavar="NAME", help="with --pt holding a dict: only this entry")
    p.add_argument("--dist", default="normal", choices=list(DISTRIBUTIONS), metavar="DIST",
                   help=f"distribution of the synthetic operand: {', '.join(DISTRIBUTIONS)}. "
                        "Default: %(default)r")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed of the synthetic operand and of stochastic-rounding bits. "
                        "Default: %(default)r")
    _add_json_flag(p)


def _as_operand(name: str, t: torch.Tensor) -> torch.Tensor:
    if not t.dtype.is_floating_point or t.ndim == 0:
        raise CommandError(f"{name}: a {t.dtype} tensor of shape {tuple(t.shape)}; expected a "
                           "floating-point tensor of at least 1 dim")
    t = t.detach().reshape(-1, t.shape[-1])
    return t.float() if t.dtype == torch.float64 else t


def _stats_tensors(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """name -> 2D operand: the synthetic one, or the tensor(s) of the --pt file."""
    from mxcheck.stats import synthetic  # noqa: PLC0415

    if args.pt is None:
        if args.key is not None:
            raise CommandError(f"--key {args.key!r} selects an entry of a --pt file; give --pt FILE.pt")
        rows, cols = args.shape
        return {f"{args.dist} {rows}x{cols}": synthetic(args.shape, args.dist, seed=args.seed)}
    try:
        data = torch.load(args.pt, map_location="cpu", weights_only=True)
    except OSError as e:
        raise CommandError(f"{args.pt}: cannot read: {e.strerror or e}") from None
    except Exception as e:  # pickle and torch errors: not a file of plain tensors
        raise CommandError(f"{args.pt}: not a torch.save file of tensors ({type(e).__name__}: {e})") \
            from None
    if isinstance(data, torch.Tensor):
        if args.key is not None:
            raise CommandError(f"{args.pt} holds one tensor, not a dict: drop --key {args.key!r}")
        return {args.pt.name: _as_operand(args.pt.name, data)}
    if not isinstance(data, dict):
        raise CommandError(f"{args.pt} holds a {type(data).__name__}; expected a tensor or a dict of tensors")
    tensors = {str(k): v for k, v in data.items() if isinstance(v, torch.Tensor)}
    if args.key is not None:
        if args.key not in tensors:
            raise CommandError(f"--key {args.key!r} is not a tensor in {args.pt}; it has {sorted(tensors)}")
        tensors = {args.key: tensors[args.key]}
    if not tensors:
        raise CommandError(f"{args.pt}: the dict holds no tensors (keys {sorted(map(str, data))})")
    return {k: _as_operand(k, v) for k, v in tensors.items()}


def _pct(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{100 * v:.2f}%"


def _stats_text(name: str, s: Any) -> str:
    q, r = s.snr_db_quantiles, s.rel_error_quantiles
    live = s.n_blocks - s.zero_blocks - s.nan_blocks
    exps = "  ".join(f"{e}:{n}" for e, n in s.scale_exponents.items()) or "-"
    return f"{name}: {s.shape[0]}x{s.shape[1]} ({s.domain} domain)\n" + _table([
        ("blocks", f"{s.n_blocks} of {s.block[0]}x{s.block[1]} ({s.zero_blocks} all-zero, "
                   f"{s.nan_blocks} NaN)"),
        ("saturated", f"{_pct(s.saturated_fraction)} of {live} blocks ({s.saturated_blocks})"),
        ("overflow", f"{_pct(s.overflow_fraction)} ({s.overflow_blocks}): the clip changed a code"),
        ("flushed", f"{_pct(s.flushed_fraction)} of {s.nonzero_elements} non-zero elements "
                    f"({s.flushed_elements})"),
        ("SNR dB", f"{s.snr_db:.2f} overall; per block " +
                   " ".join(f"{k} {v:.2f}" for k, v in q.items())),
        ("rel error", " ".join(f"{k} {v:.4g}" for k, v in r.items())),
        ("scale exp", f"{exps}  (exponent:blocks)"),
    ])


def run_stats(args: argparse.Namespace) -> int:
    from mxcheck.recipes import get_recipe  # noqa: PLC0415
    from mxcheck.scaling import DelayedScaling  # noqa: PLC0415
    from mxcheck.stats import block_stats  # noqa: PLC0415

    spec = get_recipe(args.recipe).spec(args.operand)
    if not spec.quantized:
        raise CommandError(f"recipe {args.recipe} keeps {args.operand} in {spec.fmt} (scaling 'none'): "
                           "it has no blocks or scales")
    results = {}
    for name, t in _stats_tensors(args).items():
        state = None
        if spec.scaling == "delayed":
            # A history holding this tensor's own amax: delayed scaling's steady state.
            state = DelayedScaling(spec.fmt, margin=spec.margin)
            state.quantize(t)
        try:
            results[name] = block_stats(t, spec, generator=torch.Generator().manual_seed(args.seed),
                                        state=state)
        except (TypeError, ValueError) as e:  # a dtype or shape the spec cannot take
            raise CommandError(f"{name}: {e}") from None
    if args.json:
        _out(_json({"recipe": args.recipe, "operand": args.operand,
                    "tensors": {k: s.to_json() for k, s in results.items()}}))
        return 0
    head = (f"recipe {args.recipe} operand {args.operand}: {spec.fmt} {spec.scaling}"
            + (f" scale rule {spec.scale_rule}" if spec.scaling == "mx" else "")
            + (f" hadamard {spec.hadamard}" if spec.hadamard else "") + "\n")
    _out(head + "".join(_stats_text(k, s) for k, s in results.items()))
    return 0


# ---- thresholds ------------------------------------------------------------------------


def _thresholds_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--k", type=_positive_int("k"), nargs="+", default=[256, 3072, 12288], metavar="K",
                   help="contraction lengths to measure. Default: %(default)r")
    p.add_argument("--fmt", nargs="+", default=["e2m1", "e2m3", "e3m2", "e4m3", "e5m2"], metavar="FMT",
                   help="MX element formats. Default: %(default)r")
    p.add_argument("--rows", type=_positive_int("rows"), default=128, metavar="N",
                   help="rows of each randn operand. Default: %(default)r")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="input seed. Default: %(default)r")
    _add_json_flag(p)


def run_thresholds(args: argparse.Namespace) -> int:
    from mxcheck import thresholds as th  # noqa: PLC0415

    try:
        rows = th.threshold_table(tuple(args.fmt), ks=tuple(args.k), rows=args.rows, seed=args.seed)
    except ValueError as e:
        raise CommandError(str(e)) from None
    floors = {"quantize": th.QUANTIZE_FLOORS, "gemm": th.GEMM_FLOORS, "linear": th.LINEAR_SNR_FLOORS}
    if args.json:
        _out(_json({"measured": [dict(r.__dict__, margin_db=r.margin_db) for r in rows],
                    "floors": {kind: {k: {"db": f.db, "reason": f.reason} for k, f in table.items()}
                               for kind, table in floors.items()},
                    "bgrad_floor_db": th.BGRAD_FLOOR_DB}))
        return 0
    table = [["fmt", "rule", "K", "quantize dB", "floor", "GEMM dB", "floor", "fp32 acc. ceiling dB", "margin"]]
    table += [[r.fmt, r.scale_rule, str(r.k), f"{r.quantize_snr_db:.2f}", f"{r.quantize_floor_db:.1f}",
               f"{r.gemm_snr_db:.2f}", f"{r.gemm_floor_db:.1f}", f"{r.accumulation_ceiling_db:.1f}",
               f"{r.margin_db:+.2f}"] for r in rows]
    lines = [f"Measured SNR against float64 on randn ({args.rows} x K, seed {args.seed}) and the floors the "
             "suite asserts:", _table(table)]
    for kind, entries in floors.items():
        lines.append(f"{kind} floors:")
        lines.append(_table([[key, f"{f.db:.1f} dB", f.reason] for key, f in entries.items()]))
    lines.append(f"bias gradient floor: {th.BGRAD_FLOOR_DB:.1f} dB\n")
    _out("\n".join(lines))
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
    "lint": Command("check a Flux training recipe (and launch env); exit 1 on an error",
                    _lint_args, run_lint),
    "tuned-coverage": Command("which Flux GEMM shapes an AITER tuned CSV covers; exit 1 if "
                              "any is missing", _tuned_coverage_args, run_tuned_coverage),
    "shapes": Command("every Flux linear's fwd/dgrad/wgrad GEMM (M, N, K)", _shapes_args, run_shapes),
    "sweep": Command("every unique Flux linear shape through each recipe, SNR against float64 "
                     "truth; exit 1 on a failed record", _sweep_args, run_sweep_command),
    "thresholds": Command("measured SNR per format, scale rule and K, with the floors the suite "
                          "uses", _thresholds_args, run_thresholds),
    "aiter-log": Command("count AITER tuned-config hits and misses per shape; exit 1 on a "
                         "miss", _aiter_log_args, run_aiter_log),
    "stats": Command("per-block statistics of a quantized operand (saturation, flush to zero, "
                     "scale exponents, block SNR)", _stats_args, run_stats),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="mxcheck: numerics checks for low-precision "
                     "training. Exit codes: 0 ok, 1 regression (compare) or failed check (lint, "
                     "tuned-coverage, aiter-log), 2 bad usage or input.")
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
    except Exception as e:  # never a traceback, never exit 1 (1 means a regression/finding)
        message = " ".join(f"{type(e).__name__}: {e}".split())
        print(f"{PROG} {args.command}: error: {_inputs(args)}unexpected {message} "
              "(a bug in mxcheck or an input it does not handle)", file=sys.stderr)
        return 2


def _inputs(args: argparse.Namespace) -> str:
    """"on input=r.json, md=out.md: " for the files a command was given, else ""."""
    paths = [(dest, value) for dest, value in vars(args).items() if isinstance(value, Path)]
    if not paths:
        return ""
    return "on " + ", ".join(f"{dest}={value}" for dest, value in paths) + ": "
