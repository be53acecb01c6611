"""Stochastic rounding, statistically: unbiased, seeded, never all zero."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.conformance import CHECKS
from mxcheck.functions import quant_linear
from mxcheck.recipes import RECIPES, get_recipe

pytestmark = pytest.mark.emulated

# Recipes with SR on the gradients: nvfp4 as named, and the MX recipes' optional gradient SR.
SR_RECIPES = {"nvfp4": RECIPES["nvfp4"], "mxfp4+sr": get_recipe("mxfp4+sr"), "mxfp8+sr": get_recipe("mxfp8+sr")}


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


# ---------------------------------------------------------------------------------------
# The oracle's SR is unbiased, proven by enumeration rather than sampled: with 8 random bits
# there are 256 values of u, so the mean over all of them is the exact expectation. It must
# be lo + floor(256 frac) / 256 (hi - lo), within (hi - lo) / 256 of x (never above it in
# magnitude). lo, hi and the scaled value come from ml_dtypes grids and a float64 scale
# built here from the scale bytes, not from the oracle's rounding.

_ML_GRIDS = {"e2m1": "float4_e2m1fn", "e2m3": "float6_e2m3fn", "e3m2": "float6_e3m2fn",
             "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def _grid(fmt: str) -> torch.Tensor:
    """Sorted non-negative finite values of fmt, from ml_dtypes (a witness)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import numpy as np

    dt = getattr(ml_dtypes, _ML_GRIDS[fmt])
    bits = 8 if fmt in ("e4m3", "e5m2") else 4 if fmt == "e2m1" else 6
    v = np.arange(2**bits, dtype=np.uint8).view(dt).astype(np.float64)
    v = torch.from_numpy(v[np.isfinite(v) & (v >= 0)])
    return torch.unique(v)


def _expected_sr_mean(y: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """E over u in {0, 1/256, ..., 255/256} of SR(y): |y| between grid neighbours lo <= |y| <= hi."""
    a = y.abs().clamp(max=float(grid[-1]))
    i = torch.searchsorted(grid, a, right=True).clamp(max=len(grid) - 1)
    lo = grid[(i - 1).clamp(min=0)]
    hi = torch.where(grid[i] >= a, grid[i], lo)
    frac = torch.where(hi > lo, (a - lo) / (hi - lo), torch.zeros_like(a))
    return y.sign() * (lo + torch.floor(256 * frac) / 256 * (hi - lo)), (hi - lo)


def _all_u(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """256 copies of x stacked along a new first dim, and rand = k for copy k."""
    stack = x.unsqueeze(0).expand(256, *x.shape).contiguous()
    rand = torch.arange(256, dtype=torch.uint8).view(256, *([1] * x.ndim)).expand_as(stack).contiguous()
    return stack, rand


def _sr_input(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 64, generator=gen) * torch.logspace(-3, 3, 16).unsqueeze(1)
    return x.bfloat16().float()


@pytest.mark.parametrize("fmt", sorted(_ML_GRIDS))
def test_oracle_mx_sr_mean_over_all_random_bits_is_x_to_1_256_of_a_step(fmt):
    import mxcheck

    x = _sr_input(1)
    stack, rand = _all_u(x)
    q = mxcheck.mx_quantize(stack.view(-1, 64), fmt, rounding="sr", rand=rand.view(-1, 64))
    scale = torch.exp2(q.scales.view(256, 16, 2)[0].double() - 127).repeat_interleave(32, -1)
    got = (q.dequantize().double().view(256, 16, 64) / scale).mean(0)
    y = x.double() / scale
    want, step = _expected_sr_mean(y, _grid(fmt))
    assert torch.equal(got, want)
    inside = y.abs() <= float(_grid(fmt)[-1])  # saturated elements are not SR's business
    assert bool(((want - y).abs() <= step / 256)[inside].all())
    assert bool((want.abs() <= y.abs() + 1e-300)[inside].all())  # floor(256 frac): never away from x's side


@pytest.mark.parametrize("fmt", ["e2m1", "e4m3", "e5m2"])
def test_oracle_encode_sr_mean_over_all_random_bits_is_x_to_1_256_of_a_step(fmt):
    import mxcheck

    x = _sr_input(2) / 8
    stack, rand = _all_u(x)
    got = mxcheck.decode(mxcheck.encode(stack, fmt, rounding="sr", rand=rand), fmt).double().mean(0)
    want, step = _expected_sr_mean(x.double(), _grid(fmt))
    inside = x.abs() <= float(_grid(fmt)[-1])
    assert torch.equal(got[inside], want[inside])
    assert bool(((want - x.double()).abs() <= step / 256)[inside].all())


def test_oracle_nvfp4_sr_mean_over_all_random_bits_is_x_to_1_256_of_a_step():
    """NVFP4's element scale is not a power of two: the scaled value is rebuilt here from
    TE's formulas (core_nvfp4.cuh) with ml_dtypes' e4m3 RNE cast for the block scale."""
    import mxcheck
    ml_dtypes = pytest.importorskip("ml_dtypes")

    x = _sr_input(5)  # the input seed that failed the old 5-sigma bound
    stack, rand = _all_u(x)
    n = mxcheck.nvfp4_quantize(stack.view(-1, 64), rand=rand.view(-1, 64))
    f32 = torch.float32
    amax = x.abs().max().to(f32)
    s_enc = torch.tensor(448.0 * 6.0, dtype=f32) / amax
    vec_max = x.abs().view(16, 4, 16).amax(-1)
    s_blk = (vec_max * (s_enc * torch.tensor(1 / 6, dtype=f32))).numpy().astype(ml_dtypes.float8_e4m3fn)
    s_blk = torch.from_numpy(s_blk.astype("float32"))
    enc = 1.0 / (s_blk * (1.0 / s_enc))
    y = (x.view(16, 4, 16) * enc.unsqueeze(-1)).view(16, 64).double()
    codes_mean = mxcheck.decode(n.codes, "e2m1").double().view(256, 16, 64).mean(0)
    want, step = _expected_sr_mean(y, _grid("e2m1"))
    assert torch.equal(n.block_scales.view(256, 16, 4)[0], torch.from_numpy(
        s_blk.numpy().astype(ml_dtypes.float8_e4m3fn).view("uint8")))
    # Blocks whose ue4m3 scale underflows to 0 (enc = Inf) and elements past 6 (the block
    # scale rounded down) saturate: not SR's business. The rest, 90% of them, are checked.
    inside = torch.isfinite(y) & (y.abs() <= 6)
    assert inside.double().mean() > 0.8
    assert torch.equal(codes_mean[inside], want[inside])
    assert bool(((want - y).abs() <= step / 256)[inside].all())


def test_the_bernstein_bound_is_what_it_says():
    """At p = 22/256 (the seed-5 element) and 2048 draws the bound leaves a binomial tail
    (computed exactly here) below the per-element share of SR_FALSE_FAILURE."""
    import math

    from mxcheck.conformance import SR_DRAWS, SR_FALSE_FAILURE, sr_deviation_bound

    frac = torch.full((16, 64), 22 / 256, dtype=torch.float64)
    t = float(sr_deviation_bound(frac, SR_DRAWS)[0, 0]) - 1 / 256
    n, p = SR_DRAWS, 22 / 256
    k_hi, k_lo = math.ceil(n * (p + t)), math.floor(n * (p - t))
    logpmf = [math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p)
              + (n - k) * math.log1p(-p) for k in range(n + 1)]
    tail = sum(math.exp(v) for k, v in enumerate(logpmf) if k >= k_hi or k <= k_lo)
    assert tail <= SR_FALSE_FAILURE / frac.numel()
    assert 0.03 < t < 0.06  # tight enough that an RNE "SR" fails (frac far from 0 and 1 is off by > 0.1)
