"""Conformance checks a backend must pass, as plain functions that raise NumericsError.

``tests/conformance/`` runs each check on every selected backend; the known-bad backends
(``mxcheck.backends.known_bad``) are run through the same checks to prove each check can
fail. A check takes the backend, a recipe and a torch.Generator, and skips (returns a
reason) when the backend does not offer what it checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mxcheck.assertions import NumericsError, assert_bitwise_equal, assert_snr
from mxcheck.functions import quant_linear
from mxcheck.gemm import dequantize_operand, emulated_gemm, quantize_operand
from mxcheck.recipes import Recipe

__all__ = ["CHECKS", "LINEAR_SNR_FLOORS", "run_checks"]

# Floors for fwd / dgrad / wgrad SNR of a whole linear against float64 truth (M=N=256, K=512,
# randn inputs, weights scaled 1/sqrt(K)); DESIGN.md anchors, well under the measured values.
LINEAR_SNR_FLOORS = {"mxfp4": 10.0, "mxfp4-fp8bwd": 10.0, "mxfp6": 20.0, "fp8": 25.0, "fp8-hybrid": 20.0,
                     "mxfp8": 25.0, "nvfp4": 10.0}
_M, _N, _K = 256, 256, 512


def _snr(numerics: Any, test: torch.Tensor, ref: torch.Tensor, threshold_db: float, **context: Any) -> None:
    """assert_snr, recorded into the report when the pytest ``numerics`` fixture is given."""
    if numerics is None:
        assert_snr(test, ref, threshold_db, context=context)
    else:
        numerics.context(**context).snr(test, ref, threshold_db)


def _bitwise(numerics: Any, test: torch.Tensor, ref: torch.Tensor, **context: Any) -> None:
    if numerics is None:
        assert_bitwise_equal(test, ref, context=context)
    else:
        numerics.context(**context).bitwise(test, ref)


def _device(backend: Any) -> str:
    return getattr(backend, "device", "cpu")


def _inputs(gen: torch.Generator, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(_M, _K, generator=gen).to(device)
    w = (torch.randn(_N, _K, generator=gen) / _K**0.5).to(device)
    b = torch.randn(_N, generator=gen).to(device)
    return x, w, b


def _fwd_operands(recipe: Recipe, x: torch.Tensor, w: torch.Tensor) -> tuple[Any, Any]:
    return quantize_operand(x, recipe.x_row), quantize_operand(w, recipe.w_row)


def check_quantize(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """The backend's quantization of x_row and w_row is bit-identical to the oracle's."""
    if not hasattr(backend, "quantize"):
        return "backend has no quantize"
    x, w, _ = _inputs(gen, _device(backend))
    for name, t in (("x_row", x), ("w_row", w)):
        spec = recipe.spec(name)
        ours, theirs = quantize_operand(t, spec), backend.quantize(t, spec)
        for field in ("codes", "scales", "block_scales", "scale_inv"):
            if hasattr(ours, field):
                _bitwise(numerics, getattr(theirs, field), getattr(ours, field), recipe=recipe.name,
                         layer=f"{name}.{field}", direction="quantize")
    return None


def check_gemm(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """GEMM within the fp32-accumulation bound of the oracle's exact (float64) GEMM."""
    if not hasattr(backend, "gemm"):
        return "backend has no gemm"
    x, w, _ = _inputs(gen, _device(backend))
    a, b = _fwd_operands(recipe, x, w)
    got = backend.gemm(a, b, out_dtype=torch.float32).double()
    exact = emulated_gemm(a, b, out_dtype=torch.float64, accumulate=torch.float64)
    da, db = dequantize_operand(a).double().abs(), dequantize_operand(b).double().abs()
    bound = _K * 2.0**-24 * (da @ db.T)  # fp32 accumulation of K products, any order
    bad = (got - exact).abs() > bound
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise NumericsError(f"gemm outside the fp32-accumulation bound: recipe={recipe.name} "
                            f"M={_M} N={_N} K={_K}; {int(bad.sum())} of {bad.numel()} outputs; first {i}: "
                            f"got {got[i].item()!r}, exact {exact[i].item()!r}, bound {bound[i].item():.3g}")
    return None


def _linear(backend: Any, x, w, b, recipe: Recipe, seed: int = 0):
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    b = b.detach().clone().requires_grad_(True)
    torch.manual_seed(seed)  # SR recipes draw their bits from the default generator
    y = backend.linear(x, w, b, recipe)
    return x, w, b, y


def check_linear(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """fwd, dgrad, wgrad and bias grad above the recipe's SNR floor against float64 truth, and
    close to the reference Function given the same quantized operands."""
    if not hasattr(backend, "linear"):
        return "backend has no linear"
    floor = LINEAR_SNR_FLOORS.get(recipe.name)
    if floor is None:
        return f"no SNR floor for recipe {recipe.name}"
    x0, w0, b0 = _inputs(gen, _device(backend))
    dy = torch.randn(_M, _N, generator=gen).to(x0.device)
    x, w, b, y = _linear(backend, x0, w0, b0, recipe)
    y.backward(dy.to(y.dtype))
    xd, wd = x0.double(), w0.double()
    truth = {"fwd": xd @ wd.T + b0.double(), "dgrad": dy.double() @ wd, "wgrad": dy.double().T @ xd,
             "bgrad": dy.double().sum(0)}
    got = {"fwd": y, "dgrad": x.grad, "wgrad": w.grad, "bgrad": b.grad}
    for direction, ref in truth.items():
        if got[direction] is None or not got[direction].abs().sum():
            raise NumericsError(f"{direction} of recipe {recipe.name} is missing or all zero")
        _snr(numerics, got[direction].double(), ref, 35.0 if direction == "bgrad" else floor,
             recipe=recipe.name, layer="vs float64 truth", direction=direction, m=_M, n=_N, k=_K)
    rx, rw, _, ry = _linear(_Reference(), x0, w0, b0, recipe)
    ry.backward(dy.to(ry.dtype))
    for direction, ref in (("fwd", ry), ("dgrad", rx.grad), ("wgrad", rw.grad)):
        # Same quantized operands: only accumulation order and the output rounding may differ.
        _snr(numerics, got[direction].double(), ref.double(), 40.0, recipe=recipe.name,
             layer="vs reference Function", direction=direction, m=_M, n=_N, k=_K)
    return None


def check_weight_change(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """A second call with a changed weight changes the output (no stale cached quantization)."""
    if not hasattr(backend, "linear"):
        return "backend has no linear"
    x, w, b = _inputs(gen, _device(backend))
    with torch.no_grad():
        y1 = backend.linear(x, w, b, recipe)
        y2 = backend.linear(x, w * 2, b, recipe)
    if torch.equal(y1, y2):
        raise NumericsError(f"recipe {recipe.name}: doubling the weight left the output unchanged "
                            "(a stale cached quantized weight?)")
    return None


def check_repeatable(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """Repeat calls are bit-identical (recipes without SR; SR recipes with the same seed)."""
    if not hasattr(backend, "linear"):
        return "backend has no linear"
    x, w, b = _inputs(gen, _device(backend))
    outs = [_linear(backend, x, w, b, recipe, seed=7)[3].detach() for _ in range(2)]
    _bitwise(numerics, outs[1], outs[0], recipe=recipe.name, layer="repeat call", direction="fwd")
    return None


def check_nan_propagates(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """NaN in gives NaN out (in that row), never a silent finite value."""
    if not hasattr(backend, "linear"):
        return "backend has no linear"
    x, w, b = _inputs(gen, _device(backend))
    x[3, 5] = float("nan")
    with torch.no_grad():
        y = backend.linear(x, w, b, recipe)
    if not torch.isnan(y[3]).any():
        raise NumericsError(f"recipe {recipe.name}: a NaN in row 3 of x gave a finite row 3 of y")
    return None


def check_shapes(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """3D input [B, S, K] gives [B, S, N] in the recipe's output dtype, equal to the 2D call."""
    if not hasattr(backend, "linear"):
        return "backend has no linear"
    x, w, b = _inputs(gen, _device(backend))
    with torch.no_grad():
        y3 = backend.linear(x.view(2, _M // 2, _K), w, b, recipe)
        y2 = backend.linear(x, w, b, recipe)
    if y3.shape != (2, _M // 2, _N) or y3.dtype != recipe.out_dtype:
        raise NumericsError(f"recipe {recipe.name}: 3D input gave shape {tuple(y3.shape)} {y3.dtype}, "
                            f"expected {(2, _M // 2, _N)} {recipe.out_dtype}")
    _bitwise(numerics, y3.reshape(_M, _N), y2, recipe=recipe.name, layer="3D vs 2D", direction="fwd")
    return None


class _Reference:
    """The reference Function as a backend, for the 'same quantized operands' comparison."""

    name = "reference"

    def linear(self, x, w, b, recipe):
        return quant_linear(x, w, b, recipe)


CHECKS: dict[str, Callable[..., str | None]] = {
    "quantize": check_quantize,
    "gemm": check_gemm,
    "linear": check_linear,
    "weight_change": check_weight_change,
    "repeatable": check_repeatable,
    "nan": check_nan_propagates,
    "shapes": check_shapes,
}


def run_checks(backend: Any, recipe: Recipe, seed: int = 0) -> dict[str, str]:
    """name -> "ok", "skipped: ..." or "FAILED: ..." for every check (for the known-bad tests)."""
    out = {}
    for name, check in CHECKS.items():
        gen = torch.Generator().manual_seed(seed)
        try:
            skipped = check(backend, recipe, gen)
        except NumericsError as e:
            out[name] = f"FAILED: {str(e).splitlines()[0]}"
        else:
            out[name] = f"skipped: {skipped}" if skipped else "ok"
    return out
