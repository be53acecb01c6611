"""Repository-wide test configuration: Hypothesis profiles and a per-test seeded generator."""

from __future__ import annotations

import hashlib

import pytest
import torch
from hypothesis import HealthCheck, settings

# `--hypothesis-profile` picks one; `ci` is the default.
settings.register_profile("ci", max_examples=200, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile("thorough", max_examples=5000, deadline=None)
settings.load_profile("ci")


def _seed_from(nodeid: str) -> int:
    return int.from_bytes(hashlib.sha256(nodeid.encode()).digest()[:8], "little") & (2**63 - 1)


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> torch.Generator:
    """A CPU torch.Generator seeded from the test id: reproducible, independent per test."""
    g = torch.Generator()
    g.manual_seed(_seed_from(request.node.nodeid))
    return g


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Stand-in until the mxcheck plugin owns hardware skips: a `cuda` test needs a CUDA device.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="cuda: no CUDA device visible to torch (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
