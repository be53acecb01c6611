"""``mxcheck search``: a Hypothesis search for the smallest inputs on which a backend differs
from the oracle, each finding written as a reproducer (``mxcheck.conformance.search``); it
goes past a finding whose cause is known, and takes what is known already (``--known``, or a
fitted recipe file as ``--recipe``). ``mxcheck conform --search SECONDS`` runs it after the
suite."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mxcheck.cli.common import CommandError, out

__all__ = ["backend_factory", "parse_seconds", "resolve_search_recipes", "run_search", "run_searches", "search_args"]

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
    p.add_argument("--known", action="append", default=[], metavar="BEHAVIOUR",
                   help="a catalogue behaviour the kernel is known to have (repeatable; 'a & b' for a "
                        "combination): the quantize property takes it as the oracle's own and looks for what "
                        "is left. Default: %(default)r")


def search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", required=True, metavar="NAME|pkg.mod:factory",
                   help="backend under test: a registered name, a mxcheck.backends.known_bad name, or "
                        "'pkg.module:factory'")
    p.add_argument("--recipe", action="append", required=True, metavar="NAME|FILE",
                   help="recipe to search (repeatable; each gets --seconds): a built-in name, RECIPE@PROFILE, "
                        "a .yaml/.toml recipe file (a fitted one from mxcheck fit --write takes the kernel's "
                        "conventions as known) or FILE@PROFILE")
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


def resolve_search_recipes(names: list[Any]) -> list[tuple[str, Any]]:
    """(what a reproducer passes as the recipe, the Recipe) for each name, file, FILE@PROFILE
    or Recipe; a recipe file's path is made absolute (the reproducer runs from its own
    directory). CommandError names a recipe that is not known, before anything runs."""
    from mxcheck.recipe_files import RECIPE_FILE_SUFFIXES, resolve_recipe  # noqa: PLC0415

    out = []
    for name in names:
        try:
            recipe = resolve_recipe(name)
        except (ValueError, TypeError, OSError) as e:
            raise CommandError(str(e)) from None
        text = name if isinstance(name, str) else recipe.name
        base, at, profile = text.rpartition("@") if "@" in text else (text, "", "")
        if base.endswith(RECIPE_FILE_SUFFIXES):
            text = str(Path(base).resolve()) + at + profile
        out.append((text, recipe))
    return out


def run_searches(backends: list[str], recipes: list[Any], seconds: float, seed: int, args: argparse.Namespace) -> int:
    """Search each backend on each recipe; print each finding and its reproducer. 1 if any, or
    if no property judged an input (the backend unavailable, supporting none of the recipes,
    or refusing every input)."""
    try:
        from mxcheck.conformance.search import PROPERTIES, require_hypothesis, search  # noqa: PLC0415
        from mxcheck.conformance.search_judge import known_behaviours  # noqa: PLC0415
        from mxcheck.conformance.search_repro import write_reproducer  # noqa: PLC0415

        require_hypothesis()
    except ImportError as e:
        raise CommandError(str(e)) from None
    known = list(getattr(args, "known", None) or [])
    try:
        known_behaviours(known)
    except ValueError as e:
        raise CommandError(f"--known: {e}") from None
    resolved = resolve_search_recipes(recipes)
    found = judged = 0
    for spec in backends:
        factory_spec, factory = backend_factory(spec)
        for text, recipe in resolved:
            result = search(factory, recipe, seconds=seconds, seed=seed, properties=args.properties or PROPERTIES,
                            known=known)
            out(_summary(result))
            judged += sum(result.judged(p) for p in result.examples)
            index: dict[str, int] = {}
            for f in result.findings:
                where = write_reproducer(f, factory_spec, text, args.out / "repro", seed=seed, recipe_name=recipe.name,
                                         index=index.get(f.prop, 0))
                index[f.prop] = index.get(f.prop, 0) + 1
                found += 1
                cause = f"cause: {f.cause.describe()}" if f.cause is not None else \
                    "cause: no one known behaviour reproduces it exactly (the property stops here)"
                out(f"\nfinding {found}: {f.prop}; {cause}\n{f.message}\n\nreproducer: python {where / 'repro.py'} "
                    f"(input {_size(f.size)})\n")
    if not judged:  # a backend that never ran must not read as green
        out("mxcheck search: nothing was searched (no property judged an input on any backend and recipe; the "
            "reasons are above)")
        return 1
    return 1 if found else 0


def _size(size: dict[str, Any]) -> str:
    shapes = ", ".join(f"{n} {'x'.join(map(str, s))}" for n, s in size["shapes"].items())
    return f"{shapes}; {size['blocks']} block(s) per operand at most; {size['nonzeros']} nonzero values"


def _summary(result: Any) -> str:
    parts = []
    for p in result.examples:
        found = [f for f in result.findings if f.prop == p]
        text = f"{p}: {result.examples[p]} examples, {result.rate(p):.0f}/s"
        text += "".join(f", FOUND after {f.seconds:.1f} s ({f.examples} examples)" for f in found)
        if result.refused.get(p):
            text += f", {result.refused[p]} refused (declared: {result.refusal[p]})"
        parts.append(text)
    parts += [f"{p}: not run ({why})" for p, why in result.skipped.items()]
    known = f", known: {', '.join(result.known)}" if result.known else ""
    return f"mxcheck search: backend {result.backend}, recipe {result.recipe}, seed {result.seed}{known}: " \
           + "; ".join(parts) + "\n"


def run_search(args: argparse.Namespace) -> int:
    return run_searches([args.backend], list(args.recipe), args.seconds, args.seed, args)
