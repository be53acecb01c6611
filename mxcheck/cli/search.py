"""``mxcheck search``: a Hypothesis search for the smallest input on which a backend differs
from the oracle, written as a reproducer (``mxcheck.conformance.search``). ``mxcheck conform
--search SECONDS`` runs it after the suite."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mxcheck.cli.common import CommandError, out

__all__ = ["backend_factory", "parse_seconds", "run_search", "run_searches", "search_args"]

DEFAULT_OUT = ".mxcheck"  # under the current directory, never in the package


def parse_seconds(text: str) -> float:
    """A search budget: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"seconds must be a number > 0, got {text!r}")
    return value


def _properties(text: str) -> list[str]:
    from mxcheck.conformance.search import PROPERTIES  # noqa: PLC0415

    names = [p for p in text.split(",") if p]
    bad = [p for p in names if p not in PROPERTIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"properties {text!r}: expected a comma-separated list of "
                                         f"{', '.join(PROPERTIES)}")
    return names


def add_search_options(p: argparse.ArgumentParser) -> None:
    """The options ``search`` and ``conform --search`` share."""
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                   help="where reproducers go (DIR/repro/BACKEND-RECIPE-PROPERTY/repro.py). Default: %(default)r")
    p.add_argument("--properties", type=_properties, default=None, metavar="P[,P]",
                   help="which properties to search: quantize, gemm, linear. Default: all the backend offers")


def search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", required=True, metavar="NAME|pkg.mod:factory",
                   help="backend under test: a registered name, a mxcheck.backends.known_bad name, or "
                        "'pkg.module:factory'")
    p.add_argument("--recipe", action="append", required=True, metavar="NAME",
                   help="recipe to search (repeatable; the time is split between them): built-in name or "
                        "RECIPE@PROFILE")
    p.add_argument("--seconds", type=parse_seconds, default=60.0, metavar="S",
                   help="search time per recipe (a turn in progress finishes, and shrinking a failure "
                        "takes its own time). Default: %(default)r")
    p.add_argument("--seed", type=int, default=0, metavar="INT",
                   help="the search's seed: the same seed tries the same inputs. Default: %(default)r")
    add_search_options(p)


def backend_factory(spec: str) -> tuple[str, Callable[[], Any]]:
    """(the spec a reproducer passes to ``mxcheck.backends.get``, a factory). A
    ``known_bad`` name becomes ``mxcheck.backends.known_bad:Class``."""
    from mxcheck.backends import BackendLoadError, get  # noqa: PLC0415
    from mxcheck.backends.known_bad import KNOWN_BAD  # noqa: PLC0415

    if spec in KNOWN_BAD:
        spec = f"mxcheck.backends.known_bad:{KNOWN_BAD[spec].__name__}"
    try:
        get(spec)
    except BackendLoadError as e:
        raise CommandError(str(e)) from None
    return spec, lambda: get(spec)


def run_searches(backends: list[str], recipes: list[str], seconds: float, seed: int, args: argparse.Namespace) -> int:
    """Search each backend on each recipe; print each finding and its reproducer. 1 if any, or
    if no property ran at all (the backend unavailable, or supporting none of the recipes)."""
    try:
        from mxcheck.conformance.search import PROPERTIES, require_hypothesis, search  # noqa: PLC0415
        from mxcheck.conformance.search_repro import write_reproducer  # noqa: PLC0415

        require_hypothesis()
    except ImportError as e:
        raise CommandError(str(e)) from None
    from mxcheck.recipes import get_recipe  # noqa: PLC0415

    found = judged = 0
    for spec in backends:
        factory_spec, factory = backend_factory(spec)
        for name in recipes:
            try:
                recipe = get_recipe(name)
            except ValueError as e:
                raise CommandError(str(e)) from None
            result = search(factory, recipe, seconds=seconds, seed=seed, properties=args.properties or PROPERTIES)
            out(_summary(result))
            judged += sum(result.examples.values())
            for f in result.findings:
                where = write_reproducer(f, factory_spec, recipe.name, args.out / "repro", seed=seed)
                out(f"\n{f.message}\n\nreproducer: python {where / 'repro.py'} (input {_size(f.size)})\n")
                found += 1
    if not judged:  # a backend that never ran must not read as green
        out("mxcheck search: nothing was searched (no property ran on any backend and recipe; the reasons "
            "are above)")
        return 1
    return 1 if found else 0


def _size(size: dict[str, Any]) -> str:
    shapes = ", ".join(f"{n} {'x'.join(map(str, s))}" for n, s in size["shapes"].items())
    return f"{shapes}; {size['blocks']} block(s) per operand at most; {size['nonzeros']} nonzero values"


def _summary(result: Any) -> str:
    found = {f.prop: f for f in result.findings}
    parts = [f"{p}: {result.examples[p]} examples, {result.rate(p):.0f}/s"
             + (f", FOUND after {found[p].seconds:.1f} s ({found[p].examples} examples)" if p in found else "")
             for p in result.examples]
    parts += [f"{p}: not run ({why})" for p, why in result.skipped.items()]
    return f"mxcheck search: backend {result.backend}, recipe {result.recipe}, seed {result.seed}: " \
           + "; ".join(parts) + "\n"


def run_search(args: argparse.Namespace) -> int:
    return run_searches([args.backend], list(args.recipe), args.seconds, args.seed, args)
