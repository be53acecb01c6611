"""Repository-wide test configuration: Hypothesis profiles and a per-test seeded generator."""

from __future__ import annotations

import os
from types import ModuleType

import pytest
import torch
from hypothesis import HealthCheck, settings

from mxcheck.plugin import needs

pytest_plugins = ["pytester"]

# `--hypothesis-profile` picks one; `ci` is the default.
settings.register_profile("ci", max_examples=200, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile("thorough", max_examples=5000, deadline=None)
settings.load_profile("ci")


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist the workers already use every core: torch's intra-op threads on top of
    them oversubscribe the cores. On the 2-core CI runner (`-n auto`: 2 workers of 2 threads
    each) the suite's many small ops each waited in a parallel region for a thread the OS
    had descheduled: check_linear ran 4x slower. Each worker gets its share of the cores."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // int(workers)))


@pytest.fixture
def gen(mxcheck_generator: torch.Generator) -> torch.Generator:
    """The plugin's generator, seeded from --mxcheck-seed and the test id."""
    return mxcheck_generator


@pytest.fixture
def matplotlib() -> ModuleType:
    """matplotlib, for a test that reads back the report's plots: without it the test skips
    naming it (fails under --mxcheck-require-deps); the pages themselves render without."""
    with needs("matplotlib"):
        import matplotlib  # noqa: PLC0415  (only tests that read plots back load it)
    return matplotlib

