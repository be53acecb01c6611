"""A linear's stochastically rounded GEMMs judged by SR statistics, for a backend that draws
its own SR bits (``sr_bits="own"``), where closeness to the reference Function's bits
would need the oracle's random bits.

For one GEMM ``O = A B^T`` whose operand A rounds stochastically (the other, B, is
deterministic), every element of A is one of its two grid neighbours lo, hi (the oracle's
quantization with u = 0 and u = 255/256), so O is a sum of independent two-valued terms.
Against the reference Function's output O_ref (the oracle's SR with independent bits) on
the same inputs, per draw:

- **spread**: each output lies in the SR envelope, between the sums of the smaller and of
  the larger of ``lo b`` and ``hi b`` (deterministic: no false failure);
- **bias**: for a direction c fixed before the draw, ``T = sum c (O - O_ref)`` is a sum of
  independent terms ``(A - A_ref) (c B)`` of mean at most ``2 SR_RESOLUTION |d| |cB|``
  (d = hi - lo: both up-probabilities within SR_RESOLUTION of frac) and variance at most
  ``d^2 (cB)^2 / 2``, so Bernstein's inequality (``bernstein_deviation``) bounds |T| for
  every unbiased SR. The directions are where the usual biases move the output:
  "toward rounding up" (``d B^T``: a skewed threshold, truncation) and "toward rounding
  to nearest" (``(Q_half - mid) B^T``, Q_half the oracle's rounding with u = 1/2: an SR
  that drops its random bits).

Each output is weighted by 1 / (its largest SR variance + its output rounding squared), from
the oracle's terms only, so that no few outputs of the top binades carry the statistic.
One output rounding and a float32 accumulation on each side are allowed for (``eps``).
Per-element bias with thousands of draws is ``check_sr_unbiased``'s job; this judges the
linear as check_linear calls it, at the cost of four oracle quantizations per SR GEMM.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mxcheck.assertions import NumericsError
from mxcheck.conformance._common import _snr, fresh_state
from mxcheck.conformance.sr import SR_FALSE_FAILURE, SR_RESOLUTION, bernstein_deviation
from mxcheck.gemm import dequantize_operand, quantize_operand
from mxcheck.recipes import GEMMS, Recipe

__all__ = ["OWN_BITS", "check_sr_linear", "sr_statistics_reason"]

OWN_BITS = "SR statistics (backend's own bits)"  # the layer prefix of every record made here
# Bias directions: name -> what a failure there suggests
_DIRECTIONS = {
    "toward rounding up": "a skewed SR threshold or truncation",
    "toward rounding to nearest": "an SR that ignores its random bits (rounds to nearest)",
}


def _sr_side(recipe: Recipe, direction: str) -> tuple[int, str, str]:
    """(index of the SR operand in GEMMS[direction], its name, the other operand's name)."""
    a, b, _ = GEMMS[direction]
    return (0, a, b) if recipe.spec(a).rounding == "sr" else (1, b, a)


def sr_statistics_reason(recipe: Recipe, directions: tuple[str, ...]) -> str | None:
    """Why the SR statistics cannot judge these GEMMs of ``recipe``, or None."""
    for d in directions:
        a, b, _ = GEMMS[d]
        if recipe.spec(a).rounding == recipe.spec(b).rounding == "sr":
            return (f"recipe {recipe.name} rounds both {d} operands ({a}, {b}) stochastically; the SR statistics "
                    "for a backend's own bits take one SR operand per GEMM")
        other = _sr_side(recipe, d)[2]
        if recipe.spec(other).scaling == "delayed":
            return (f"recipe {recipe.name}: {other} (the {d} partner of an SR operand) has delayed scaling, "
                    "whose warmed history the SR statistics do not follow")
    return None


def _gemm_inputs(recipe: Recipe, direction: str, x: torch.Tensor, w: torch.Tensor,
                 dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two tensors the reference Function quantizes for ``direction`` (GEMMS order)."""
    g = dy.to(recipe.out_dtype)  # the backward receives dY in the output's dtype
    return {"fwd": (x, w), "dgrad": (g, w.t()), "wgrad": (g.t(), x.t())}[direction]


def _dense(*qs: Any) -> list[torch.Tensor]:
    """Quantized operands as float64 matrices with one (padded) contraction length."""
    ds = [dequantize_operand(q, dtype=torch.float64) for q in qs]
    k = max(d.shape[1] for d in ds)
    return [torch.nn.functional.pad(d, (0, k - d.shape[1])) for d in ds]


def _oracle_terms(recipe: Recipe, direction: str, x: torch.Tensor, w: torch.Tensor,
                  dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """lo, Q_half, hi of the SR operand (rows: outputs' first axis) and the other operand B."""
    side, sr_op, other_op = _sr_side(recipe, direction)
    pair = _gemm_inputs(recipe, direction, x, w, dy)
    t, other = pair[side].contiguous(), pair[1 - side].contiguous()
    spec = recipe.spec(sr_op)
    qs = [quantize_operand(t, spec, rand=torch.full(t.shape, u, dtype=torch.uint8, device=t.device))
          for u in (0, 128, 255)]
    return tuple(_dense(*qs, quantize_operand(other, recipe.spec(other_op), **fresh_state(recipe, other_op))))


def _bounded(numerics: Any, value: float, allow: float, message: str, **context: Any) -> None:
    """|value| <= allow, recorded (with ``numerics``) as the SNR of allow against value:
    20 log10(allow / |value|) over a 0 dB floor, so the report shows the margin."""
    if numerics is not None:
        one = torch.ones(1, dtype=torch.float64)
        try:
            _snr(numerics, one * (allow + value), one * allow, 0.0, **context)
        except NumericsError as e:
            raise NumericsError(message) from e
    if not abs(value) <= allow:
        raise NumericsError(message)


def _one_draw(recipe: Recipe, direction: str, side: int, inputs: dict, got: torch.Tensor,
              ref: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    """One draw of one SR GEMM: the largest |output - envelope middle| / half-width, and per
    bias direction (T, summed variances V, largest term M, resolution bias, rounding eps)."""
    u_out = torch.finfo(recipe.out_dtype).eps / 2
    lo, half, hi, b = _oracle_terms(recipe, direction, inputs["x"], inputs["w"], inputs["dy"])
    o, o_ref = (t.double() if side == 0 else t.double().T for t in (got, ref))
    d, mid, ab = hi - lo, (lo + hi) / 2, b.abs()
    # One rounding of each side's output (at most u |rounded value|) and the float32 sums
    eps = u_out * (o.abs() + o_ref.abs()) + 2 * (b.shape[1] + 2) * 2.0**-24 * (torch.maximum(lo.abs(), hi.abs()) @ ab.T)
    if direction == "fwd":  # the bias is added inside the forward GEMM, before its rounding
        bias = inputs["b"].double()
        bias = bias if side == 0 else bias.unsqueeze(1)
        o, o_ref = o - bias, o_ref - bias
    centre, spread = mid @ b.T, (d.abs() / 2) @ ab.T
    off = (o - centre).abs()
    ratio = torch.where(off == 0, torch.zeros_like(off), off / (spread + eps))  # a NaN output: NaN
    var = (d**2) @ (b**2).T / 4
    inv = torch.where(var > 0, 1 / (var + (u_out * (centre.abs() + spread)) ** 2), torch.zeros_like(var))
    terms = {}
    for name, c in zip(_DIRECTIONS, (d @ b.T, (half - mid) @ b.T), strict=True):
        c = c * inv
        dw = (d * (c @ b)).abs()
        terms[name] = torch.stack([(c * (o - o_ref)).sum(), 0.5 * (dw**2).sum(), 2 * dw.max(), dw.sum(),
                                   (c.abs() * eps).sum()])
    return float(ratio.nan_to_num(nan=math.inf).max()), terms


def check_sr_linear(numerics: Any, recipe: Recipe, draws: list[tuple[dict, dict, dict]],
                    directions: tuple[str, ...], ctx: dict[str, Any]) -> None:
    """Hold ``directions`` (SR GEMMs of a backend with its own bits) to SR statistics.

    ``draws``: (inputs {"x", "w", "b", "dy"}, the backend's outputs, the reference
    Function's outputs) per input draw, outputs keyed by direction; ``ctx``: the records'
    recipe, m, n, k. Fails, naming SR and the bits' source, outside the envelope or when a
    bias statistic exceeds its Bernstein bound (false failure at most SR_FALSE_FAILURE per
    call, all statistics together)."""
    log_term = math.log(2 * len(_DIRECTIONS) * len(directions) / SR_FALSE_FAILURE)
    for direction in directions:
        side, sr_op, other_op = _sr_side(recipe, direction)
        where = (f"{direction} of recipe {recipe.name}: {OWN_BITS}, sr_bits='own', {sr_op} rounded "
                 "stochastically")
        sums = {name: torch.zeros(5, dtype=torch.float64) for name in _DIRECTIONS}  # T, V, M, bias, eps
        worst = 0.0
        for inputs, got, ref in draws:
            ratio, terms = _one_draw(recipe, direction, side, inputs, got[direction], ref[direction])
            worst = max(worst, ratio)
            for name, t in terms.items():
                largest = max(float(sums[name][2]), float(t[2]))  # M is a max over the draws, not a sum
                sums[name] += t
                sums[name][2] = largest
        # recorded only when it fails: outputs of rows with one non-zero term sit on the
        # envelope's edge by construction, so its margin is about 0 dB and says nothing
        _bounded(numerics if worst > 1 else None, worst, 1.0,
                 f"{where}: an output lies {worst:.3g} envelope half-widths from the middle of the SR envelope "
                 f"(between all-lo and all-hi roundings of {sr_op}): not a stochastic rounding of {sr_op}, or "
                 f"{other_op} quantized unlike the oracle", layer=f"{OWN_BITS}: within the SR envelope",
                 direction=direction, **ctx)
        for name, (t, v, m, bias, eps) in sums.items():
            allow = float(bernstein_deviation(v, m, log_term) + 2 * SR_RESOLUTION * bias + eps)
            _bounded(numerics, float(t), allow,
                     f"{where}: over {len(draws)} draws the output moves {name} by {float(t):.4g} against the "
                     f"reference Function's SR; an unbiased SR (up-probability within {SR_RESOLUTION:.4g} of frac) "
                     f"stays within {allow:.4g} (Bernstein, false failure {SR_FALSE_FAILURE:g} per call): "
                     f"biased SR of {sr_op} ({_DIRECTIONS[name]}), or {other_op} quantized unlike the oracle",
                     layer=f"{OWN_BITS}: no bias {name}", direction=direction, **ctx)
