"""Element formats as data, and exact encode / decode / cast.

A format is one frozen :class:`FloatFormat`; every derived constant is a property.
``encode`` rounds on the integer bits of the float32 (or float64) input, so it is
exact for every input, including subnormals of both source and target, and never
goes through a float ``log2``. ``mxcheck.reference`` holds the slow Python-int
reference that the tests hold this fast path against.

Over 400 lines on purpose: the format table, the decode table and the two encode paths
(integer bits, the exact one; float passes, the fast one) read the same field layout, and
the tests hold the paths against each other code by code; split, each would import the
other's private helpers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "FORMATS",
    "ROUNDINGS",
    "FloatFormat",
    "cast",
    "decode",
    "encode",
    "get_format",
]

NanStyle = Literal["none", "ieee", "ocp", "fnuz"]
Rounding = Literal["rne", "half_away", "half_zero", "sr", "trunc"]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format; codes are its bits in the low bits of an integer.

    ``nan`` says which codes are NaN: ``"none"`` (no NaN, as the OCP fp4/fp6 types),
    ``"ieee"`` (all-ones exponent field; with ``inf`` the zero-mantissa code there is Inf),
    ``"ocp"`` (only the all-ones exponent and mantissa, as OCP e4m3fn) or ``"fnuz"``
    (the negative-zero code, as the AMD fnuz types).
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    nan: NanStyle = "none"
    inf: bool = False
    signed: bool = True
    subnormals: bool = True
    torch_dtype_name: str | None = None

    def __str__(self) -> str:
        return self.name

    @property
    def bits(self) -> int:
        """Width of a code in bits."""
        return self.ebits + self.mbits + int(self.signed)

    @property
    def sign_mask(self) -> int:
        return 1 << (self.bits - 1) if self.signed else 0

    @property
    def code_dtype(self) -> torch.dtype:
        return torch.uint8 if self.bits <= 8 else torch.int32

    @property
    def magnitude_mask(self) -> int:
        return (1 << (self.ebits + self.mbits)) - 1

    @property
    def max_code(self) -> int:
        """The largest finite positive code."""
        top_field = (1 << self.ebits) - 1
        mant_ones = (1 << self.mbits) - 1
        if self.nan == "ieee":
            return ((top_field - 1) << self.mbits) | mant_ones
        if self.nan == "ocp":
            return (top_field << self.mbits) | (mant_ones - 1)
        return self.magnitude_mask

    @property
    def emax(self) -> int:
        """Exponent of the largest power of two the format holds."""
        return (self.max_code >> self.mbits) - self.bias

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal (code field 1, or field 0 without subnormals)."""
        return (1 if self.subnormals else 0) - self.bias

    @property
    def max(self) -> float:
        mant = self.max_code & ((1 << self.mbits) - 1)
        return (1 + mant / (1 << self.mbits)) * 2.0**self.emax

    @property
    def min_normal(self) -> float:
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mbits) if self.subnormals else self.min_normal

    @property
    def has_zero(self) -> bool:
        return self.subnormals

    @property
    def nan_code(self) -> int | None:
        """The canonical (positive) NaN code: all magnitude bits set, or the fnuz code."""
        if self.nan == "none":
            return None
        if self.nan == "fnuz":
            return self.sign_mask
        return self.magnitude_mask

    @property
    def inf_code(self) -> int | None:
        return ((1 << self.ebits) - 1) << self.mbits if self.inf else None

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype with this exact layout, where this torch build has one."""
        return getattr(torch, self.torch_dtype_name, None) if self.torch_dtype_name else None


FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        FloatFormat("e2m1", 2, 1, bias=1, torch_dtype_name="float4_e2m1fn_x2"),
        FloatFormat("e2m3", 2, 3, bias=1),
        FloatFormat("e3m2", 3, 2, bias=3),
        FloatFormat("e4m3", 4, 3, bias=7, nan="ocp", torch_dtype_name="float8_e4m3fn"),
        FloatFormat("e5m2", 5, 2, bias=15, nan="ieee", inf=True, torch_dtype_name="float8_e5m2"),
        FloatFormat("e4m3fnuz", 4, 3, bias=8, nan="fnuz", torch_dtype_name="float8_e4m3fnuz"),
        FloatFormat("e5m2fnuz", 5, 2, bias=16, nan="fnuz", torch_dtype_name="float8_e5m2fnuz"),
        FloatFormat("e8m0", 8, 0, bias=127, nan="ieee", signed=False, subnormals=False,
                    torch_dtype_name="float8_e8m0fnu"),
        # NVFP4 block scale: e4m3 without its sign bit; its byte is e4m3fn's positive code.
        FloatFormat("ue4m3", 4, 3, bias=7, nan="ocp", signed=False, torch_dtype_name="float8_e4m3fn"),
        FloatFormat("bf16", 8, 7, bias=127, nan="ieee", inf=True, torch_dtype_name="bfloat16"),
        FloatFormat("fp16", 5, 10, bias=15, nan="ieee", inf=True, torch_dtype_name="float16"),
    )
}


def get_format(fmt: str | FloatFormat) -> FloatFormat:
    """Look a format up by name; a FloatFormat passes through."""
    if isinstance(fmt, FloatFormat):
        return fmt
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not a known format; expected one of {sorted(FORMATS)}")
    return FORMATS[fmt]


# ---------------------------------------------------------------------------------------
# Rounding: every mode is one predicate "round the magnitude away from zero?" over the
# integer quotient q, the remainder rem of the shifted significand, the shift, and the
# uniform u in [0, 1) that stochastic rounding consumes.


def _away_rne(q, rem, shift, u):
    half = torch.ones_like(rem) << (shift.clamp(min=1) - 1)
    return (rem > half) | ((rem == half) & ((q & 1) == 1))


def _away_half_away(q, rem, shift, u):
    half = torch.ones_like(rem) << (shift.clamp(min=1) - 1)
    return rem >= half


def _away_half_zero(q, rem, shift, u):
    half = torch.ones_like(rem) << (shift.clamp(min=1) - 1)
    return rem > half


def _away_trunc(q, rem, shift, u):
    return torch.zeros_like(rem, dtype=torch.bool)


def _away_sr(q, rem, shift, u):
    # frac = rem / 2**shift exactly in float64; round away iff frac + u >= 1. With u taken
    # from 8 random bits this is gfloat's StochasticFastest(srnumbits=8) and TE's SR fallback.
    frac = torch.ldexp(rem.to(torch.float64), -shift.to(torch.float64))
    return frac >= 1.0 - u


ROUNDINGS: dict[str, Callable] = {
    "rne": _away_rne,
    "half_away": _away_half_away,
    "half_zero": _away_half_zero,
    "sr": _away_sr,
    "trunc": _away_trunc,
}

# source float dtype -> (integer view, exponent bits, mantissa bits)
_SOURCE_LAYOUTS = {torch.float32: (torch.int32, 8, 23), torch.float64: (torch.int64, 11, 52)}
_ACCEPTED_INPUTS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def check_float_tensor(x: torch.Tensor, name: str = "x") -> None:
    """TypeError unless x is a real floating tensor mxcheck can round exactly."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _ACCEPTED_INPUTS:
        raise TypeError(
            f"{name}.dtype={x.dtype} is not accepted; expected one of "
            f"{[str(d) for d in _ACCEPTED_INPUTS]} (integer and complex inputs have no rounding)"
        )


# What every quantizer takes: its scale arithmetic reads float32 bits, and the kernels it
# models (TE, torchao, Primus-Turbo, AITER) read at most float32.
QUANTIZE_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


def check_quantize_input(x: torch.Tensor, who: str) -> None:
    """TypeError unless x is a float32, bfloat16 or float16 tensor; ``who`` names the caller."""
    check_float_tensor(x)
    if x.dtype not in QUANTIZE_INPUTS:
        raise TypeError(f"x.dtype={x.dtype}; {who} takes {[str(d) for d in QUANTIZE_INPUTS]} (scales are "
                        "computed on float32 bits, as the kernels do: convert float64 input explicitly)")


def check_bool(value: object, name: str) -> None:
    """TypeError unless value is a bool (a truthy "no" or a None must not pick a policy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} ({type(value).__name__}); expected True or False")


def check_rounding(rounding: str, rand: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """Validate rounding and rand; return the uniform u in [0, 1) as float64, or None."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding={rounding!r} is not known; expected one of {sorted(ROUNDINGS)}")
    if rounding != "sr":
        if rand is not None:
            raise ValueError(f"rand is only used with rounding='sr', got rounding={rounding!r}")
        return None
    check_rand(rand, like)
    return uniforms(rand)


def check_rand(rand: torch.Tensor | None, like: torch.Tensor) -> None:
    """rand is SR's randomness for ``like``: uint8 bits or float32 uniforms in [0, 1), its shape
    and device."""
    if rand is None:
        raise ValueError("rounding='sr' needs rand: uint8 random bits or float32 uniforms in [0, 1), shaped like x")
    if not isinstance(rand, torch.Tensor):
        raise TypeError(f"rand must be a torch.Tensor, got {type(rand).__name__}")
    if tuple(rand.shape) != tuple(like.shape):
        raise ValueError(f"rand.shape={tuple(rand.shape)} must equal the input's shape {tuple(like.shape)}")
    if rand.device != like.device:
        raise ValueError(f"rand.device={rand.device} must equal the input's device {like.device}")
    if rand.dtype == torch.float32:
        if not bool(((rand >= 0) & (rand < 1)).all()):
            raise ValueError("rand holds float32 values outside [0, 1) (or NaN); expected uniforms in [0, 1)")
    elif rand.dtype != torch.uint8:
        raise TypeError(f"rand.dtype={rand.dtype}; expected torch.uint8 (8 random bits) or torch.float32 in [0, 1)")


def uniforms(rand: torch.Tensor) -> torch.Tensor:
    """SR's u in [0, 1) as float64 from a checked rand: bits / 256, or the float32 uniforms."""
    return rand.to(torch.float64) / 256.0 if rand.dtype == torch.uint8 else rand.to(torch.float64)


def encode_bits(
    x: torch.Tensor,
    fmt: FloatFormat,
    rounding: str = "rne",
    saturate: bool = True,
    u: torch.Tensor | None = None,
) -> torch.Tensor:
    """Codes of x in fmt, exact; NaN in a format without NaN gives code 0.

    The shared core of ``encode`` and the quantizers: no validation and no host sync.
    Saturating casts of float32/bf16/fp16 into the signed 4-8 bit formats take a float
    path (``encode_bits_float``, about 15 elementwise passes); everything else takes the
    integer path (``encode_bits_int``). Both are exact and tested against each other.
    """
    if saturate and fmt.signed and fmt.bits <= 8 and x.dtype in _FLOAT_PATH_INPUTS:
        return encode_bits_float(x, fmt, rounding, u)
    return encode_bits_int(x, fmt, rounding, saturate, u)


_FLOAT_PATH_INPUTS = QUANTIZE_INPUTS
_F32_EXP_MASK = 0x7F800000


def _round_int_rne(t, u):
    return t.round_()  # ties to even


def _round_int_half_away(t, u):
    # not floor(t + 0.5): that sum rounds up for t = nextbelow(0.5) in float32. t >= 0 here
    # and is consumed: t - floor(t) is exact, and is computed in t's own buffer.
    r = torch.floor(t)
    return r.add_(t.sub_(r) >= 0.5)


def _round_int_half_zero(t, u):
    # ties toward zero: as half_away, but only a fraction above one half rounds up
    r = torch.floor(t)
    return r.add_(t.sub_(r) > 0.5)


def _round_int_trunc(t, u):
    return t.floor_()


def _round_int_sr(t, u):
    # float64: t has <= 24 significant bits above 2**-24 and u is a float32 or k/256, so
    # t + u is exact and floor(t + u) rounds up exactly when frac(t) >= 1 - u.
    return torch.floor(t.to(torch.float64) + u).to(torch.float32)


_ROUND_TO_INT = {"rne": _round_int_rne, "half_away": _round_int_half_away, "half_zero": _round_int_half_zero,
                 "trunc": _round_int_trunc, "sr": _round_int_sr}


def encode_bits_float(x: torch.Tensor, fmt: FloatFormat, rounding: str = "rne",
                      u: torch.Tensor | None = None, *, scale: torch.Tensor | None = None,
                      nan_codes: bool = True) -> torch.Tensor:
    """Saturating codes of x * scale (float32/bf16/fp16) in a signed format of <= 8 bits.

    |x| is clamped to max (which maps Inf to max), divided by its quantum
    2**(E - mbits) with E = max(exponent, emin) read from the float32 bits (a power-of-two
    multiply, exact), rounded to an integer significand r, and the code is
    ((E - emin) << mbits) + r: one formula for subnormals, normals and the carry. RNE into
    a format torch has a dtype for is torch's own conversion after the clamp (checked
    against the integer path on every code and tie). ``scale`` (broadcast, a power of two)
    is multiplied in first; ``nan_codes=False`` skips the NaN fix-up for callers that
    overwrite NaN blocks themselves.
    """
    # x * scale promotes a bf16/fp16 x to float32 in the same pass
    a = x * scale.to(torch.float32) if scale is not None else x.to(torch.float32, copy=True)
    if rounding == "rne" and fmt.torch_dtype is not None and fmt.bits == 8:
        # clamp keeps NaN, and torch's cast keeps a NaN's sign as the integer path does
        code = a.clamp_(-fmt.max, fmt.max).to(fmt.torch_dtype).view(torch.uint8)
        if x.dtype == torch.float16 and fmt.nan != "fnuz":  # float16 -> float32 drops a NaN's sign
            code = code | ((torch.isnan(a) & torch.signbit(x)).to(torch.uint8) << 7)
        return code
    nan = torch.isnan(a) if nan_codes else None
    a.abs_().clamp_(max=fmt.max)  # Inf -> max; a NaN stays NaN and its code is fixed below
    # E's float32 exponent field, at least emin's. 1 / quantum = 2**(mbits - E) has the field
    # 127 + mbits - E: formed in the same int32 buffer, and turned back after the multiply.
    field = (a.view(torch.int32) & _F32_EXP_MASK).clamp_(min=(fmt.emin + 127) << 23)
    inv_quantum = (2 * 127 + fmt.mbits) << 23
    a.mul_(field.neg_().add_(inv_quantum).view(torch.float32))
    r = _ROUND_TO_INT[rounding](a, u)
    # (E - emin) << mbits, from the buffer that holds inv_quantum - field
    mag = field.neg_().add_(inv_quantum - ((127 + fmt.emin) << 23)).bitwise_right_shift_(23 - fmt.mbits)
    code = mag.add_(r.to(torch.int32)).to(torch.uint8)
    # signbit of the source itself: torch's float16 -> float32 cast drops a NaN's sign
    sign = torch.signbit(x).to(torch.uint8).bitwise_left_shift_(fmt.bits - 1)
    if fmt.nan == "fnuz":  # no negative zero: the sign goes only on non-zero codes
        sign.mul_(code != 0)
    code.bitwise_or_(sign)
    if nan is not None:
        nan_code = 0 if fmt.nan_code is None else fmt.nan_code if fmt.nan == "fnuz" else sign.bitwise_or_(fmt.nan_code)
        code = torch.where(nan, nan_code, code)
    return code


def encode_bits_int(
    x: torch.Tensor,
    fmt: FloatFormat,
    rounding: str = "rne",
    saturate: bool = True,
    u: torch.Tensor | None = None,
    scale_exp: torch.Tensor | None = None,
) -> torch.Tensor:
    """Codes of x / 2**scale_exp in fmt, by integer arithmetic on the float32/float64 bits.

    Exact for every input and format (16-bit and unsigned formats, non-saturating casts,
    float64 sources, and a per-element scale exponent divided out exactly even where
    x / 2**e would be a float32 subnormal).
    """
    src = _source_bits(x)
    exp = src.exp if scale_exp is None else src.exp - scale_exp.to(src.exp.dtype)
    exp_eff = exp.clamp(min=fmt.emin)
    shift = exp_eff - exp + (src.mbits - fmt.mbits)
    # Beyond src_mbits + 2 the quotient is 0 and rem = sig in every mode; capping keeps the
    # shifts inside the integer width. SR reads the true shift.
    shift_c = shift.clamp(max=src.mbits + 2)
    q = src.sig >> shift_c
    rem = src.sig - (q << shift_c)
    q = q + ROUNDINGS[rounding](q, rem, shift if rounding == "sr" else shift_c, u).to(q.dtype)
    # One formula covers normals, subnormals and the carry into the next binade.
    mag = ((exp_eff + (fmt.bias - 1)) << fmt.mbits) + q
    mag = torch.where(src.nonzero, mag, 0)
    return _codes_with_specials(fmt, src, mag, q, saturate or rounding == "trunc", saturate)


@dataclass(frozen=True)
class _SourceBits:
    """A float32/float64 tensor's fields, subnormals normalised: every non-zero significand
    ``sig`` has its leading bit at ``mbits``, and x = sig * 2**(exp - mbits)."""

    negative: torch.Tensor
    sig: torch.Tensor
    exp: torch.Tensor
    nonzero: torch.Tensor
    special: torch.Tensor  # Inf or NaN
    is_nan: torch.Tensor
    mbits: int


def _source_bits(x: torch.Tensor) -> _SourceBits:
    negative = torch.signbit(x)  # before widening: float16 -> float32 drops a NaN's sign
    if x.dtype not in _SOURCE_LAYOUTS:
        x = x.to(torch.float32)
    int_dtype, src_ebits, src_mbits = _SOURCE_LAYOUTS[x.dtype]
    src_bias = (1 << (src_ebits - 1)) - 1
    x = x.contiguous()
    bits = x.view(int_dtype)
    field = (bits >> src_mbits) & ((1 << src_ebits) - 1)
    # Normalise source subnormals (x * 2**K is exact) so every non-zero significand has its
    # leading bit at src_mbits; then one formula holds whatever exponent the scale adds.
    renorm = 2 * src_mbits + 18  # 64 for float32, 122 for float64: lifts the least subnormal
    tiny = field == 0
    bits = torch.where(tiny, (x * 2.0**renorm).view(int_dtype), bits)
    field = (bits >> src_mbits) & ((1 << src_ebits) - 1)
    mant = bits & ((1 << src_mbits) - 1)
    special = field == (1 << src_ebits) - 1
    nonzero = field > 0
    return _SourceBits(negative=negative, sig=torch.where(nonzero, mant | (1 << src_mbits), mant),
                       exp=field - src_bias - tiny.to(field.dtype) * renorm, nonzero=nonzero, special=special,
                       is_nan=special & (mant != 0), mbits=src_mbits)


def _codes_with_specials(fmt: FloatFormat, src: _SourceBits, mag: torch.Tensor, q: torch.Tensor,
                         saturate_overflow: bool, saturate_inf: bool) -> torch.Tensor:
    """The rounded magnitudes ``mag`` as codes: overflow, Inf and NaN by the format's policy,
    then the sign (none for fnuz zero; unsigned formats hold no negative value)."""
    nan_out = src.is_nan
    over = (mag > fmt.max_code) & ~src.special
    is_inf = src.special & ~src.is_nan
    for mask, policy in ((over, _overflow_policy(fmt, saturate_overflow)), (is_inf, _overflow_policy(fmt, saturate_inf))):
        if policy == "nan":
            nan_out = nan_out | mask
        else:
            mag = torch.where(mask, fmt.max_code if policy == "max" else fmt.inf_code, mag)
    if not fmt.has_zero:  # e8m0: a result that rounds to zero has no code
        nan_out = nan_out | ((q == 0) & ~src.special)
    if fmt.signed:
        sign = src.negative & ~((fmt.nan == "fnuz") & (mag == 0))  # fnuz has no -0
        code = mag | (sign.to(mag.dtype) << (fmt.bits - 1))
    else:
        # An unsigned format holds no negative value; -0 (or a negative that rounds to 0) is 0.
        nan_out = nan_out | (src.negative & ((mag != 0) | (not fmt.has_zero)) & ~src.is_nan)
        code = mag
        sign = torch.zeros_like(src.negative)
    if fmt.nan_code is None:
        nan_full = torch.zeros_like(code)  # only reached through the unchecked core
    elif fmt.nan == "fnuz" or not fmt.signed:
        nan_full = torch.full_like(code, fmt.nan_code)
    else:  # torch and ml_dtypes keep the sign of a NaN
        nan_full = fmt.nan_code | (sign.to(code.dtype) << (fmt.bits - 1))
    return torch.where(nan_out, nan_full, code).to(fmt.code_dtype)


def _overflow_policy(fmt: FloatFormat, saturate: bool) -> str:
    """What a finite overflow (or an Inf input) becomes: "max", "inf" or "nan"."""
    if saturate:
        return "max"
    if fmt.inf:
        return "inf"
    # OCP fp4/fp6 have neither Inf nor NaN: they saturate, as ml_dtypes does.
    return "nan" if fmt.nan != "none" else "max"


def encode(
    x: torch.Tensor,
    fmt: str | FloatFormat,
    *,
    rounding: Rounding = "rne",
    saturate: bool = True,
    rand: torch.Tensor | None = None,
) -> torch.Tensor:
    """Round x to fmt and return its codes (uint8; int32 for 16-bit formats).

    ``saturate=True`` clamps finite overflow and Inf to +-max; ``False`` follows the
    format (Inf for e5m2, NaN for e4m3, +-max for the OCP fp4/fp6 types, which have
    neither). ``rounding="trunc"`` never overflows a finite input. NaN into a format
    without NaN is a ValueError.
    """
    fmt = get_format(fmt)
    check_float_tensor(x)
    check_bool(saturate, "saturate")
    u = check_rounding(rounding, rand, x)
    if fmt.nan == "none" and bool(torch.isnan(x).any()):
        raise ValueError(f"x holds NaN but fmt={fmt.name} has no NaN encoding; mask NaN before encoding")
    return encode_bits(x, fmt, rounding, saturate, u)


def _nan_codes(code: torch.Tensor, field: torch.Tensor, mant: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Which codes are NaN under the format's ``nan`` policy (see FloatFormat)."""
    top, mant_ones = (1 << fmt.ebits) - 1, (1 << fmt.mbits) - 1
    if fmt.nan == "ieee":
        return (field == top) & ~((mant == 0) if fmt.inf else torch.zeros_like(mant, dtype=torch.bool))
    if fmt.nan == "ocp":
        return (field == top) & (mant == mant_ones)
    if fmt.nan == "fnuz":
        return code == fmt.sign_mask
    return torch.zeros_like(code, dtype=torch.bool)


@functools.cache
def _decode_table(fmt: FloatFormat) -> torch.Tensor:
    # Every code at once from its sign, exponent and mantissa fields; ldexp of an integer
    # significand of <= 11 bits is exact in float64, so no value is rounded.
    code = torch.arange(1 << fmt.bits, dtype=torch.int64)
    mag = code & fmt.magnitude_mask
    field, mant = mag >> fmt.mbits, mag & ((1 << fmt.mbits) - 1)
    subnormal = (field == 0) & fmt.subnormals  # field 0 has no implicit leading one
    sig = torch.where(subnormal, mant, mant | (1 << fmt.mbits))
    unit = torch.where(subnormal, fmt.emin, field - fmt.bias) - fmt.mbits
    value = torch.ldexp(sig.to(torch.float64), unit.to(torch.float64))
    if fmt.inf:
        value = torch.where(mag == fmt.inf_code, math.inf, value)
    value = torch.where((code & fmt.sign_mask) != 0, -value, value)  # -0 stays a distinct code
    return torch.where(_nan_codes(code, field, mant, fmt), math.nan, value)


def decode_table(fmt: str | FloatFormat, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The value of every code of fmt, indexed by code, in dtype (float64 by default; float32
    and bf16 hold every element format's values exactly). Read-only: one copy per device and
    dtype is kept, because a host-to-device copy on every call waits for the GPU to drain,
    and a cast on every call is a kernel launch."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype={dtype!r}; expected a floating-point torch.dtype (float64, float32 or bfloat16 "
                        "hold every element format's values)")
    return _decode_table_on(get_format(fmt), torch.device(device), dtype)


@functools.cache
def _decode_table_on(fmt: FloatFormat, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return _decode_table(fmt).to(device=device, dtype=dtype)


def decode(codes: torch.Tensor, fmt: str | FloatFormat) -> torch.Tensor:
    """float32 values of codes (bits above the format's width must be zero)."""
    fmt = get_format(fmt)
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"codes must be a torch.Tensor, got {type(codes).__name__}")
    if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        raise TypeError(f"codes.dtype={codes.dtype}; expected an integer dtype such as torch.uint8")
    idx = codes.to(torch.int64)
    if idx.numel() and (bool((idx < 0).any()) or bool((idx >= (1 << fmt.bits)).any())):
        raise ValueError(
            f"codes hold values outside [0, {(1 << fmt.bits) - 1}] for fmt={fmt.name} "
            f"({fmt.bits}-bit codes; upper bits must be zero)"
        )
    return decode_table(fmt, codes.device, torch.float32)[idx]


def cast(x: torch.Tensor, fmt: str | FloatFormat, **kwargs) -> torch.Tensor:
    """decode(encode(x, fmt, **kwargs)) in float32: x rounded to fmt."""
    return decode(encode(x, fmt, **kwargs), fmt)
