"""Stochastic rounding, statistically: unbiased within a stated bound, seeded, never all zero."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from mxcheck.assertions import NumericsError
from mxcheck.conformance._common import _bitwise, _device, _snr
from mxcheck.gemm import dequantize_operand, quantize_operand
from mxcheck.recipes import OPERANDS, Recipe

SR_DRAWS = 256  # copies of dY stacked along M in one call: independent draws per element


SR_SIGMAS = 5.0  # per element: |mean - exact| <= 5 standard errors + the 8-bit resolution


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
    torch.manual_seed(seed)  # SR bits come from the default generator (as quant_linear)
    y = linear(x, w, None, recipe)
    y.backward(dy.to(y.dtype))
    return x.grad.detach()


def _sr_input(gen: torch.Generator, device: str) -> torch.Tensor:
    # bf16 values (what a bf16 dY holds), each block with a different amax
    dy = torch.randn(_SR_M, _SR_N, generator=gen) * torch.logspace(-2, 2, _SR_M).unsqueeze(1)
    return dy.bfloat16().float().to(device)


def check_sr_unbiased(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """Mean of SR_DRAWS stochastic roundings within SR_SIGMAS standard errors (variance
    (x - lo)(hi - x) per element, lo and hi the grid points around x) plus the 8-bit
    resolution (hi - lo)/256 of the exact value; and never all zero for a non-zero input."""
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
    # dX passes through the GEMM's output dtype: round the neighbours as it does.
    lo, hi = (v.to(recipe.out_dtype).double() for v in (lo, hi))
    x = dy.double()
    frac = torch.where(hi != lo, (x - lo) / (hi - lo), torch.zeros_like(x)).clamp(0, 1)
    exact = lo + frac * (hi - lo)
    # With 8 random bits the up-probability is floor(256 frac)/256, so an element strictly
    # between grid points has variance at least (hi-lo)^2 (1/256)(255/256).
    var = torch.maximum((exact - lo) * (hi - exact), (hi - lo) ** 2 * (255 / 256**2))
    draws = _sr_dgrad(linear, recipe, dy.repeat(SR_DRAWS, 1), seed=11).double().view(SR_DRAWS, m, n)
    if not draws.abs().sum():
        raise NumericsError(f"recipe {recipe.name}: SR gave an all-zero gradient for a non-zero dY "
                            "(as TE PR#3281 on sm_120)")
    mean = draws.mean(0)
    bound = SR_SIGMAS * (var / SR_DRAWS).sqrt() + (hi - lo).abs() / 256
    bad = ~((mean - exact).abs() <= bound)
    ctx = {"recipe": recipe.name, "layer": f"SR mean of {SR_DRAWS} draws vs exact", "direction": "dgrad",
           "m": m, "n": n, "k": n}
    if not float(var.sum()):
        raise NumericsError(f"recipe {recipe.name}: the oracle's g_row SR gives the same value with u=0 and "
                            "u=255/256 at every element: its random bits are ignored")
    # Recorded floor: the SNR of a mean that is off by SR_SIGMAS standard errors everywhere.
    floor = 10 * math.log10(float((exact**2).sum()) / (SR_SIGMAS**2 * float(var.sum()) / SR_DRAWS))
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise NumericsError(f"recipe {recipe.name}: SR is biased at {int(bad.sum())} of {bad.numel()} elements "
                            f"({SR_DRAWS} draws, bound {SR_SIGMAS} standard errors + (hi-lo)/256); first {i}: "
                            f"x={x[i].item()!r} between {lo[i].item()!r} and {hi[i].item()!r}, mean "
                            f"{mean[i].item()!r}, bound {bound[i].item():.3g}")
    _snr(numerics, mean, exact, floor, **ctx)
    return None


def check_sr_seeded(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """Same seed -> bit-identical SR gradient; another seed -> a different one; never all zero."""
    if (why := _sr_reason(recipe)) or (linear := getattr(backend, "linear", None)) is None:
        return why or _NO_OWN_SR
    dy = _sr_input(gen, _device(backend))
    first, again, other = (_sr_dgrad(linear, recipe, dy, seed) for seed in (7, 7, 8))
    ctx = {"recipe": recipe.name, "direction": "dgrad", "m": dy.shape[0], "n": dy.shape[1], "k": dy.shape[1]}
    _bitwise(numerics, again, first, layer="SR same seed", **ctx)
    if torch.equal(first, other):
        raise NumericsError(f"recipe {recipe.name}: seeds 7 and 8 gave bit-identical SR gradients "
                            "(a fixed or ignored seed defeats SR, as Primus-Turbo PR#365)")
    if not first.abs().sum():
        raise NumericsError(f"recipe {recipe.name}: SR gave an all-zero gradient for a non-zero dY")
    return None
