"""The mxcheck pytest plugin (entry point ``pytest11``): markers, hardware skips, backends,
the ``numerics`` fixture, and one merged SNR report per run.

The hooks here wire; each idea is its own module: ``options`` (the ``--mxcheck-*`` options),
``collector`` (records, skips, the report and the baseline), ``failures`` (a failing
conformance check prints its verdict), ``repeat`` (``--mxcheck-deterministic-only``).
Records travel on each test report's ``user_properties``, so pytest-xdist carries them
from the workers to the controller, which alone writes the report.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from mxcheck import hardware, run_guard
from mxcheck.deps import REQUIRE_DEPS_ENV, export_require_deps, needs
from mxcheck.diagnose.dump import DUMP_ENV
from mxcheck.plugin.collector import Collector, skip_as
from mxcheck.plugin.failures import short_report
from mxcheck.plugin.keys import RECORD_KEY, WITNESS_DRIFT
from mxcheck.plugin.options import add_options, add_pytest_options
from mxcheck.report import Record
from mxcheck.report.outcomes import SKIP_KINDS

__all__ = ["COLLECTOR", "RECORD_KEY", "REQUIRE_DEPS_ENV", "SKIP_KINDS", "WITNESS_DRIFT", "Collector", "add_options",
           "needs", "skip_as"]

COLLECTOR = pytest.StashKey[Collector]()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_pytest_options(parser)


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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    short_report(item, call, report)  # a failing conformance check: its verdict, not the trace
    return report


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
