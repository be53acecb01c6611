"""``mxcheck conform``: the installed conformance suite on a backend, from any directory.

It runs ``pytest --pyargs mxcheck.conformance.suite`` with the mxcheck options, so the result
and the report are the ones a pytest run gives; exit 1 also when nothing was judged (every
test skipped), so a backend that supports none of its claims never reads as green.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from mxcheck.cli.common import CommandError
from mxcheck.cli.search import add_search_options, parse_seconds, run_searches
from mxcheck.recipe_files import RECIPE_FILE_SUFFIXES

__all__ = ["conform_args", "pytest_args", "run_conform"]

SUITE = "mxcheck.conformance.suite"


def conform_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", action="append", required=True, metavar="NAME|pkg.mod:factory",
                   help="backend under test (repeatable): a registered name or 'pkg.module:factory'")
    p.add_argument("--recipe", action="append", default=[], metavar="NAME|FILE",
                   help="recipe to judge it on (repeatable): built-in name, RECIPE@PROFILE or a .yaml/.toml "
                        "recipe file; without it, the backend's claims, else every built-in recipe. "
                        "Default: %(default)r")
    p.add_argument("--report", metavar="PATH", help="write the JSON report here")
    p.add_argument("--dump", metavar="DIR", help="write every differing block of every failing quantize comparison "
                   "to DIR (--mxcheck-dump; load with mxcheck.diagnose.load_dump(DIR))")
    p.add_argument("--full-trace", action="store_true",
                   help="a failing check shows pytest's whole traceback, mxcheck's own check code included "
                        "(--mxcheck-full-trace), instead of its verdict alone. Default: %(default)r")
    p.add_argument("--seed", type=int, default=0, metavar="INT",
                   help="seed mixed into every test's generator (--mxcheck-seed). Default: %(default)r")
    p.add_argument("-n", "--workers", default=None, metavar="N",
                   help="pytest-xdist workers ('auto' or a number); none runs in one process. Default: %(default)r")
    p.add_argument("--require-deps", action="store_true",
                   help="a backend dependency that is missing or at a version it does not support fails "
                        "instead of skipping. Default: %(default)r")
    p.add_argument("--search", type=parse_seconds, default=None, metavar="SECONDS",
                   help="after the suite, search each backend on each --recipe (or, without one, on its "
                        "claims) for SECONDS per recipe with Hypothesis (mxcheck search); a finding is exit 1. "
                        "Default: %(default)r")
    add_search_options(p)
    p.add_argument("pytest_extra", nargs=argparse.REMAINDER, metavar="-- PYTEST_ARGS",
                   help="anything after -- goes to pytest (e.g. -- -k quantize -x)")


def pytest_args(args: argparse.Namespace, report: str) -> list[str]:
    """The pytest command line ``mxcheck conform`` runs."""
    out = ["--pyargs", SUITE, "-p", "no:cacheprovider", "--rootdir", str(Path(report).parent),
           "-o", "addopts=", "--strict-markers", "-ra",
           # this command imported mxcheck before pytest could register it for assertion rewriting
           "-W", "ignore::pytest.PytestAssertRewriteWarning", "--mxcheck-seed", str(args.seed)]
    if args.report:  # else none: a report in the temporary directory would be gone when printed
        out += ["--mxcheck-report", report]
    for b in args.backend:
        out += ["--mxcheck-backend", b]
    for r in args.recipe:
        out += ["--mxcheck-recipe", str(Path(r).resolve()) if Path(r).suffix in RECIPE_FILE_SUFFIXES else r]
    if args.workers:
        out += ["-p", "xdist", "-n", str(args.workers)]
    if args.require_deps:
        out.append("--mxcheck-require-deps")
    if getattr(args, "full_trace", False):
        out.append("--mxcheck-full-trace")
    if getattr(args, "dump", None):
        out += ["--mxcheck-dump", str(Path(args.dump).resolve())]
    extra = list(args.pytest_extra)
    return out + (extra[1:] if extra[:1] == ["--"] else extra)


class _Passed:
    """Counts the suite's tests that passed: a check that ran and passed judged the backend
    even where it records nothing (check_gemm raises or returns). With xdist the workers'
    reports reach this hook on the controller."""

    def __init__(self) -> None:
        self.count = 0

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call" and report.passed:
            self.count += 1


def run_conform(args: argparse.Namespace) -> int:
    import pytest  # noqa: PLC0415  (only this command needs pytest)

    # the search's recipes are resolved first: a missing one is a usage error before the suite runs
    search_recipes = _search_recipes(args) if args.search is not None else []
    with tempfile.TemporaryDirectory(prefix="mxcheck-conform-") as tmp:
        report = str(Path(args.report).resolve()) if args.report else str(Path(tmp) / "report.json")
        if args.report and not Path(report).parent.is_dir():
            raise CommandError(f"--report {args.report}: directory {Path(report).parent} does not exist")
        passed = _Passed()
        code = int(pytest.main(pytest_args(args, report), plugins=[passed]))
    if code == 0 and not passed.count:
        print("mxcheck conform: nothing was judged (every test skipped; the reasons are above). A backend "
              "must support at least one recipe it is run on.")
        code = 1
    if args.search is not None and code in (0, 1):  # the suite ran (passed or failed): search too
        found = run_searches(args.backend, search_recipes, args.search, args.seed, args)
        code = max(code, found)
    return code


def _search_recipes(args: argparse.Namespace) -> list[Any]:
    """The recipes ``--search`` runs on: --recipe's (names, files, FILE@PROFILE), else the
    first backend's declared claims, each resolved here so that one that is not known is a
    usage error before the suite runs. A backend that claims nothing is searched on no
    recipe: name one with --recipe."""
    from mxcheck.cli.search import backend_factory, resolve_search_recipes  # noqa: PLC0415

    if args.recipe:
        names = list(args.recipe)
    else:
        names = list(getattr(backend_factory(args.backend[0])[1](), "claims", None) or [])
        if not names:
            raise CommandError("--search needs a recipe: give --recipe NAME (the backend declares no claims)")
    resolve_search_recipes(names)
    return names
