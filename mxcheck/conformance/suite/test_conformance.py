"""Every conformance check on every claim of every selected backend (--mxcheck-backend)."""

from __future__ import annotations

import pytest

from mxcheck.conformance import CHECKS
from mxcheck.conformance.edges import EDGE_SHAPES, edge_shape_outcome
from mxcheck.conformance.suite._judge import judge
from mxcheck.plugin import skip_as

pytestmark = pytest.mark.emulated

# edge_shapes runs shape by shape below (one test id per shape).
CHECK_NAMES = sorted(set(CHECKS) - {"edge_shapes"})


@pytest.mark.parametrize("check", CHECK_NAMES)
def test_backend_conforms(request, backend, claim, check, mxcheck_generator, numerics):
    skipped = judge(request, backend, claim, check,
                    lambda: CHECKS[check](backend, claim.recipe, mxcheck_generator, numerics))
    if skipped:
        skip_as(request.node, "not_applicable", f"{check}: {skipped}")


@pytest.mark.parametrize("shape", sorted(EDGE_SHAPES))
def test_edge_shape_is_correct_or_a_declared_refusal(request, backend, claim, shape, mxcheck_generator, numerics):
    outcome = judge(request, backend, claim, f"edge shape {shape}",
                    lambda: edge_shape_outcome(backend, claim.recipe, shape, mxcheck_generator, numerics))
    if not outcome or all(v.startswith("n/a") for v in outcome.values()):
        skip_as(request.node, "not_applicable", f"{shape}: nothing to run on backend {backend.name}: {outcome}")
