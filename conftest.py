"""Repository-wide test configuration: Hypothesis profiles and a per-test seeded generator."""

from __future__ import annotations

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

