"""Stochastic rounding, statistically: unbiased, seeded, never all zero."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.conformance import CHECKS
from mxcheck.functions import quant_linear
from mxcheck.recipes import RECIPES

pytestmark = pytest.mark.emulated

# Recipes with SR on the gradients: nvfp4 as named, and the MX recipes' optional gradient SR.
SR_RECIPES = {"nvfp4": RECIPES["nvfp4"], "mxfp4+sr": RECIPES["mxfp4"].with_gradient_sr(),
              "mxfp8+sr": RECIPES["mxfp8"].with_gradient_sr()}


@pytest.mark.parametrize("check", ["sr_unbiased", "sr_seeded"])
@pytest.mark.parametrize("recipe", sorted(SR_RECIPES))
def test_backend_sr(backend, recipe, check, gen, numerics):
    ok, why = backend.supports(SR_RECIPES[recipe])
    if not ok:
        pytest.skip(f"backend {backend.name} does not support {recipe}: {why}")
    skipped = CHECKS[check](backend, SR_RECIPES[recipe], gen, numerics)
    if skipped:
        pytest.skip(f"{check}: {skipped}")


def test_sr_checks_skip_recipes_without_sr(gen):
    assert "no stochastic rounding" in CHECKS["sr_unbiased"](EmulatedBackend(), RECIPES["mxfp8"], gen)


class _RoundsNearest(EmulatedBackend):
    """Claims SR but rounds to nearest (drops the random bits)."""

    def linear(self, x, weight, bias, recipe):
        return quant_linear(x, weight, bias, replace(recipe, g_row=replace(recipe.g_row, rounding="rne")))


class _FixedSeed(EmulatedBackend):
    """Reseeds its SR bits with 0 on every call (Primus-Turbo PR#365's zero seed)."""

    def linear(self, x, weight, bias, recipe):
        return quant_linear(x, weight, bias, recipe, generator=torch.Generator().manual_seed(0))


class _ZeroGradient(EmulatedBackend):
    """SR that returns zeros (TE PR#3281 on sm_120): the gradient of x is all zero."""

    def linear(self, x, weight, bias, recipe):
        return quant_linear(x.detach(), weight, bias, recipe) + 0 * x.sum()


@pytest.mark.parametrize(("bad", "check", "match"), [
    (_RoundsNearest, "sr_unbiased", "biased"),
    (_ZeroGradient, "sr_unbiased", "all-zero"),
    (_FixedSeed, "sr_seeded", "bit-identical"),
    (_ZeroGradient, "sr_seeded", "bit-identical|all-zero"),
])
def test_sr_checks_fail_broken_sr(bad, check, match, gen):
    with pytest.raises(NumericsError, match=match):
        CHECKS[check](bad(), RECIPES["nvfp4"], gen)
