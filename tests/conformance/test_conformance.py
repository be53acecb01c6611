"""The conformance suite, parametrized over the selected backends (--mxcheck-backend)."""

from __future__ import annotations

import pytest

from mxcheck.conformance import CHECKS, LINEAR_SNR_FLOORS
from mxcheck.recipes import RECIPES

pytestmark = pytest.mark.emulated

RECIPE_NAMES = sorted(LINEAR_SNR_FLOORS)
# edge_shapes runs shape by shape in test_edge_shapes.py (one test id per shape).
CHECK_NAMES = sorted(set(CHECKS) - {"edge_shapes"})


@pytest.mark.parametrize("recipe", RECIPE_NAMES)
@pytest.mark.parametrize("check", CHECK_NAMES)
def test_backend_conforms(backend, check, recipe, gen, numerics):
    ok, why = backend.supports(RECIPES[recipe])
    if not ok:
        pytest.skip(f"backend {backend.name} does not support {recipe}: {why}")
    skipped = CHECKS[check](backend, RECIPES[recipe], gen, numerics)
    if skipped:
        pytest.skip(f"{check}: {skipped}")
