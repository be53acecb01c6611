"""The table of ``mxcheck`` subcommands, the parser built from it, and ``main``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import mxcheck
from mxcheck.cli import (
    about,
    accuracy,
    analysis,
    conform,
    deploy,
    fit,
    flux,
    recipes,
    reports,
    search,
)
from mxcheck.cli.common import PROG, CommandError

__all__ = ["COMMANDS", "Command", "build_parser", "main"]


class _UsageError(Exception):
    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage block and exits; we want one line and a return code.
    def error(self, message: str) -> NoReturn:
        raise _UsageError(self.prog, message)


@dataclass(frozen=True)
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {
    "conform": Command("run the installed conformance suite on a backend (pytest --pyargs "
                       "mxcheck.conformance.suite); exit 1 on a failure or when nothing was judged",
                       conform.conform_args, conform.run_conform),
    "search": Command("a Hypothesis search for the smallest input on which a backend differs from the "
                      "oracle, written as a reproducer; exit 1 when one is found",
                      search.search_args, search.run_search),
    "info": Command("hardware, packages, backends, and which markers run here",
                    about.info_args, about.run_info),
    "formats": Command("the constants of every element format", about.formats_args,
                       about.run_formats),
    "report": Command("render a JSON report to Markdown (default: stdout) and/or HTML",
                      reports.report_args, reports.run_report),
    "compare": Command("compare two reports; exit 1 on a regression", reports.compare_args,
                       reports.run_compare),
    "divergence": Command("where two profiles give different bits", analysis.divergence_args,
                          analysis.run_divergence),
    "recipes": Command("every built-in recipe: its source and what each operand copy does",
                       recipes.recipes_args, recipes.run_recipes),
    "profiles": Command("the implementation profiles; with NAME, every field of one",
                        recipes.profiles_args, recipes.run_profiles),
    "lint": Command("check a Flux training recipe (and launch env); exit 1 on an error",
                    deploy.lint_args, deploy.run_lint),
    "tuned-coverage": Command("which Flux GEMM shapes an AITER tuned CSV covers; exit 1 if "
                              "any is missing", deploy.tuned_coverage_args,
                              deploy.run_tuned_coverage),
    "shapes": Command("every Flux linear's fwd/dgrad/wgrad GEMM (M, N, K)", flux.shapes_args,
                      flux.run_shapes),
    "sweep": Command("every unique Flux linear shape through each recipe, SNR against float64 "
                     "truth; exit 1 on a failed record", flux.sweep_args, flux.run_sweep_command),
    "thresholds": Command("measured SNR per format, scale rule and K, with the floors the suite "
                          "uses", analysis.thresholds_args, analysis.run_thresholds),
    "aiter-log": Command("count AITER tuned-config hits and misses per shape; exit 1 on a "
                         "miss", deploy.aiter_log_args, deploy.run_aiter_log),
    "fit": Command("the profile (every convention) that reproduces a backend's quantizer, and the blocks "
                   "left; --write pins it in a recipe file", fit.fit_args, fit.run_fit),
    "accuracy": Command("the cause-accuracy benchmark: seeded bugs with their true causes, precision and recall of "
                        "the named cause per class; exit 1 on a wrong headline", accuracy.accuracy_args,
                        accuracy.run_accuracy),
    "stats": Command("per-block statistics of a quantized operand (saturation, flush to zero, "
                     "scale exponents, block SNR)", analysis.stats_args, analysis.run_stats),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="mxcheck: numerics checks for low-precision "
                     "training. Exit codes: 0 ok, 1 regression (compare) or failed check (lint, "
                     "tuned-coverage, aiter-log), 2 bad usage or input.")
    parser.add_argument("--version", action="version", version=f"{PROG} {mxcheck.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show what vendor packages print while they import (default: one line each)")
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
        from mxcheck.backends import collapse_import_output  # noqa: PLC0415
    except ImportError:  # a broken install: the commands that need backends say so
        return _run(args)
    previous = collapse_import_output(not args.verbose)
    try:
        return _run(args)
    finally:  # main() also runs in-process (tests, `mxcheck conform` under pytest)
        collapse_import_output(previous)


def _run(args: argparse.Namespace) -> int:
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
