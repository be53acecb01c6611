"""The collector: the run's backends, claims, records and skips; it writes the report, compares
it with a baseline and prints the summary. Records reach it on each test report's
``user_properties``, so pytest-xdist carries them from the workers to the controller, which
alone writes."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from mxcheck import backends as backend_registry
from mxcheck import hardware, run_guard
from mxcheck.backends.contract import MissingDependency
from mxcheck.plugin.keys import RECORD_KEY, SEEDED_FIXTURES, WITNESS_DRIFT
from mxcheck.plugin.repeat import repeat_and_compare
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

__all__ = ["Collector", "skip_as"]


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
            repeat_and_compare(item, runs)

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
