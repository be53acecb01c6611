"""The mxcheck pytest plugin (entry point ``pytest11``): markers, hardware skips, backends,
the ``numerics`` fixture, and one merged SNR report per run.

The hooks wire; the :class:`Collector` owns records, skips, the report and the baseline.
Records travel on each test report's ``user_properties``, so pytest-xdist carries them
from the workers to the controller, which alone writes the report.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

from mxcheck import backends as backend_registry
from mxcheck import hardware, run_guard
from mxcheck.backends.contract import MissingDependency
from mxcheck.cli import add_max_drop_option
from mxcheck.cli.common import add_allow_incomplete_option
from mxcheck.deps import REQUIRE_DEPS_ENV, export_require_deps, needs
from mxcheck.diagnose.dump import DUMP_ENV
from mxcheck.report import (
    Record,
    Report,
    ReportError,
    collect_environment,
    compare,
    format_comparison,
)
from mxcheck.report.compare import require_complete
from mxcheck.report.outcomes import (
    PARAMS_KEY,
    SKIP_KIND_KEY,
    SKIP_KINDS,
    counts_text,
    not_run_lines,
    outcome_record,
    skip_summary,
)

__all__ = ["COLLECTOR", "RECORD_KEY", "REQUIRE_DEPS_ENV", "SKIP_KINDS", "WITNESS_DRIFT", "Collector", "add_options",
           "needs", "skip_as"]

COLLECTOR = pytest.StashKey["Collector"]()
RECORD_KEY = "mxcheck_record"
SEEDED_FIXTURES = frozenset({"mxcheck_generator", "mxcheck_seed"})
# An xfail whose reason starts so is a witness library (ml_dtypes, torch, gfloat, torchao)
# newer than the versions a test pinned, answering differently: counted in the report.
WITNESS_DRIFT = "witness drift:"


# ------------------------------------------------------------------ options


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


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mxcheck", "mxcheck numerics checks")
    add_options(group.addoption)
    _add_require_deps_option(group.addoption)
    _add_seeded_only_option(group.addoption)
    _add_recipe_option(group.addoption)
    _add_dump_option(group.addoption)
    # run guard (mxcheck/run_guard.py): timeouts; incomplete reports are no baselines
    run_guard.add_timeout_option(group.addoption)
    add_allow_incomplete_option(group.addoption, "--mxcheck-")


# ------------------------------------------------------------------ configure


def pytest_configure(config: pytest.Config) -> None:
    for name, text in hardware.MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker:  # before any test touches the GPU: one device per xdist worker
        os.environ.update(hardware.pin_worker(worker, hardware.detect_without_init(), dict(os.environ)))
    export_require_deps(config)
    if config.getoption("--mxcheck-dump", None):  # read where a check fails (mxcheck.diagnose.dump)
        os.environ[DUMP_ENV] = str(Path(config.getoption("--mxcheck-dump")).resolve())
    collector = config.stash[COLLECTOR] = Collector.from_config(config)
    config.pluginmanager.register(collector, "mxcheck-collector")
    run_guard.register(config)  # timeouts, crashed workers, SIGTERM/SIGINT


class Collector:
    """Holds the run's backends, records and skips; writes and compares the report."""

    def __init__(self, config: pytest.Config, backends: list[Any], recipes: list[Any] | None = None) -> None:
        self.config = config
        self.backends = backends
        self.recipes = recipes or []  # from --mxcheck-recipe: claims for every backend
        self.records: list[Record] = []
        self.skipped: list[dict[str, str]] = []
        self.witness_drifts: list[dict[str, str]] = []
        self.comparison_text: str | None = None
        self.baseline: Report | None = None  # loaded at configure, so a bad file fails first

    @classmethod
    def from_config(cls, config: pytest.Config) -> Collector:
        names = config.getoption("mxcheck_backend") or ["emulated"]
        loaded = []
        for name in names:
            try:
                loaded.append(backend_registry.get(name))
            except backend_registry.BackendLoadError as e:
                raise pytest.UsageError(f"--mxcheck-backend: {e}") from e
        from mxcheck.recipe_files import resolve_recipe  # noqa: PLC0415  (recipes load torch's stack)

        recipes = []
        for claim in config.getoption("mxcheck_recipe"):
            try:
                recipes.append(resolve_recipe(claim))
            except ValueError as e:
                raise pytest.UsageError(f"--mxcheck-recipe {claim}: {e}") from e
        collector = cls(config, loaded, recipes)
        if not collector.is_worker:  # the controller alone writes and compares
            _check_report_path(config.getoption("mxcheck_report"))
            collector.baseline = _load_baseline(config.getoption("mxcheck_baseline"),
                                                config.getoption("mxcheck_allow_incomplete_baseline"))
        return collector

    @property
    def is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    # ---- selection and skips

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "claim" in metafunc.fixturenames:  # the conformance suite: each backend x what it claims
            from mxcheck.conformance.claims import claims_of  # noqa: PLC0415

            pairs = [(b, c) for b in self.backends for c in claims_of(b, self.recipes)]
            metafunc.parametrize(("backend", "claim"), pairs, ids=[f"{b.name}-{c.recipe.name}" for b, c in pairs])
        elif "backend" in metafunc.fixturenames:
            metafunc.parametrize("backend", self.backends, ids=[b.name for b in self.backends])

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        # Skips are marked at collection, so a skip's reported location is the test itself.
        hw = hardware.detect()
        for item in items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            backend = params.get("backend")
            recipe = params["claim"].recipe if "claim" in params else params.get("recipe")
            # What a failed test without records is filed under in the report; carried on the
            # report itself, so an xdist controller (which collects nothing) sees it too.
            item.user_properties.append((PARAMS_KEY, [getattr(backend, "name", None) or "n/a",
                                                      str(getattr(recipe, "name", recipe) if recipe else "n/a")]))
            reason = self._why_not_here(item, hw)
            if isinstance(reason, MissingDependency) and config.getoption("mxcheck_require_deps"):
                _fail_instead(item, f"{reason}; --mxcheck-require-deps: a selected backend's dependency "
                                    "must be installed at a version it supports")
            elif reason:
                item.user_properties.append((SKIP_KIND_KEY, "unavailable"))
                item.add_marker(pytest.mark.skip(reason=reason))
        if config.getoption("mxcheck_seeded_only"):
            # Only these change with --mxcheck-seed: the flake hunt (tools/seed_sweep.sh) runs them.
            _keep_only(config, items, lambda fixtures: bool(SEEDED_FIXTURES & set(fixtures)))
        runs = config.getoption("mxcheck_deterministic_only")
        if not runs:
            return
        _keep_only(config, items, lambda fixtures: "numerics" in fixtures)
        for item in items:
            _repeat_and_compare(item, runs)

    @staticmethod
    def _why_not_here(item: pytest.Item, hw: hardware.Hardware) -> str | None:
        for marker in item.iter_markers():
            reason = hardware.missing(marker.name, hw)
            if reason:
                return reason
        backend = getattr(item, "callspec", None) and item.callspec.params.get("backend")
        if backend is not None:
            ok, why = backend.available()
            if not ok:
                text = f"backend {backend.name}: {why}"
                # keep the kind: --mxcheck-require-deps fails a dependency, skips the rest
                return MissingDependency(why.package, why.needed, why.found, detail=text) \
                    if isinstance(why, MissingDependency) else text
        return None

    # ---- records

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            recs = [Record.from_json(v) for k, v in report.user_properties if k == RECORD_KEY]
            self.records += recs
        # A test that failed outside a recorded comparison, errored, crashed or timed out is a
        # record too (report/outcomes.py): a summary never says "0 failed" over a red run.
        outcome = outcome_record(report, recs if report.when == "call" else [])
        if outcome is not None:
            self.records.append(outcome)
        if report.skipped and not hasattr(report, "wasxfail"):
            kind = next((v for k, v in report.user_properties if k == SKIP_KIND_KEY), "other")
            self.skipped.append({"test_id": report.nodeid, "reason": _skip_reason(report), "kind": kind})
        if str(getattr(report, "wasxfail", "")).startswith(WITNESS_DRIFT):
            self.witness_drifts.append({"test_id": report.nodeid, "reason": report.wasxfail})

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        # A module skipped at import (a missing package) has no test reports: list it too.
        # Under xdist the controller gets each such skip once (xdist drops the other workers').
        if report.skipped:
            self.skipped.append({"test_id": report.nodeid, "reason": _skip_reason(report), "kind": "other"})

    def report(self) -> Report:
        seed = self.config.getoption("mxcheck_seed")
        env = collect_environment(seed=seed, backends=[b.name for b in self.backends],
                                  cwd=str(self.config.rootpath))
        return Report(environment=env, records=self.records, skipped=self.skipped,
                      witness_drifts=self.witness_drifts)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.is_worker:
            return
        report = self.report()
        run_guard.stamp_run(self.config, report, session)  # exit status; complete or why not
        path = self.config.getoption("mxcheck_report")
        if path:
            report.save(path)
        if self.baseline is not None:
            result = compare(self.baseline, report, self.config.getoption("mxcheck_max_drop_db"))
            self.comparison_text = format_comparison(result)
            if not result.ok:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        missing = _missing_packages(s["reason"] for s in self.skipped)
        if self.is_worker or not (self.records or self.comparison_text or self.witness_drifts or missing
                                  or self.skipped):
            return
        tr = terminalreporter
        tr.section("mxcheck")
        tr.write_line(f"{counts_text(self.records, 'numeric checks')}, "
                      f"{len(self.witness_drifts)} witness drifts")
        if self.skipped:
            tr.write_line(f"{len(self.skipped)} tests skipped: {skip_summary(self.skipped)}")
            for line in not_run_lines(self.skipped):  # what the backend lacks, once per reason
                tr.write_line(line)
        for d in sorted(self.witness_drifts, key=lambda d: d["test_id"]):
            tr.write_line(f"{d['test_id']}: {d['reason']}")
        if missing:
            tr.write_line(f"missing packages (their tests skipped): {', '.join(missing)}")
        if self.config.getoption("mxcheck_report"):
            tr.write_line(f"report: {self.config.getoption('mxcheck_report')}")
        if self.comparison_text:
            tr.write_line(self.comparison_text)


def skip_as(node: pytest.Item, kind: str, reason: str) -> None:
    """Skip the running test as ``kind`` (one of SKIP_KINDS), so the summary counts it apart."""
    if kind not in SKIP_KINDS:
        raise ValueError(f"kind={kind!r}; expected one of {list(SKIP_KINDS)}")
    node.user_properties.append((SKIP_KIND_KEY, kind))
    pytest.skip(reason)


def _fail_instead(item: pytest.Item, reason: str) -> None:
    """Make ``item`` fail with ``reason`` when run (instead of skipping it)."""
    def runtest() -> None:
        pytest.fail(reason, pytrace=False)

    item.runtest = runtest  # type: ignore[method-assign]


def _check_report_path(path: str | None) -> None:
    """UsageError at configure, not after every test ran, if no report can be written there.

    ``Report.save`` writes a temporary file beside ``path`` and renames it, so the directory
    must exist and be writable; ``path`` itself need not exist.
    """
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise pytest.UsageError(f"--mxcheck-report {path}: is a directory; give a file path, "
                                f"e.g. {target / 'mxcheck-report.json'}")
    if not target.parent.is_dir():
        raise pytest.UsageError(f"--mxcheck-report {path}: directory {target.parent} does not "
                                "exist; create it first")
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise pytest.UsageError(f"--mxcheck-report {path}: directory {target.parent} is not "
                                "writable")


def _load_baseline(path: str | None, allow_incomplete: bool = False) -> Report | None:
    """The baseline report, or UsageError at configure naming the option, file and problem
    (an incomplete report is one, unless ``allow_incomplete``)."""
    if not path:
        return None
    try:
        base = Report.load(path)
        if not allow_incomplete:
            require_complete(base, path, "pass --mxcheck-allow-incomplete-baseline to use it anyway")
        return base
    except ReportError as e:  # says "<path>: cannot read report: ..." or what is invalid
        raise pytest.UsageError(f"--mxcheck-baseline: {e}") from None


_NO_MODULE = re.compile(r"No module named '([^'.]+)")  # ModuleNotFoundError's own wording


def _missing_packages(reasons: Iterable[str]) -> list[str]:
    """The top-level packages that skip reasons say are not installed, sorted."""
    return sorted({m.group(1) for reason in reasons for m in _NO_MODULE.finditer(reason)})


def _keep_only(config: pytest.Config, items: list[pytest.Item], wanted: Callable[[tuple[str, ...]], bool]) -> None:
    """Deselect (as -k does, reported as deselected) every item whose fixtures are not wanted."""
    keep = [i for i in items if wanted(tuple(getattr(i, "fixturenames", ())))]
    drop = [i for i in items if i not in keep]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _repeat_and_compare(item: pytest.Item, runs: int) -> None:
    """Make item run ``runs`` times; its recorded results must be identical each time."""
    original = item.runtest

    def runtest() -> None:
        # Every run starts from the same generator states, so only the code under test varies.
        funcargs = getattr(item, "funcargs", {})
        gens = {k: v.get_state() for k, v in funcargs.items() if isinstance(v, torch.Generator)}
        seen = []
        for i in range(runs):
            for k, state in gens.items():
                funcargs[k].set_state(state)
            start = len(item.user_properties)
            original()
            recs = [v for k, v in item.user_properties[start:] if k == RECORD_KEY]
            seen.append([(r.get("kind"), r.get("layer"), r.get("direction"), r.get("snr_db"),
                          r.get("extra", {}).get("digest")) for r in recs])
            if i:
                del item.user_properties[start:]  # the report keeps the first run's records
        for i, got in enumerate(seen[1:], start=2):
            if got != seen[0]:
                from mxcheck.assertions import NumericsError  # noqa: PLC0415

                first = next((a, b) for a, b in zip(seen[0], got, strict=False) if a != b) \
                    if len(got) == len(seen[0]) else (f"{len(seen[0])} records", f"{len(got)} records")
                raise NumericsError(f"not deterministic: run {i} of {runs}: {_describe(first[0])} differs: "
                                    f"run 1 {first[0]!r}, run {i} {first[1]!r}")

    item.runtest = runtest  # type: ignore[method-assign]


def _describe(entry: Any) -> str:
    if isinstance(entry, tuple):
        kind, layer, direction = entry[:3]
        return " ".join(str(p) for p in (kind, "check", layer, direction) if p)
    return str(entry)


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def mxcheck_seed(request: pytest.FixtureRequest) -> int:
    """The run's --mxcheck-seed."""
    return request.config.getoption("mxcheck_seed")


@pytest.fixture
def mxcheck_generator(request: pytest.FixtureRequest, mxcheck_seed: int) -> torch.Generator:
    """A CPU torch.Generator seeded from the run seed and the test id: independent per test,
    identical between runs and between xdist workers."""
    digest = hashlib.sha256(f"{mxcheck_seed}:{request.node.nodeid}".encode()).digest()
    g = torch.Generator()
    g.manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return g


@pytest.fixture
def numerics(request: pytest.FixtureRequest) -> Any:
    """Assertions (an ``mxcheck.report.recorder.Numerics``) that record each comparison into
    the run's report."""
    from mxcheck.report.recorder import Numerics  # noqa: PLC0415  (keeps plugin import light)

    node = request.node
    backend = getattr(node, "callspec", None) and node.callspec.params.get("backend")

    def record(r: Record) -> None:
        node.user_properties.append((RECORD_KEY, r.to_json()))

    return Numerics(record, node.nodeid, backend=backend.name if backend is not None else "emulated")
