"""What the conformance suite (mxcheck/conformance/suite) runs on: every recipe has a floor."""

from __future__ import annotations

import pytest

from mxcheck import thresholds
from mxcheck.conformance import CHECKS, DEFAULT_RECIPES
from mxcheck.recipes import RECIPES

pytestmark = pytest.mark.emulated

# Every recipe the suite runs by default: a recipe without a floor fails check_linear
# (thresholds.linear_floor raises), it does not drop out of this list.
RECIPE_NAMES = list(DEFAULT_RECIPES)


@pytest.mark.parametrize("recipe", RECIPE_NAMES)
def test_every_conformance_recipe_has_a_floor(recipe):
    assert thresholds.linear_floor(recipe) >= 10.0


def test_a_recipe_without_a_floor_is_an_error_not_a_skip(gen):
    from dataclasses import replace

    from mxcheck.backends.emulated import EmulatedBackend

    nameless = replace(RECIPES["mxfp8"], name="mxfp8-unfloored")
    with pytest.raises(ValueError, match="no linear SNR floor for recipe 'mxfp8-unfloored'"):
        CHECKS["linear"](EmulatedBackend(), nameless, gen)
