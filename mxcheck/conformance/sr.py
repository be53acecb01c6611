"""Stochastic rounding, statistically: unbiased within a stated bound, seeded, never all zero."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from mxcheck.assertions import NumericsError
from mxcheck.conformance._common import _bitwise, _device, _snr, sr_bits
from mxcheck.gemm import dequantize_operand, emulated_gemm, quantize_operand
from mxcheck.recipes import OPERANDS, Recipe
from mxcheck.rng import seeded_default_rng

SR_DRAWS = 2048  # copies of dY stacked along M in one call: independent draws per element
# Probability that check_sr_unbiased fails an unbiased SR, per call, whatever the seed:
# the Bernstein bound below holds for every element with probability >= 1 - this / n,
# so a union over the n elements gives this. A run makes at most ~410 calls (the
# 100-seed slow test included), so a false failure per run stays under 1e-6.
SR_FALSE_FAILURE = 1e-9
SR_RESOLUTION = 1 / 256  # 8 random bits: the up-probability is floor(256 frac) / 256


def sr_deviation_bound(frac: torch.Tensor, draws: int, false_failure: float = SR_FALSE_FAILURE,
                       resolution: float = SR_RESOLUTION) -> torch.Tensor:
    """Largest |share of draws rounded up - frac| an unbiased SR shows, per element, except
    with probability ``false_failure`` over all elements together.

    The up-probability p of an unbiased SR lies within ``resolution`` of frac (8 random
    bits: SR_RESOLUTION; float32 uniforms, multiples of 2**-24: 2**-24); the share of ``draws`` up-roundings is a mean of Bernoulli(p). Bernstein's
    inequality, P(|mean - p| >= t) <= 2 exp(-n t^2 / (2 v + 2 t / 3)) with v = p (1 - p)
    (taken as its largest value over that p interval), is an exact tail bound for every p,
    also near 0 and 1 where a Gaussian "k standard errors" is not (the old 5-sigma bound
    failed seed 5: p = 22/256, 43 of 256 draws, a binomial tail of 1.8e-5, not 2.9e-7).
    Solving for t at 2 exp(...) = false_failure / n gives the bound."""
    lg = math.log(2 * frac.numel() / false_failure)
    p_lo, p_hi = (frac - resolution).clamp(0, 1), (frac + resolution).clamp(0, 1)
    v = torch.where((p_lo <= 0.5) & (p_hi >= 0.5), torch.full_like(frac, 0.25),
                    torch.maximum(p_lo * (1 - p_lo), p_hi * (1 - p_hi)))
    return bernstein_deviation(draws * v, 1.0, lg) / draws + resolution


def bernstein_deviation(variance: Any, max_dev: Any, log_term: float) -> Any:
    """t with 2 exp(-t^2 / (2 V + 2 M t / 3)) = 2 exp(-log_term): Bernstein's tail bound for a
    sum of independent zero-mean terms, each at most M in size, whose variances sum to V
    (floats or tensors). P(|sum| >= t) <= 2 exp(-log_term)."""
    return max_dev * log_term / 3 + ((max_dev * log_term / 3) ** 2 + 2 * variance * log_term) ** 0.5


_SR_M, _SR_N = 16, 64  # dY [M, N]; W = I_N, so K = N


# A GEMM-only backend runs inside the reference Function, whose quantizer (the oracle) rounds:
# testing it would test the oracle's SR under the backend's name.
_NO_OWN_SR = "backend has no linear of its own: its SR would be the oracle's (reference Function)"


def _sr_reason(recipe: Recipe) -> str | None:
    if recipe.g_row.rounding != "sr":
        ops = [op for op in OPERANDS if recipe.spec(op).rounding == "sr"]
        return (f"recipe {recipe.name} has no stochastic rounding" if not ops else
                f"recipe {recipe.name} rounds {ops} with sr, not g_row (the dgrad operand tested here)")
    if recipe.g_row.hadamard is not None:
        return f"recipe {recipe.name} rotates g_row ({recipe.g_row.hadamard}); dX = Q(dY) needs it unrotated"
    return None


def _sr_dgrad(linear: Callable[..., torch.Tensor], recipe: Recipe, dy: torch.Tensor, seed: int) -> torch.Tensor:
    n = dy.shape[1]
    x = torch.zeros(dy.shape[0], n, device=dy.device, requires_grad=True)
    w = torch.eye(n, device=dy.device)
    # SR bits come from the default generator (as quant_linear), the backward's included
    with seeded_default_rng(seed, dy.device):
        y = linear(x, w, None, recipe)
        y.backward(dy.to(y.dtype))
    return x.grad.detach()


def _sr_input(gen: torch.Generator, device: str) -> torch.Tensor:
    # bf16 values (what a bf16 dY holds), each block with a different amax
    dy = torch.randn(_SR_M, _SR_N, generator=gen) * torch.logspace(-2, 2, _SR_M).unsqueeze(1)
    return dy.bfloat16().float().to(device)


def check_sr_unbiased(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """Per element, the share of SR_DRAWS stochastic roundings that went up is within
    ``sr_deviation_bound`` of frac = (x - lo) / (hi - lo), lo and hi the grid points around
    x (false failure <= SR_FALSE_FAILURE per call, for every seed); and never all zero."""
    if (why := _sr_reason(recipe)) or (linear := getattr(backend, "linear", None)) is None:
        return why or _NO_OWN_SR
    dy = _sr_input(gen, _device(backend))
    m, n = dy.shape
    eye = quantize_operand(torch.eye(n, device=dy.device), recipe.w_col)
    if not torch.equal(dequantize_operand(eye, padded=False), torch.eye(n, device=dy.device)):
        return f"recipe {recipe.name}: w_col does not quantize I exactly, so dX != Q(dY)"
    # The two neighbours of each element from the oracle (same scales): u = 0 never rounds
    # away, u = 255/256 rounds away unless x is on the grid.
    lo, hi = (quantize_operand(dy, recipe.g_row, rand=torch.full(dy.shape, u, dtype=torch.uint8,
                                                                 device=dy.device)).dequantize().double()
              for u in (0, 255))
    if torch.equal(lo, hi):
        raise NumericsError(f"recipe {recipe.name}: the oracle's g_row SR gives the same value with u=0 and "
                            "u=255/256 at every element: its random bits are ignored")
    x = dy.double()
    frac = torch.where(hi != lo, (x - lo) / (hi - lo), torch.zeros_like(x)).clamp(0, 1)
    # dX is the dgrad GEMM's output: a draw is one of the neighbours as that GEMM gives them
    # (the oracle's, which for NVFP4 applies the tensor scales to the sum, not per value as
    # dequantize does, so the two can round apart in the output dtype).
    lo_out, hi_out = (emulated_gemm(quantize_operand(dy, recipe.g_row, rand=torch.full(
        dy.shape, u, dtype=torch.uint8, device=dy.device)), eye, out_dtype=recipe.out_dtype).double()
        for u in (0, 255))
    draws = _sr_dgrad(linear, recipe, dy.repeat(SR_DRAWS, 1), seed=11).double().view(SR_DRAWS, m, n)
    if not draws.abs().sum():
        raise NumericsError(f"recipe {recipe.name}: SR gave an all-zero gradient for a non-zero dY "
                            "(as TE PR#3281 on sm_120)")
    stray = ~((draws == lo_out) | (draws == hi_out))
    if stray.any():
        i = tuple(stray.nonzero()[0].tolist())
        raise NumericsError(f"recipe {recipe.name}: {int(stray.sum())} SR draws are neither grid neighbour; "
                            f"first (draw, row, col) {i}: {draws[i].item()!r}, neighbours {lo_out[i[1:]].item()!r} "
                            f"and {hi_out[i[1:]].item()!r}")
    up = (draws == hi_out).double().mean(0)
    up = torch.where(hi_out != lo_out, up, frac)  # neighbours equal after the output rounding: no evidence
    bound = sr_deviation_bound(frac, SR_DRAWS)
    bad = ~((up - frac).abs() <= bound)
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise NumericsError(f"recipe {recipe.name}: SR is biased at {int(bad.sum())} of {bad.numel()} elements "
                            f"({SR_DRAWS} draws, Bernstein bound at false-failure {SR_FALSE_FAILURE:g} per call); "
                            f"first {i}: x={x[i].item()!r} between {lo[i].item()!r} and {hi[i].item()!r} "
                            f"(frac {frac[i].item():.4f}), rounded up in {up[i].item():.4f} of draws, "
                            f"bound {bound[i].item():.4f}")
    mean, exact = draws.mean(0), lo_out + frac * (hi_out - lo_out)
    # Recorded floor: the SNR of a mean that is off by the bound everywhere.
    floor = 10 * math.log10(float((exact**2).sum()) / float(((bound * (hi_out - lo_out)) ** 2).sum()))
    _snr(numerics, mean, exact, floor, recipe=recipe.name, layer=f"SR mean of {SR_DRAWS} draws vs exact",
         direction="dgrad", m=m, n=n, k=n)
    return None


def check_sr_seeded(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """Same seed -> bit-identical SR gradient; another seed -> a different one; never all zero.

    The seed fixes the default generator only: a backend with its own SR bits
    (``sr_bits="own"``) is held to "another call -> a different one" and never all zero.
    A correct SR fails "another seed -> a different one" only if both seeds round every
    element the same way: prod max(p, 1 - p) over dY's elements, at most 1e-122 measured
    (mxcheck.false_failure)."""
    if (why := _sr_reason(recipe)) or (linear := getattr(backend, "linear", None)) is None:
        return why or _NO_OWN_SR
    dy = _sr_input(gen, _device(backend))
    first, again, other = (_sr_dgrad(linear, recipe, dy, seed) for seed in (7, 7, 8))
    ctx = {"recipe": recipe.name, "direction": "dgrad", "m": dy.shape[0], "n": dy.shape[1], "k": dy.shape[1]}
    if sr_bits(backend) == "oracle":
        _bitwise(numerics, again, first, layer="SR same seed", **ctx)
    if torch.equal(first, other):
        raise NumericsError(f"recipe {recipe.name}: seeds 7 and 8 gave bit-identical SR gradients "
                            "(a fixed or ignored seed defeats SR, as Primus-Turbo PR#365)")
    if not first.abs().sum():
        raise NumericsError(f"recipe {recipe.name}: SR gave an all-zero gradient for a non-zero dY")
    return None
