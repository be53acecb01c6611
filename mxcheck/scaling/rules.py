"""E8M0 scale rules for MX block scaling, exactly as torchao's ScaleCalculationMode.

Every rule reads exponents from float32 bits (never a float32 ``log2``: ``log2`` of
nextbelow(2**k) rounds to k and picks a scale one binade too high, the bug in
microxcaling's Python path and in gfloat on float32 arrays). A rule maps the float32
block amax to an unbiased exponent; ``scale_bytes`` clamps it to [-127, 127], biases it,
and applies the zero-block and NaN policies.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mxcheck.formats import FloatFormat

__all__ = ["E8M0_NAN", "SCALE_RULES", "check_scale_rule", "scale_bytes"]

E8M0_NAN = 255
_F32_BIAS = 127
_F32_MBITS = 23


def _fields(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    bits = a.view(torch.int32)
    return (bits >> _F32_MBITS) & 0xFF, bits & ((1 << _F32_MBITS) - 1)


def _floor(amax: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    # OCP MX v1.0: floor(log2 amax) - emax; a subnormal amax has field 0, i.e. -127.
    field, _ = _fields(amax)
    return field - _F32_BIAS - fmt.emax


def _ceil(amax: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    # ceil(log2 amax) - emax (torchao CEIL; not RCEIL: amax = 448 in e4m3 gives 2^1 here).
    field, mant = _fields(amax)
    return field - _F32_BIAS + (mant != 0).to(field.dtype) - fmt.emax


def _even(amax: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    # Round amax to the element's precision, then floor: Primus-Turbo MXFP4
    # compute_tile_scale, AITER MxScaleRoundMode.Even, torchao EVEN. Carry may reach Inf's
    # field (255), which then reads 128 - emax like an Inf amax.
    bumped = amax.view(torch.int32) + (1 << (_F32_MBITS - 1 - fmt.mbits))
    field = (bumped >> _F32_MBITS) & 0xFF
    return field - _F32_BIAS - fmt.emax


def _rceil(amax: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    # ceil(log2(amax / max_elem)), the division in float32 as torchao 0.18 does (TE and cuBLAS
    # multiply by a float32 reciprocal instead; a profile detail). A float32-subnormal
    # quotient rounds up to byte 1 only above 2^-127, which byte 0 already holds.
    # float64 then float32 is the correctly rounded float32 quotient (53 >= 2*24 + 2), and
    # stays so when a compiler turns the division into a reciprocal multiply (Inductor does).
    descale = (amax.to(torch.float64) / fmt.max).to(torch.float32)
    field, mant = _fields(descale)
    normal = field > 0
    up = torch.where(normal, mant != 0, mant > (1 << (_F32_MBITS - 1)))
    return torch.where(normal, field, 0) - _F32_BIAS + up.to(field.dtype)


SCALE_RULES: dict[str, Callable[[torch.Tensor, FloatFormat], torch.Tensor]] = {
    "floor": _floor,
    "ceil": _ceil,
    "even": _even,
    "rceil": _rceil,
}


def check_scale_rule(scale_rule: str) -> None:
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"scale_rule={scale_rule!r} is not known; expected one of {sorted(SCALE_RULES)}")


def scale_bytes(amax: torch.Tensor, fmt: FloatFormat, scale_rule: str, zero_scale: int = 0) -> torch.Tensor:
    """Biased E8M0 scale byte per block from the float32 block amax.

    All-zero blocks get ``zero_scale``; a NaN amax gives 255 (E8M0 NaN); an Inf amax
    follows the rule's arithmetic on its float32 bits (floor/ceil/even: 128 - emax,
    rceil: 127), then everything is clamped to [-127, 127].
    """
    check_scale_rule(scale_rule)
    amax = amax.to(torch.float32)
    e = SCALE_RULES[scale_rule](amax, fmt).clamp(-127, 127) + 127
    e = torch.where(amax == 0, zero_scale, e)
    e = torch.where(torch.isnan(amax), E8M0_NAN, e)
    return e.to(torch.uint8)
