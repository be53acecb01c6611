"""The MX profile kind: ``mx_quantize`` plus the quirks released MX quantizers have.

Three kinds share one vocabulary (``mxcheck.profile_base.ProfileBase``: element format,
rounding, rotation, zero sign, source) and one lookup (``get_profile``): MX
(:class:`Profile`, here), NVFP4 and FP8 tensorwise (``mxcheck.profile_kinds``); the named
implementations and the lookup are ``mxcheck.profiles``. An
``OperandSpec`` pinned to a profile (``profile=``) is quantized as that profile does.

An MX profile is ``mx_quantize`` (scale rule, rounding, zero-block byte, rotation) plus the
few places where a real implementation gives other bits. Each quirk is a field holding
data and one small function below that adjusts ``mx_quantize``'s scale bytes or re-encodes
the blocks whose decode scale changed; none repeats ``mx_quantize``'s own logic.

Quirk fields (defaults = OCP MX v1.0 as ``mx_quantize`` does it):

- ``exponent_source``: ``"bits"`` reads amax's float32 exponent field; ``"log2_fp32"``
  takes ``floor``/``ceil``/``rceil`` of a float32 ``torch.log2`` (one binade high at
  nextbelow(2^k)); ``"log2_input"`` the same in the input's own dtype (a bf16 ``log2``
  rounds to 8 bits: log2(255) is 8.0), as torchao 0.7-0.9's ``to_mx`` on a bf16 tensor.
- ``amax_floor``: ``log2`` of ``max(amax, amax_floor)`` (AITER's Triton packer: 1e-30).
- ``inf_amax_byte``: the scale byte of a block whose amax is Inf (None: the rule's arithmetic).
- ``nan_policy``: ``"block"`` NaN poisons the block (byte 255); ``"ignore"`` an ``fmaxf``
  amax skips NaN, the NaN element alone gets a NaN code (0 where the format has none);
  ``"zero_scale"`` a NaN amax fails ``amax > 0`` and the block takes ``zero_scale``.
- ``rceil_reciprocal``: the rceil descale is ``amax * fl32(1 / max)`` (TE) instead of a
  correctly rounded quotient. On every MX element format this changes no byte (pinned).
- ``subnormal_scale_clamp``: the float32 decode scale a byte-0 block is divided by instead
  of 2^-127 (torchao FLOOR: 2^-126; torchao RCEIL CPU: 1.0, which zeroes the block).
- ``exponent_range``: how the block exponent is *stored* (the codes are made with the
  clamped exponent either way): ``"clamp"`` (OCP MX: [-127, 127]), ``"wrap"`` (never
  clamped: the biased exponent kept modulo 256, so a tiny block lands on a huge byte),
  ``"unsigned"`` (a negative exponent converted to an unsigned byte saturates to 0, so
  every block below 2^0 stores byte 127: AITER's Triton ``dynamic_mxfp4_quant`` on an
  NVIDIA GPU, references/vectors/aiter_triton_mxfp4_h200.pt).
- ``scale_mbits``: the mantissa width the scale rule rounds the amax to (None: the element
  format's). Only the even rule reads it: ``1`` for 8-bit elements is e2m1's rule applied to
  e4m3 (a library whose even rule keeps its MXFP4 constant for every format).
- ``half_away_sum``: how ties away are computed (with ``rounding="half_away"``): ``"exact"``
  (mxcheck's), or ``floor(t + 0.5)`` on the element in quanta with the sum rounded to
  ``"float32"`` or to the ``"input"``'s dtype: t = nextbelow(0.5) rounds up (a below-tie
  double rounding; microxcaling's Python path, divergence case 2).
- ``scale_storage``: what decodes a block: ``"e8m0"`` its byte; ``"input_dtype"`` the float
  2^e held in the input's dtype, never stored as a byte (a fake quantizer): e is the rule's
  exponent before E8M0's clamp (a float32 block keeps 2^-135), and a 2^e that underflows
  the dtype (bf16 below 2^-133, float16 below 2^-24) is replaced by float32 eps, 2^-23
  (AMD Quark 0.12-0.13 floor mode, observer.py:126-127). The values come back as an
  :class:`MXFloatScaleTensor`; its bytes are the E8M0 clamp.
- ``zero_sign`` (shared, see ``profile_base``) and ``rounding`` (any of ``ROUNDINGS`` but SR,
  ``half_zero`` included).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from mxcheck.formats import FloatFormat, decode_table, encode_bits_float
from mxcheck.hadamard import apply_hadamard, get_hadamard
from mxcheck.nan_blocks import nan_block_codes
from mxcheck.profile_base import ProfileBase, apply_zero_sign
from mxcheck.scaling.blocks import block_amax
from mxcheck.scaling.mx import (
    MX_ELEMENT_FORMATS,
    MXTensor,
    e8m0_reciprocal,
    e8m0_value,
    mx_quantize,
)
from mxcheck.scaling.rules import E8M0_NAN, SCALE_RULES

__all__ = ["EXPONENT_RANGES", "EXPONENT_SOURCES", "HALF_AWAY_SUMS", "NAN_POLICIES", "SCALE_STORAGES",
           "MXFloatScaleTensor", "Profile"]

EXPONENT_SOURCES = ("bits", "log2_fp32", "log2_input")
EXPONENT_RANGES = ("clamp", "wrap", "unsigned")
HALF_AWAY_SUMS = ("exact", "float32", "input")
NAN_POLICIES = ("block", "ignore", "zero_scale")
SCALE_STORAGES = ("e8m0", "input_dtype")


@dataclass(frozen=True)
class Profile(ProfileBase):
    """An MX quantizer pinned to one implementation (1D blocks along the last axis).

    ``fmt=None`` makes a family (``ocp``, ``torchao.floor``): pass the element format
    to ``quantize``. ``hadamard`` rotates before scaling, as ``mx_quantize`` does.
    """

    block_size: int = 32
    scale_rule: str = "floor"
    zero_scale: int = 0
    exponent_source: str = "bits"
    amax_floor: float | None = None
    inf_amax_byte: int | None = None
    nan_policy: str = "block"
    rceil_reciprocal: bool = False
    subnormal_scale_clamp: float | None = None
    exponent_range: str = "clamp"
    scale_mbits: int | None = None
    half_away_sum: str = "exact"
    scale_storage: str = "e8m0"

    scaling: ClassVar[str] = "mx"
    formats: ClassVar[tuple[str, ...]] = MX_ELEMENT_FORMATS
    spec_fields: ClassVar[tuple[str, ...]] = ("scale_rule", "rounding", "zero_scale", "hadamard", "block_size")

    def _check(self) -> str:
        return _check_profile(self)

    def quantize(self, x: torch.Tensor, fmt: str | FloatFormat | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes, scales) as the implementation makes them: uint8 element codes shaped
        like x, and one biased E8M0 byte per block of the last axis."""
        f = self.element_format(fmt)
        xs = x if self.hadamard is None else apply_hadamard(x, get_hadamard(self.hadamard), axis=-1)
        nan = torch.isnan(xs)
        clean, amax = self._clean_amax(xs)
        q = mx_quantize(clean, f, block_size=self.block_size, scale_rule=self.scale_rule,
                        rounding=self.rounding, zero_scale=self.zero_scale)
        scales = q.scales
        for applies, quirk in _SCALE_QUIRKS:
            if applies(self):
                scales = quirk(self, amax, f, scales, nan)
        codes = _reencode(self, clean, f, q.codes, q.scales, scales)
        if self.subnormal_scale_clamp is not None:
            codes = _clamp_byte_zero_blocks(self, clean, f, codes, scales)
        if self.half_away_sum != "exact":
            codes = _floor_half_codes(self, clean, f, codes, scales)
        if self.scale_storage != "e8m0":
            codes = _float_scale_codes(self, clean, f, codes, scales, _float_scales(self, amax, f, xs.dtype))
        if self.nan_policy != "block":
            codes = _nan_element_codes(xs, f, codes, scales, self.block_size)
        codes = apply_zero_sign(self.zero_sign, clean, codes, f, _per_element(scales != E8M0_NAN, self.block_size))
        if self.exponent_range != "clamp":
            scales = _stored_bytes(self, amax, f, scales)
        return codes, scales

    def quantized(self, x: torch.Tensor, fmt: str | FloatFormat | None = None) -> MXTensor:
        """``quantize`` as the MXTensor ``mx_quantize`` would return (blocks along the last axis)."""
        f = self.element_format(fmt)
        codes, scales = self.quantize(x, f)
        fields = dict(codes=codes, scales=scales, fmt=f, block_size=self.block_size, axis=x.ndim - 1,
                      shape=tuple(x.shape), scale_rule=self.scale_rule, rounding=self.rounding,
                      hadamard=get_hadamard(self.hadamard), zero_scale=self.zero_scale)
        if self.scale_storage == "e8m0":
            return MXTensor(**fields)
        xs = x if self.hadamard is None else apply_hadamard(x, get_hadamard(self.hadamard), axis=-1)
        _, amax = self._clean_amax(xs)
        decode = torch.where(scales == E8M0_NAN, math.nan, _float_scales(self, amax, f, xs.dtype))  # NaN stays NaN
        return MXFloatScaleTensor(**fields, decode_scales=decode)

    def _clean_amax(self, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(xs with NaN read as 0 unless nan_policy is "block", its block amax: float32, or the
        input's dtype for a log2 in it)."""
        clean = xs if self.nan_policy == "block" else torch.where(torch.isnan(xs), 0.0, xs).to(xs.dtype)
        amax = block_amax(clean, 1, self.block_size)
        if self.exponent_source == "log2_input":
            amax = amax.to(clean.dtype)  # exact: amax is one of clean's elements
        return clean, amax


@dataclass(frozen=True)
class MXFloatScaleTensor(MXTensor):
    """An MX tensor whose blocks a float each decodes (``decode_scales``: float32, shaped like
    ``scales``) instead of their E8M0 byte: what a fake quantizer that holds 2^e in a float
    gives, values no E8M0 byte gives below 2^-127 (``Profile.scale_storage``). ``scales``
    holds the E8M0 clamp of the same exponents; a byte comparison reads those."""

    decode_scales: torch.Tensor | None = None

    def dequantize(self, *, padded: bool = False, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Values: element * decode scale in float32 (the fake quantizer's product), then dtype."""
        if self.decode_scales is None:
            return super().dequantize(padded=padded, dtype=dtype)
        codes = self.codes.movedim(self.axis, -1)
        table = decode_table(self.fmt, codes.device, torch.float32)
        blocks = table[codes.to(torch.int64)].unflatten(-1, (-1, self.block_size))
        out = (blocks * self.decode_scales.movedim(self.axis, -1).unsqueeze(-1)).flatten(-2)
        if not padded:
            out = out[..., : self.shape[self.axis]]
        return out.to(dtype).movedim(-1, self.axis)


def _check_profile(p: Profile) -> str:
    """What is wrong with an MX profile's own fields, or ""."""
    if p.scale_rule not in SCALE_RULES:
        return f"scale_rule={p.scale_rule!r}; expected one of {sorted(SCALE_RULES)}"
    if not 0 <= p.zero_scale <= 254:
        return f"zero_scale={p.zero_scale!r}; expected an E8M0 byte in [0, 254]"
    if p.exponent_source not in EXPONENT_SOURCES:
        return f"exponent_source={p.exponent_source!r}; expected one of {list(EXPONENT_SOURCES)}"
    if p.amax_floor is not None and (p.exponent_source == "bits" or not p.amax_floor > 0):
        return f"amax_floor={p.amax_floor!r} needs a log2 exponent_source and a value > 0"
    if p.inf_amax_byte is not None and not 0 <= p.inf_amax_byte <= 255:
        return f"inf_amax_byte={p.inf_amax_byte!r}; expected None or a byte in [0, 255]"
    if p.nan_policy not in NAN_POLICIES:
        return f"nan_policy={p.nan_policy!r}; expected one of {list(NAN_POLICIES)}"
    if p.rceil_reciprocal and (p.scale_rule != "rceil" or p.exponent_source != "bits"):
        return "rceil_reciprocal=True needs scale_rule='rceil' and exponent_source='bits'"
    if p.exponent_range not in EXPONENT_RANGES:
        return f"exponent_range={p.exponent_range!r}; expected one of {list(EXPONENT_RANGES)}"
    if p.scale_mbits is not None and (p.scale_rule != "even" or p.scale_mbits not in range(1, 8)):
        return (f"scale_mbits={p.scale_mbits!r} needs scale_rule='even' (the only rule that rounds the amax to a "
                "mantissa width) and a width in 1..7")
    if p.half_away_sum not in HALF_AWAY_SUMS or (p.half_away_sum != "exact" and p.rounding != "half_away"):
        return (f"half_away_sum={p.half_away_sum!r}; expected one of {list(HALF_AWAY_SUMS)}, and a value other than "
                "'exact' needs rounding='half_away' (it is how ties away are computed)")
    if p.scale_storage not in SCALE_STORAGES:
        return f"scale_storage={p.scale_storage!r}; expected one of {list(SCALE_STORAGES)}"
    if p.scale_storage != "e8m0" and (p.subnormal_scale_clamp is not None or p.half_away_sum != "exact"
                                      or p.exponent_range != "clamp"):
        return (f"scale_storage={p.scale_storage!r} decodes each block by its float scale: it takes no "
                "subnormal_scale_clamp, half_away_sum or exponent_range (they change how a byte decodes)")
    clamp = p.subnormal_scale_clamp
    if clamp is not None and not (clamp > 0 and math.frexp(clamp)[0] == 0.5):
        return f"subnormal_scale_clamp={clamp!r}; expected None or a positive power of two"
    return ""


# ---- scale quirks: (profile, block amax, fmt, scales, NaN mask) -> scales ------------


# log2 in amax's own dtype (float32, or the input's for log2_input); integers up to 2^8 are
# exact in bf16, so the result is widened only after floor/ceil.
def _log2_floor(amax: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    return torch.floor(torch.log2(amax)).float() - fmt.emax


def _log2_ceil(amax: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    # torchao 0.9.0 to_mx CEIL: ceil(log2(max_abs + eps)) - target_max_pow2 (mx_tensor.py @14cfbc74)
    return torch.ceil(torch.log2(amax)).float() - fmt.emax


def _log2_rceil(amax: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    # torchao 0.18 _to_mx_rceil CPU fallback: ceil(log2(max_abs / max_pos)), float32 throughout.
    return torch.ceil(torch.log2(amax / fmt.max)).float()


def _log2_even(amax: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    # The even rule's bump (amax rounded to the element's precision, on its float32 bits),
    # then floor of a log2 instead of the bumped exponent field.
    bump = 1 << (22 - fmt.mbits)
    bumped = (amax.to(torch.float32).view(torch.int32) + bump).view(torch.float32).to(amax.dtype)
    return torch.floor(torch.log2(bumped)).float() - fmt.emax


_LOG2_RULES: dict[str, Callable[[torch.Tensor, FloatFormat], torch.Tensor]] = {
    "floor": _log2_floor,
    "ceil": _log2_ceil,
    "even": _log2_even,
    "rceil": _log2_rceil,
}


@dataclass(frozen=True)
class _RuleWidth:
    """What a scale rule reads of the element format (emax, max), at another mantissa width."""

    emax: int
    max: float
    mbits: int


def _rule_format(p: Profile, fmt: FloatFormat) -> FloatFormat | _RuleWidth:
    return fmt if p.scale_mbits is None else _RuleWidth(fmt.emax, fmt.max, p.scale_mbits)


def _rule_exponent(p: Profile, amax: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """The unbiased block exponent before any clamp, from amax's bits or from a log2."""
    fmt = _rule_format(p, fmt)
    if p.exponent_source == "bits":
        return SCALE_RULES[p.scale_rule](amax.to(torch.float32), fmt)
    a = amax if p.amax_floor is None else torch.clamp(amax, min=p.amax_floor)
    return _LOG2_RULES[p.scale_rule](a, fmt)


def _log2_exponent(p: Profile, amax, fmt, scales, nan):
    # aiter gemm_op_a6w6.py _quant_pack_kernel / quant_mxfp6_torch, microxcaling
    # mx_ops.py::_shared_exponents, torchao _to_mx_rceil: a float32 log2, whose result
    # rounds to k for amax a few ulps below 2^k (aiter_mxfp6_scale_log2.md).
    e = _rule_exponent(p, amax, fmt).clamp(-127, 127) + 127
    e = torch.where(amax == 0, p.zero_scale, e)
    return torch.where(torch.isnan(amax), scales, e.to(torch.uint8))


def _rule_width(p: Profile, amax, fmt, scales, nan):
    # the rule at scale_mbits from the amax's bits (a log2 exponent_source reads it in _rule_exponent)
    e = _rule_exponent(p, amax.to(torch.float32), fmt).clamp(-127, 127) + 127
    e = torch.where(amax == 0, p.zero_scale, e)
    return torch.where(torch.isnan(amax), scales, e.to(torch.uint8))


def _reciprocal_rceil(p: Profile, amax, fmt, scales, nan):
    # TE quantize_mxfp8.cuh: float_to_e8m0(block_amax * max_norm_rcp), max_norm_rcp = fl32(1/max).
    # d * max is exact in float64 (24 x <= 4 significant bits), so the rceil rule sees d itself.
    descale = amax * torch.tensor(1.0 / fmt.max, dtype=torch.float32)
    e = SCALE_RULES["rceil"](descale.to(torch.float64) * fmt.max, fmt).clamp(-127, 127) + 127
    e = torch.where(amax == 0, p.zero_scale, e)
    return torch.where(torch.isnan(amax), scales, e.to(torch.uint8))


def _stored_bytes(p: Profile, amax: torch.Tensor, fmt: FloatFormat, scales: torch.Tensor) -> torch.Tensor:
    # After the codes: "wrap" stores the unclamped biased exponent in 8 bits; "unsigned" is
    # AITER fp4_utils.py::_dynamic_mxfp4_quant_kernel's scale_e8m0_unbiased.to(tl.uint8) + 127,
    # where an NVIDIA GPU saturates a negative float to 0 (the codes used 2^e all along).
    finite = torch.isfinite(amax) & (amax > 0)
    if p.exponent_range == "unsigned":
        return torch.where(finite & (scales < 127), 127, scales).to(torch.uint8)
    e = _rule_exponent(p, amax, fmt).clamp(-1024, 1024).to(torch.int32)
    wrapped = ((e + 127) & 0xFF).to(torch.uint8)
    return torch.where(finite & ((e < -127) | (e > 127)), wrapped, scales)


def _inf_amax(p: Profile, amax, fmt, scales, nan):
    # e.g. Primus-Turbo compute_tile_scale: (0x7F800000 + 0x200000) >> 23 & 0x1FF -> 126 -> 253;
    # AITER HIP exponent == 0xFF ? 127 -> 254; microxcaling log2(inf) > 127 -> NaN (255).
    return torch.where(torch.isinf(amax), p.inf_amax_byte, scales).to(torch.uint8)


def _nan_as_zero_block(p: Profile, amax, fmt, scales, nan):
    # AITER quant_mxfp6_torch: where(amax > 0, scale_exp, 0) and NaN > 0 is False.
    has_nan = nan.unflatten(-1, (-1, p.block_size)).any(-1)
    return torch.where(has_nan, p.zero_scale, scales).to(torch.uint8)


_SCALE_QUIRKS = (
    (lambda p: p.exponent_source != "bits", _log2_exponent),
    (lambda p: p.exponent_source == "bits" and p.scale_mbits is not None, _rule_width),
    (lambda p: p.rceil_reciprocal, _reciprocal_rceil),
    (lambda p: p.inf_amax_byte is not None, _inf_amax),
    (lambda p: p.nan_policy == "zero_scale", _nan_as_zero_block),
)


# ---- element quirks ---------------------------------------------------------------


def _encode(p: Profile, x: torch.Tensor, fmt: FloatFormat, multiplier: torch.Tensor) -> torch.Tensor:
    """Codes [..., blocks, block_size] of x * multiplier (one float32 per block), as
    mx_quantize encodes its elements."""
    return encode_bits_float(x.unflatten(-1, (-1, p.block_size)), fmt, p.rounding,
                             scale=multiplier.unsqueeze(-1), nan_codes=False)


def _per_element(mask: torch.Tensor, block_size: int) -> torch.Tensor:
    return mask.repeat_interleave(block_size, dim=-1)


def _reencode(p: Profile, x, fmt, codes, old_scales, scales) -> torch.Tensor:
    """Blocks whose byte a quirk changed get their elements again at the new scale; a NaN
    byte stores the format's NaN code (0 where there is none), as mx_quantize does."""
    changed = scales != old_scales
    if not bool(changed.any()):
        return codes
    new = nan_block_codes(_encode(p, x, fmt, e8m0_reciprocal(scales)), scales == E8M0_NAN, fmt)
    new = new.flatten(-2).to(torch.uint8)
    return torch.where(_per_element(changed, p.block_size), new, codes)


def _clamp_byte_zero_blocks(p: Profile, x, fmt, codes, scales) -> torch.Tensor:
    # torchao to_mx: scale_fp32 = clamp(2^(b - 127), min=F32_MIN_NORMAL), data / scale_fp32;
    # _to_mx_rceil: rcp = 1.0 where the byte is 0. Either way not 2^-127.
    zero = scales == 0
    if not bool(zero.any()):
        return codes
    multiplier = torch.full(scales.shape, 1.0 / p.subnormal_scale_clamp, dtype=torch.float32, device=scales.device)
    new = _encode(p, x, fmt, multiplier).flatten(-2)
    return torch.where(_per_element(zero, p.block_size), new, codes)


def _floor_half_codes(p: Profile, x, fmt, codes, scales) -> torch.Tensor:
    # microxcaling mx/elemwise_ops.py::_quantize_elemwise_core, round="nearest" @7bc4195: the
    # element in quanta t = |x / 2^e| / 2^(private_exp - mbits), then floor(t + 0.5) with the
    # sum rounded to float32 (or the input's dtype): t = nextbelow(0.5) sums to 1.0 and rounds
    # up, a below-tie double rounding (0.25 - 2^-26 in e2m1 becomes 0.5).
    sum_dtype = torch.float32 if p.half_away_sum == "float32" else x.dtype
    v = x.to(torch.float32).unflatten(-1, (-1, p.block_size)) * e8m0_reciprocal(scales).unsqueeze(-1)
    a = v.abs()
    private = torch.clamp(torch.frexp(a).exponent - 1, min=1 - fmt.bias)  # subnormals share the lowest binade
    quantum = torch.ldexp(torch.ones_like(a), (private - fmt.mbits).to(torch.float32))
    t = (a / quantum).to(sum_dtype)  # exact: a power-of-two scaling of a value of that dtype
    units = torch.floor(t + 0.5).to(torch.float32)
    value = torch.clamp(torch.copysign(units * quantum, v), -fmt.max, fmt.max)  # on the grid: encoded exactly
    new = encode_bits_float(value, fmt, "rne", nan_codes=False).flatten(-2)
    keep = ~torch.isfinite(v).flatten(-2) | _per_element(scales == E8M0_NAN, p.block_size)
    return torch.where(keep, codes, new)


def _float_scales(p: Profile, amax: torch.Tensor, fmt: FloatFormat, dtype: torch.dtype) -> torch.Tensor:
    """float32 per block: 2^e of the rule's unclamped exponent, evaluated in the input's
    ``dtype`` where it may underflow to 0, then 0 replaced by float32 eps.
    Quark observer.py:126-127 (amd-quark 0.13): scale = torch.pow(2, torch.floor(torch.log2(
    amax)) - emax); scale.masked_fill(scale == 0.0, eps). log2(0) = -inf gives 0 then eps too."""
    e = _rule_exponent(p, amax, fmt)
    s = torch.pow(2.0, e.to(dtype))  # e is an integer, exact in bf16; bf16 below 2^-133 and float16 below 2^-24 are 0
    return s.masked_fill(s == 0, torch.finfo(torch.float32).eps).to(torch.float32)


def _float_scale_codes(p: Profile, x, fmt, codes, scales, decode_scales) -> torch.Tensor:
    # Blocks whose float scale is not their byte's value get x / scale encoded (a division: the
    # reciprocal of 2^-135 overflows float32); a NaN byte's block keeps the format's NaN codes.
    moved = (decode_scales != e8m0_value(scales)) & (scales != E8M0_NAN)
    if not bool(moved.any()):
        return codes
    quotient = x.to(torch.float32).unflatten(-1, (-1, p.block_size)) / decode_scales.unsqueeze(-1)
    new = encode_bits_float(quotient, fmt, p.rounding).flatten(-2)
    return torch.where(_per_element(moved, p.block_size), new, codes)


def _nan_element_codes(x, fmt, codes, scales, block_size) -> torch.Tensor:
    # TE cvt.rn.satfinite: NaN -> 0x7F | sign (e4m3); formats without NaN get 0 (HW undefined).
    nan = torch.isnan(x) & ~_per_element(scales == E8M0_NAN, block_size)
    if not bool(nan.any()):
        return codes
    return torch.where(nan, encode_bits_float(x, fmt), codes)
