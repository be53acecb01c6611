"""The slow, obvious path beside ``formats.encode``: Python ints and Fractions, one value
at a time, by looking the two neighbouring codes up in a sorted table.

It shares no arithmetic with the fast path (no bit shifts of the source float), so the
tests can hold the two against each other on every code and every tie.
"""

from __future__ import annotations

import bisect
import functools
import math
from fractions import Fraction

from mxcheck.formats import FloatFormat, get_format

__all__ = ["decode_scalar", "encode_scalar"]


def _is_nan_code(code: int, fmt: FloatFormat) -> bool:
    mag = code & fmt.magnitude_mask
    field, mant = mag >> fmt.mbits, mag & ((1 << fmt.mbits) - 1)
    top = (1 << fmt.ebits) - 1
    if fmt.nan == "ieee":
        return field == top and not (fmt.inf and mant == 0)
    if fmt.nan == "ocp":
        return field == top and mant == (1 << fmt.mbits) - 1
    if fmt.nan == "fnuz":
        return code == fmt.sign_mask
    return False


def _significand(mag: int, fmt: FloatFormat) -> tuple[int, int]:
    """(integer significand, exponent of its unit) of a finite magnitude code."""
    field, mant = mag >> fmt.mbits, mag & ((1 << fmt.mbits) - 1)
    if field == 0 and fmt.subnormals:
        return mant, fmt.emin - fmt.mbits
    return (1 << fmt.mbits) + mant, field - fmt.bias - fmt.mbits


def decode_scalar(code: int, fmt: str | FloatFormat) -> float:
    """Value of one code as a Python float (float64); NaN and +-Inf where the format has them."""
    fmt = get_format(fmt)
    if _is_nan_code(code, fmt):
        return math.nan
    negative = bool(code & fmt.sign_mask)
    mag = code & fmt.magnitude_mask
    if fmt.inf and mag == fmt.inf_code:
        return -math.inf if negative else math.inf
    sig, unit = _significand(mag, fmt)
    value = math.ldexp(sig, unit)
    return -value if negative else value


@functools.cache
def _table(fmt: FloatFormat) -> tuple[list[Fraction], list[int]]:
    """Finite non-negative values in increasing order, their codes, and one step past max."""
    pairs = []
    for mag in range(fmt.max_code + 1):
        if _is_nan_code(mag, fmt):
            continue
        sig, unit = _significand(mag, fmt)
        pairs.append((Fraction(sig) * Fraction(2) ** unit, mag))
    pairs.sort()
    sig, unit = _significand(fmt.max_code, fmt)
    beyond = Fraction(sig + 1) * Fraction(2) ** unit  # the next grid point above max
    return [v for v, _ in pairs] + [beyond], [c for _, c in pairs] + [-1]


def _round_up(lo: Fraction, hi: Fraction, a: Fraction, lo_sig_odd: bool, rounding: str, u) -> bool:
    if rounding == "trunc":
        return False
    if rounding == "half_away":
        return a - lo >= hi - a
    if rounding == "half_zero":
        return a - lo > hi - a
    if rounding == "rne":
        return a - lo > hi - a or (a - lo == hi - a and lo_sig_odd)
    if rounding == "sr":
        return (a - lo) / (hi - lo) >= 1 - Fraction(u)
    raise ValueError(f"rounding={rounding!r}")


def encode_scalar(
    value: float, fmt: str | FloatFormat, rounding: str = "rne", saturate: bool = True, u: float | None = None
) -> int:
    """Code of one value in fmt under the same policies as ``formats.encode``."""
    fmt = get_format(fmt)
    negative = math.copysign(1.0, value) < 0
    sign = fmt.sign_mask if (negative and fmt.signed) else 0
    nan_code = None if fmt.nan_code is None else (
        fmt.nan_code if fmt.nan == "fnuz" or not fmt.signed else fmt.nan_code | sign
    )
    if math.isnan(value):
        if nan_code is None:
            raise ValueError(f"{fmt.name} has no NaN")
        return nan_code

    def overflow(sat: bool) -> int:
        if sat:
            return fmt.max_code | sign
        if fmt.inf:
            return fmt.inf_code | sign
        return nan_code if nan_code is not None else fmt.max_code | sign

    if math.isinf(value):
        code = overflow(saturate)
    else:
        values, codes = _table(fmt)
        a = Fraction(abs(value))
        i = bisect.bisect_right(values, a) - 1  # values[i] <= a < values[i + 1]
        if i == len(values) - 1:  # at or past the grid point after max: overflow
            lo, hi, lo_code, hi_code, lo_odd = a, a, -1, -1, False
        elif i < 0:  # below the smallest value (e8m0 has no zero)
            lo, hi, lo_code, hi_code, lo_odd = Fraction(0), values[0], None, codes[0], False
        elif values[i] == a:
            lo, hi, lo_code, hi_code, lo_odd = a, a, codes[i], codes[i], False
        else:
            lo, hi, lo_code, hi_code = values[i], values[i + 1], codes[i], codes[i + 1]
            lo_odd = _significand(lo_code, fmt)[0] % 2 == 1
        chosen = hi_code if (lo != hi and _round_up(lo, hi, a, lo_odd, rounding, u)) else lo_code
        if chosen is None:
            return nan_code
        if chosen == -1:
            code = overflow(saturate or rounding == "trunc")
        elif fmt.nan == "fnuz" and chosen == 0:
            code = 0
        else:
            code = chosen | sign
    if not fmt.signed and negative and (code != 0 or not fmt.has_zero):
        return nan_code
    return code
