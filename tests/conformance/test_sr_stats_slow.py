"""The SR checks on the oracle over 100 input seeds: too slow for the CPU suite (about 4 min).

Not ``emulated``: CI deselects it; ``pytest -m slow tests/conformance/test_sr_stats_slow.py``
runs it. Every CI run still calls both SR checks on the oracle for each of these recipes,
at the plugin's seed (``test_sr_stats.py::test_backend_sr``).
"""

from __future__ import annotations

import pytest
import torch

from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.conformance import CHECKS
from tests.conformance.test_sr_stats import SR_RECIPES

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("recipe", sorted(SR_RECIPES))
def test_sr_checks_pass_the_oracle_for_100_seeds(recipe):
    """The SR checks on the oracle over 100 input seeds: with SR_FALSE_FAILURE = 1e-9 per
    call, 300 calls fail falsely with probability < 3e-7."""
    for seed in range(100):
        for check in ("sr_unbiased", "sr_seeded"):
            assert CHECKS[check](EmulatedBackend(), SR_RECIPES[recipe], torch.Generator().manual_seed(seed)) is None
