"""The conformance suite, parametrized over the selected backends (--mxcheck-backend)."""

from __future__ import annotations

import pytest

from mxcheck import thresholds
from mxcheck.conformance import CHECKS
from mxcheck.recipes import DERIVED_RECIPES, RECIPES, get_recipe

pytestmark = pytest.mark.emulated

# Every named recipe and every derived one (mxfp4+sr, ...): a recipe without a floor fails
# check_linear (thresholds.linear_floor raises), it does not drop out of this list.
RECIPE_NAMES = sorted(RECIPES) + sorted(DERIVED_RECIPES)
# edge_shapes runs shape by shape in test_edge_shapes.py (one test id per shape).
CHECK_NAMES = sorted(set(CHECKS) - {"edge_shapes"})


@pytest.mark.parametrize("recipe", RECIPE_NAMES)
@pytest.mark.parametrize("check", CHECK_NAMES)
def test_backend_conforms(backend, check, recipe, gen, numerics):
    ok, why = backend.supports(get_recipe(recipe))
    if not ok:
        pytest.skip(f"backend {backend.name} does not support {recipe}: {why}")
    skipped = CHECKS[check](backend, get_recipe(recipe), gen, numerics)
    if skipped:
        pytest.skip(f"{check}: {skipped}")


@pytest.mark.parametrize("recipe", RECIPE_NAMES)
def test_every_conformance_recipe_has_a_floor(recipe):
    assert thresholds.linear_floor(recipe) >= 10.0


def test_a_recipe_without_a_floor_is_an_error_not_a_skip(gen):
    from dataclasses import replace

    from mxcheck.backends.emulated import EmulatedBackend

    nameless = replace(RECIPES["mxfp8"], name="mxfp8-unfloored")
    with pytest.raises(ValueError, match="no linear SNR floor for recipe 'mxfp8-unfloored'"):
        CHECKS["linear"](EmulatedBackend(), nameless, gen)
