"""The ``--mxcheck-*`` options: converters that name a bad value, and adders that take
``(addoption, prefix)`` so that ``mxcheck compare`` reuses the shared ones."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import pytest

from mxcheck import run_guard
from mxcheck.cli import add_max_drop_option
from mxcheck.cli.common import add_allow_incomplete_option
from mxcheck.deps import REQUIRE_DEPS_ENV

__all__ = ["add_options", "add_pytest_options", "parse_repeats", "parse_seed"]


def parse_seed(value: str) -> int:
    try:
        return int(value, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer seed, got {value!r}") from None


def parse_repeats(value: str) -> int:
    try:
        v = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of runs >= 2, got {value!r}") from None
    if v < 2:
        raise argparse.ArgumentTypeError(f"needs at least 2 runs to compare, got {value!r}")
    return v


def add_options(addoption: Callable[..., Any], prefix: str = "--mxcheck-") -> None:
    """Add the mxcheck options through ``addoption`` (pytest's, or an argparse one)."""
    addoption(f"{prefix}backend", action="append", default=[], metavar="NAME|pkg.mod:factory",
              help="backend under test, repeatable: a registered name, an entry point of group "
                   "'mxcheck.backends' or 'pkg.module:factory'. Default: emulated")
    addoption(f"{prefix}report", default=None, metavar="PATH",
              help="write the merged JSON report of every numeric check here. Default: %(default)r")
    addoption(f"{prefix}baseline", default=None, metavar="PATH",
              help="compare with this earlier report; an SNR drop beyond --mxcheck-max-drop-db, or "
                   "a check that passed and now fails, fails the run. Default: %(default)r")
    add_max_drop_option(addoption, prefix)
    addoption(f"{prefix}seed", type=parse_seed, default=0, metavar="INT",
              help="seed mixed into every test's generator (with the test id). Default: %(default)r")
    addoption(f"{prefix}deterministic-only", type=parse_repeats, default=None, metavar="N",
              help="run only tests that use the numerics fixture, each N times, and fail any "
                   "whose recorded results differ between runs. Default: %(default)r")


def _add_seeded_only_option(addoption: Callable[..., Any]) -> None:
    addoption("--mxcheck-seeded-only", action="store_true", default=False,
              help="run only tests whose inputs come from --mxcheck-seed (the mxcheck_generator "
                   "or mxcheck_seed fixture): the set a seed sweep varies. Default: %(default)r")


def _add_recipe_option(addoption: Callable[..., Any]) -> None:
    addoption("--mxcheck-recipe", action="append", default=[], metavar="NAME|FILE",
              help="what conformance judges every selected backend on, repeatable: a built-in recipe "
                   "(ocp-mxfp8-e4m3, mxfp8, ...), RECIPE@PROFILE, or a recipe file (.yaml/.toml). "
                   "Default: the backend's own claims, else every built-in recipe it supports")


def _add_full_trace_option(addoption: Callable[..., Any]) -> None:
    addoption("--mxcheck-full-trace", action="store_true", default=False,
              help="a failing conformance check shows pytest's whole traceback (mxcheck's own check code "
                   "included) instead of its verdict alone. Default: %(default)r")


def _add_dump_option(addoption: Callable[..., Any]) -> None:
    addoption("--mxcheck-dump", metavar="DIR", default=None,
              help="write every differing block of every failing quantize comparison to DIR, one .pt per "
                   "comparison (load them with mxcheck.diagnose.load_dump(DIR)); the terminal keeps its summary")


def _add_require_deps_option(addoption: Callable[..., Any]) -> None:
    # pytest-only (not in add_options, which `mxcheck compare` reuses): it acts on collection.
    addoption("--mxcheck-require-deps", action="store_true",
              default=os.environ.get(REQUIRE_DEPS_ENV) == "1",
              help="fail, instead of skip, a test or module whose declared test dependency "
                   "(the [test] extra: ml_dtypes, torchao, gfloat, diffusers, matplotlib) is "
                   f"missing; CI sets it. {REQUIRE_DEPS_ENV}=1 sets it too. Default: %(default)r")


def add_pytest_options(parser: pytest.Parser) -> None:
    """Every option of the plugin, in one group."""
    group = parser.getgroup("mxcheck", "mxcheck numerics checks")
    add_options(group.addoption)
    _add_require_deps_option(group.addoption)
    _add_seeded_only_option(group.addoption)
    _add_recipe_option(group.addoption)
    _add_dump_option(group.addoption)
    _add_full_trace_option(group.addoption)
    # run guard (mxcheck/run_guard.py): timeouts; incomplete reports are no baselines
    run_guard.add_timeout_option(group.addoption)
    add_allow_incomplete_option(group.addoption, "--mxcheck-")
