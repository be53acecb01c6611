"""How a suite test turns a backend's answer into an outcome the summary counts apart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from mxcheck.backends.contract import Refusal
from mxcheck.conformance._common import OracleRefusal
from mxcheck.conformance.claims import Claim
from mxcheck.plugin import skip_as


def judge(request: pytest.FixtureRequest, backend: Any, claim: Claim, what: str, run: Callable[[], Any]) -> Any:
    """Run ``run`` (a check on ``claim``) and map the backend's declarations to outcomes:
    supports() False on a declared claim fails, on a default one skips as not supported;
    the backend's Refusal skips as refused, mxcheck's own (the reference Function around the
    backend cannot take the shape) as not applicable; anything else the check raises fails."""
    ok, why = backend.supports(claim.recipe)
    if not ok:
        if claim.declared:
            pytest.fail(f"backend {backend.name} claims recipe {claim.recipe.name} (named by the {claim.by}) "
                        f"but its supports() says no: {why}", pytrace=False)
        skip_as(request.node, "unsupported", f"backend {backend.name} does not support {claim.recipe.name}: {why}")
    try:
        return run()
    except OracleRefusal as e:
        skip_as(request.node, "not_applicable", f"{what}: {e}")
    except Refusal as e:
        skip_as(request.node, "refused", f"{what}: backend {backend.name} refused: {e}")
