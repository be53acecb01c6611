"""Stochastic rounding judged as SR: a backend's own SR bits are held to SR statistics
(conformance.sr_linear), the oracle's bits to the reference Function's."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.conformance import CHECKS
from mxcheck.conformance._common import (
    _linear,
    _Reference,
    own_sr_directions,
    sr_bits,
    sr_directions,
)
from mxcheck.conformance.edges import edge_shape_outcome
from mxcheck.conformance.sr import bernstein_deviation
from mxcheck.conformance.sr_linear import check_sr_linear
from mxcheck.functions import quant_linear
from mxcheck.gemm import emulated_gemm, quantize_operand
from mxcheck.recipes import RECIPES, get_recipe

pytestmark = pytest.mark.emulated

SR_LINEAR_RECIPES = ("nvfp4", "mxfp4+sr")


class _OwnGenerator(EmulatedBackend):
    """The reference Function with SR bits from a generator of its own, reseeded on every
    call from a counter (a kernel with its own Philox stream)."""

    sr_bits = "own"

    def __init__(self, gen: torch.Generator) -> None:
        self._seeds = itertools.count(int(torch.randint(2**40, (1,), generator=gen)))

    def linear(self, x, weight, bias, recipe, *, states=None):
        return quant_linear(x, weight, bias, recipe, states=states,
                            generator=torch.Generator().manual_seed(next(self._seeds)))


class _OwnGeneratorClaimsOracle(_OwnGenerator):
    sr_bits = "oracle"


class _RoundsNearest(_OwnGenerator):
    """Claims SR, own bits, but rounds the gradients to nearest."""

    def linear(self, x, weight, bias, recipe, *, states=None):
        rne = replace(recipe, g_row=replace(recipe.g_row, rounding="rne"), g_col=replace(recipe.g_col, rounding="rne"))
        return quant_linear(x, weight, bias, rne, states=states)


class _HandRolledSR(EmulatedBackend):
    """A linear written from mxcheck's quantizers and GEMM (not the reference Function), its
    SR bits u drawn uniformly from {skew, ..., 255} / 256: skew 0 is an unbiased SR, skew 51
    rounds away with probability about frac + 0.2 (a skewed threshold)."""

    sr_bits = "own"

    def __init__(self, gen: torch.Generator, skew: int) -> None:
        self.gen = torch.Generator().manual_seed(int(torch.randint(2**40, (1,), generator=gen)))
        self.skew = skew

    def _q(self, t, recipe, op):
        spec, t = recipe.spec(op), t.contiguous()
        if spec.rounding != "sr":
            return quantize_operand(t, spec)
        return quantize_operand(t, spec, rand=torch.randint(self.skew, 256, t.shape, generator=self.gen,
                                                             dtype=torch.uint8))

    def linear(self, x, weight, bias, recipe, *, states=None):
        be, out = self, recipe.out_dtype

        class Linear(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w, b):
                ctx.save_for_backward(x, w)
                return emulated_gemm(be._q(x, recipe, "x_row"), be._q(w, recipe, "w_row"), out_dtype=out, bias=b)

            @staticmethod
            def backward(ctx, g):
                x, w = ctx.saved_tensors
                dx = emulated_gemm(be._q(g, recipe, "g_row"), be._q(w.t(), recipe, "w_col"), out_dtype=out)
                dw = emulated_gemm(be._q(g.t(), recipe, "g_col"), be._q(x.t(), recipe, "x_col"), out_dtype=out)
                return dx.to(x.dtype), dw.to(w.dtype), g.float().sum(0)

        return Linear.apply(x, weight, bias)


@pytest.mark.parametrize("recipe", SR_LINEAR_RECIPES)
def test_an_sr_backend_with_its_own_generator_passes_check_linear(recipe, gen):
    assert CHECKS["linear"](_OwnGenerator(gen), get_recipe(recipe), gen) is None


def test_the_same_backend_claiming_the_oracles_bits_fails_against_the_reference(gen):
    # the judgement all backends had before sr_bits: dgrad 16.9 dB (nvfp4) against 40 dB
    with pytest.raises(NumericsError, match=r"dB < 40.0 dB.*vs reference Function \(the oracle's SR bits"):
        CHECKS["linear"](_OwnGeneratorClaimsOracle(gen), RECIPES["nvfp4"], gen)


@pytest.mark.parametrize("recipe", SR_LINEAR_RECIPES)
def test_an_sr_backend_that_rounds_to_nearest_fails_as_biased(recipe, gen):
    with pytest.raises(NumericsError, match=r"SR statistics \(backend's own bits\), sr_bits='own'.*biased SR"):
        CHECKS["linear"](_RoundsNearest(gen), get_recipe(recipe), gen)


def test_a_hand_rolled_unbiased_sr_passes_and_its_skewed_twin_fails(gen):
    recipe = get_recipe("mxfp4+sr")
    assert CHECKS["linear"](_HandRolledSR(gen, skew=0), recipe, gen) is None
    with pytest.raises(NumericsError, match=r"moves toward rounding up .*biased SR of g_row \(a skewed SR threshold"):
        CHECKS["linear"](_HandRolledSR(gen, skew=51), recipe, gen)


def test_the_emulated_backend_is_judged_on_the_oracles_bits():
    assert sr_bits(EmulatedBackend()) == "oracle"
    assert own_sr_directions(EmulatedBackend(), RECIPES["nvfp4"]) == ()


def test_sr_bits_default_to_own_and_a_gemm_only_backend_has_the_oracles():
    class Linear:
        name = "mine"

        def linear(self, *a):
            raise AssertionError

    class GemmOnly:
        name = "gemm-only"

        def gemm(self, *a, **kw):
            raise AssertionError

    assert sr_bits(Linear()) == "own"
    assert sr_bits(GemmOnly()) == "oracle"  # linear_of runs it inside the reference Function
    assert own_sr_directions(Linear(), RECIPES["nvfp4"]) == ("dgrad", "wgrad") == sr_directions(RECIPES["nvfp4"])


def test_a_bad_sr_bits_value_is_refused_naming_it():
    class Bad(EmulatedBackend):
        sr_bits = "torch"

    with pytest.raises(ValueError, match=r"sr_bits='torch'; expected one of \['oracle', 'own'\]"):
        sr_bits(Bad())


def test_sr_in_the_forward_with_own_bits_skips_the_bitwise_repeat_and_3d_checks(gen):
    base = RECIPES["mxfp4"]
    fwd_sr = replace(base, x_row=replace(base.x_row, rounding="sr"))
    for check in ("repeatable", "shapes"):
        assert "draws its own SR bits" in CHECKS[check](_OwnGenerator(gen), fwd_sr, gen)
        assert CHECKS[check](EmulatedBackend(), fwd_sr, gen) is None


def test_sr_seeded_asks_own_bits_only_to_differ_call_to_call(gen):
    recipe = RECIPES["nvfp4"]
    assert CHECKS["sr_seeded"](_OwnGenerator(gen), recipe, gen) is None
    with pytest.raises(NumericsError, match="SR same seed"):  # the oracle's bits must repeat
        CHECKS["sr_seeded"](_OwnGeneratorClaimsOracle(gen), recipe, gen)


def test_an_edge_shape_judges_own_bits_by_sr_statistics(gen):
    assert edge_shape_outcome(_OwnGenerator(gen), RECIPES["nvfp4"], "modulation-M64", gen)["linear"] == "correct"
    # one draw at 64x128x256 has little power: an SR whose bits are stuck at 255 (always rounds away)
    with pytest.raises(NumericsError, match=r"SR statistics \(backend's own bits\).*toward rounding up"):
        edge_shape_outcome(_HandRolledSR(gen, skew=255), RECIPES["nvfp4"], "modulation-M64", gen)


def _draw(recipe, gen, seed):
    x = torch.randn(64, 128, generator=gen).bfloat16().float()
    w = (torch.randn(64, 128, generator=gen) / 16).bfloat16().float()
    b = torch.zeros(64)
    dy = torch.randn(64, 64, generator=gen).bfloat16().float()
    outs = []
    for s in (seed, seed + 1):  # two runs of the oracle with independent bits
        xx, ww, _, y = _linear(_Reference(), x, w, b, recipe, seed=s, dy=dy)
        outs.append({"fwd": y, "dgrad": xx.grad, "wgrad": ww.grad})
    return {"x": x, "w": w, "b": b, "dy": dy}, *outs


def test_check_sr_linear_fails_an_output_outside_the_sr_envelope(gen):
    recipe = RECIPES["nvfp4"]
    inputs, got, ref = _draw(recipe, gen, seed=int(torch.randint(2**30, (1,), generator=gen)))
    ctx = {"recipe": recipe.name}
    check_sr_linear(None, recipe, [(inputs, got, ref)], ("dgrad", "wgrad"), ctx)
    got["dgrad"] = got["dgrad"].clone()
    i = got["dgrad"].abs().argmax()
    got["dgrad"].view(-1)[i] *= 1.5  # one output half as large again: no rounding of g_row gives it
    with pytest.raises(NumericsError, match=r"envelope half-widths .* not a stochastic rounding of g_row"):
        check_sr_linear(None, recipe, [(inputs, got, ref)], ("dgrad",), ctx)


def test_bernstein_deviation_bounds_the_exact_tail_of_a_sum_of_signs():
    """A sum of n fair +-1 terms (each at most 1 from its mean 0, variance n in all): the
    exact binomial tail at the bound is under 2 exp(-log_term)."""
    n, log_term = 400, math.log(2 / 1e-6)
    t = bernstein_deviation(n, 1.0, log_term)
    heads = [k for k in range(n + 1) if abs(2 * k - n) >= t]
    tail = sum(math.comb(n, k) for k in heads) / 2**n
    assert 0 < tail <= 2 * math.exp(-log_term)
    assert t < 1.2 * bernstein_deviation(n, 0.0, log_term) + 2 * log_term / 3  # not vacuous: near sqrt(2 n L)
