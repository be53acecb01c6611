"""Repository-wide test configuration: Hypothesis profiles and a per-test seeded generator."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings

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

