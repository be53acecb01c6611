"""NVFP4 and FP8 tensorwise profiles: quantizers pinned to one implementation's bits.

As for MX (``mxcheck.profiles.Profile``), each convention is a field naming an entry of a
small table; the defaults are the oracle (``nvfp4_quantize``, ``fp8_quantize``), and a
profile whose fields are all defaults returns exactly the oracle's bits.

NVFP4 (1x16 blocks along the last dim; ``amax`` = global amax, ``ts = amax / 2688`` the
float32 per-tensor decode scale that ``NVFP4Tensor.tensor_scale`` holds):

- ``block_scale`` (float32 block scale before its ue4m3 cast): ``"te"`` vec_max *
  (S_enc * fl32(1/6)) (TransformerEngine); ``"quotient"`` (vec_max / 6) / ts (torchao
  ``nvfp4_quantize``); ``"product"`` vec_max / (6 * ts) (ModelOpt);
  ``"factor_times_input_quotient"`` S_enc * (vec_max / 6), the quotient in the input's dtype
  (compressed-tensors).
- ``block_scale_min``: the float32 block scale is clamped to at least this before the cast
  (torchao: E4M3_EPS = 2^-6, the smallest e4m3 normal; ModelOpt: 2^-9).
- ``zero_block_scale``: a block scale of exactly 0 becomes this (ModelOpt: 1.0).
- ``underflow_block_scale``: a block scale whose ue4m3 code is 0 (a zero block, or a scale
  that underflows) is stored as this value instead (0.125, e4m3's epsilon, in a released
  NVFP4 library).
- ``nonfinite_tensor_scale``: a NaN or Inf global amax gives this per-tensor scale (1.0)
  instead of a NaN or Inf one; blocks are then scaled against it.
- ``scale_dtype``: the per-tensor scale and the block scale before its ue4m3 cast are
  rounded to this dtype (``"bfloat16"``, ``"float16"``: scale arithmetic in that dtype).
- ``encode_factor`` (the per-tensor encode factor S_enc and the decode scale ts stored):
  ``"te"`` min(2688 / amax, FLT_MAX), ts = amax / 2688 (the oracle); ``"reciprocal"``
  2688 * fl32(1 / amax) (one ulp off for some amax: element ties move), ts the oracle's;
  ``"uncapped"`` 2688 / amax with no cap (Inf for amax < 7.9e-36) and ts = 1 / S_enc (0 there);
  ``"input_dtype"`` 2688 / max(amax, tiny) in the input's dtype, NaN and Inf replaced by 1, ts =
  1 / S_enc in float32 (compressed-tensors; an Inf amax gives S_enc 0, ts Inf).
- ``zero_scale_fill``: a per-tensor scale ts of 0 and a first-stage block scale vec_max / 6 of
  0 (an all-zero block, or one that underflows) become this value before the block scale is
  quantized, and the elements of a block whose quantized scale is 0 are divided by it (AMD Quark
  0.12-0.13: float32 eps, 2^-23, ``masked_fill(scale == 0, eps)``; the dequantization still
  multiplies by the 0, so such a block's values are +-0 with their codes' signs): an all-zero
  tensor quantizes to zeros with block scale 1.0, not to 0 / 0. Read by the quotient
  and product block scales (``block_scale`` other than ``"te"``, whose S_enc it leaves alone).
- ``encode_factor_limit``: where S_enc exceeds it (65504: the factor would overflow float16),
  the kernel falls back to per-tensor scale 1 (S_enc = ts = 1).
- ``block_scale_rounding``: how the float32 block scale rounds to ue4m3 (``"rne"``, as
  every known implementation; other values model a kernel whose one rounding helper
  serves the elements and the scales).
- ``element_scale`` (what the elements are scaled by, from the rounded block scale s):
  ``"te"`` x * min(1 / (s * (1 / S_enc)), FLT_MAX); ``"divide_product"`` x / (s * ts)
  (torchao 0.12-0.16, ModelOpt); ``"reciprocal_quotient"`` x * ((1 / ts) / s) (torchao 0.17+).

FP8 tensorwise:

- ``scale_formula``: as ``fp8_quantize`` (``"te"``, ``"primus_turbo"`` = fp8_max / max(amax, 1e-12)).
- ``scale_arithmetic``: ``"float32"`` the formula in float32; ``"input_reciprocal"``
  fp8_max / clamp(amax, 1e-12) as torch evaluates it on an amax in x's own dtype
  (``Tensor.__rtruediv__``: reciprocal, then times fp8_max, each rounded to that dtype; for a
  bf16 input the scale is a bf16). Needs ``scale_formula="primus_turbo"`` (the same formula).
  ``"bfloat16"``, ``"float16"``: the float32 scale rounded to that dtype (scale arithmetic in
  a 16-bit dtype). ``"input_quotient"``: the dequantization scale amax / fp8_max in x's dtype
  (a zero scale replaced by the dtype's eps) and the elements x / that scale in x's dtype
  (compressed-tensors; the formula is not used).
- ``multiply_dtype``: ``"float32"`` x * scale in float32; ``"input"`` rounded to x's dtype
  first (a 0-dim float32 scale does not promote a bf16 tensor), then cast.
- ``descale``: ``"reciprocal"`` the formula's scale multiplies x and ``scale_inv`` is its
  reciprocal (the oracle); ``"quotient_input"`` the dequantization scale itself, s = amax /
  fp8_max, is computed in x's dtype (0 becomes float32 eps, 2^-23), x / s is rounded to x's
  dtype before the cast, and ``scale_inv`` = s (AMD Quark 0.12-0.13 FP8 per tensor). It
  replaces the formula, so it takes the float32 defaults of the two fields above.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from mxcheck.formats import FORMATS, FloatFormat, check_quantize_input, decode_table, encode_bits
from mxcheck.hadamard import get_hadamard
from mxcheck.profile_base import ProfileBase, apply_zero_sign
from mxcheck.scaling.blocks import block_amax, check_tiles
from mxcheck.scaling.fp8 import (
    FP8_FORMATS,
    SCALE_FORMULAS,
    FP8Tensor,
    ScaleOptions,
    _amax,
    fp8_quantize,
)
from mxcheck.scaling.nvfp4 import (
    NVFP4_BLOCK,
    NVFP4Tensor,
    _encode_block_scales,
    _global_encode_scale,
    rotate_rows,
    te_block_scale,
    te_encode_scale,
)

__all__ = ["BLOCK_SCALES", "DESCALES", "ELEMENT_SCALES", "ENCODE_FACTORS", "FP8_PROFILES", "NVFP4_PROFILES", "SCALE_ARITHMETICS", "FP8Profile",
           "NVFP4Profile"]

_E2M1 = FORMATS["e2m1"]
_E4M3_X_E2M1_MAX = 448.0 * 6.0


# ---- NVFP4 tables: amax -> (S_enc, tensor_scale); (vec_max, S_enc, ts) -> float32 block
# scale; (x, s, S_enc, ts) -> scaled x

_FLT_MAX = torch.finfo(torch.float32).max


def _te_factor(amax, dtype=torch.float32):
    return _global_encode_scale(amax), amax / torch.full_like(amax, _E4M3_X_E2M1_MAX)  # a true division


def _reciprocal_factor(amax, dtype=torch.float32):
    # 2688 * fl32(1 / amax): one ulp from 2688 / amax for some amax, which moves element ties
    a = amax.to(torch.float32)  # float32 arithmetic whatever the input's dtype, as the oracle's
    s_enc = torch.minimum(torch.full_like(a, _E4M3_X_E2M1_MAX) * torch.reciprocal(a), torch.full_like(a, _FLT_MAX))
    s_enc = torch.where((a == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)
    return s_enc, amax / torch.full_like(amax, _E4M3_X_E2M1_MAX)


def _uncapped_factor(amax, dtype=torch.float32):
    # S_enc = 2688 / amax with no FLT_MAX cap (Inf for amax < 2688 / FLT_MAX = 7.9e-36) and the
    # decode scale its reciprocal (0 there): every value is then 0, or NaN in a zero block.
    a = amax.to(torch.float32)
    s_enc = torch.full_like(a, _E4M3_X_E2M1_MAX) / a
    s_enc = torch.where((a == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)
    return s_enc, torch.reciprocal(s_enc)


def _input_dtype_factor(amax, dtype=torch.float32):
    # compressed-tensors 0.20 quantization/utils/helpers.py::generate_gparam: 2688 / max(amax,
    # finfo(dtype).tiny) in the input's dtype (torch evaluates float / tensor as the reciprocal
    # times 2688, each rounded to that dtype), NaN and +-Inf replaced by 1 (an Inf amax gives
    # 0, kept); it stores S_enc, so the decode scale is its float32 reciprocal (Inf for 0).
    a = amax.to(dtype)
    s_enc = torch.nan_to_num(_E4M3_X_E2M1_MAX / torch.clamp(a, min=torch.finfo(dtype).tiny), nan=1.0, posinf=1.0,
                             neginf=1.0).to(torch.float32)
    return s_enc, torch.reciprocal(s_enc)


# Each takes the tensor amax (float32) and the input's dtype (only "input_dtype" reads it).
ENCODE_FACTORS: dict[str, Callable] = {"te": _te_factor, "reciprocal": _reciprocal_factor,
                                       "uncapped": _uncapped_factor, "input_dtype": _input_dtype_factor}


def _te_block(vec_max, s_enc, ts, dtype=torch.float32):
    return te_block_scale(vec_max, s_enc)


def _quotient_block(vec_max, s_enc, ts, dtype=torch.float32):
    # torchao nvfp4_tensor.py::nvfp4_quantize: block_scale = max_abs / F4_E2M1_MAX, then / per_tensor_scale
    return (vec_max / torch.full_like(vec_max, _E2M1.max)) / ts


def _product_block(vec_max, s_enc, ts, dtype=torch.float32):
    # ModelOpt get_weights_scaling_factor: per_block_amax / (6.0 * weights_scaling_factor_2)
    return vec_max / (_E2M1.max * ts)


def _factor_times_input_quotient(vec_max, s_enc, ts, dtype=torch.float32):
    # compressed-tensors 0.20 helpers.py::calculate_qparams: global_scale * (max_val_pos / 6),
    # the quotient in the input's dtype (a bf16 or float16 rounding before the product)
    return s_enc * (vec_max.to(dtype) / _E2M1.max).to(torch.float32)


# Each takes (block amax in float32, S_enc, ts, the input's dtype).
BLOCK_SCALES: dict[str, Callable] = {"te": _te_block, "quotient": _quotient_block, "product": _product_block,
                                     "factor_times_input_quotient": _factor_times_input_quotient}


def _te_elements(x, s, s_enc, ts):
    return x * te_encode_scale(s, 1.0 / s_enc).unsqueeze(-1)


def _divide_product(x, s, s_enc, ts):
    # torchao 0.12-0.16: data_hp / (per_tensor_scale * fp32(s)); ModelOpt: input / (s * sf2)
    return x / (s * ts).unsqueeze(-1)


def _reciprocal_quotient(x, s, s_enc, ts):
    # torchao 0.17+: data_hp * ((1.0 / per_tensor_scale) / fp32(s))
    return x * (torch.reciprocal(ts) / s).unsqueeze(-1)


ELEMENT_SCALES: dict[str, Callable] = {"te": _te_elements, "divide_product": _divide_product,
                                       "reciprocal_quotient": _reciprocal_quotient}


@dataclass(frozen=True)
class NVFP4Profile(ProfileBase):
    """An NVFP4 quantizer pinned to one implementation (1x16 blocks along the last dim)."""

    fmt: str | None = "e2m1"
    block_scale: str = "te"
    block_scale_min: float | None = None
    zero_block_scale: float | None = None
    element_scale: str = "te"
    block_scale_rounding: str = "rne"
    underflow_block_scale: float | None = None
    nonfinite_tensor_scale: float | None = None
    scale_dtype: str = "float32"
    encode_factor: str = "te"
    encode_factor_limit: float | None = None
    zero_scale_fill: float | None = None

    scaling: ClassVar[str] = "nvfp4"
    formats: ClassVar[tuple[str, ...]] = ("e2m1",)

    def _check(self) -> str:
        for name, table in (("block_scale", BLOCK_SCALES), ("element_scale", ELEMENT_SCALES),
                            ("encode_factor", ENCODE_FACTORS)):
            if getattr(self, name) not in table:
                return f"{name}={getattr(self, name)!r}; expected one of {list(table)}"
        if self.block_scale_rounding not in self.roundings:
            return f"block_scale_rounding={self.block_scale_rounding!r}; expected one of {sorted(self.roundings)}"
        if self.scale_dtype not in SCALE_DTYPES:
            return f"scale_dtype={self.scale_dtype!r}; expected one of {list(SCALE_DTYPES)}"
        if self.zero_scale_fill is not None and self.block_scale == "te":
            return ("zero_scale_fill fills ts and vec_max / 6, which the 'quotient' and 'product' block scales "
                    "read: it needs one of them, got block_scale='te'")
        for name in ("nonfinite_tensor_scale", "encode_factor_limit", "zero_scale_fill"):
            v = getattr(self, name)
            if v is not None and not (0 < v < math.inf):
                return f"{name}={v!r}; expected None or a positive finite float"
        for name in ("block_scale_min", "zero_block_scale", "underflow_block_scale"):
            v = getattr(self, name)
            if v is not None and not 0 < v <= 448:
                return f"{name}={v!r}; expected None or a float in (0, 448] (a ue4m3 block scale)"
        return ""

    def quantized(self, x: torch.Tensor, fmt: str | FloatFormat | None = None) -> NVFP4Tensor:
        """The NVFP4Tensor the implementation makes of x (last dim a multiple of 16)."""
        f = self.element_format(fmt)
        check_quantize_input(x, f"profile {self.name}")
        check_tiles(x.shape[-1] if x.ndim else 0, NVFP4_BLOCK, f"x dim -1 of shape {tuple(x.shape)}", pad_hint=False)
        rot = get_hadamard(self.hadamard)
        work = x if rot is None else rotate_rows(x, rot)
        amax = block_amax(work.reshape(1, -1), 1, work.numel()).reshape(())
        if self.nonfinite_tensor_scale is not None and not bool(torch.isfinite(amax)):
            amax = torch.full_like(amax, _E4M3_X_E2M1_MAX * self.nonfinite_tensor_scale)  # ts exactly the constant
        s_enc, ts = ENCODE_FACTORS[self.encode_factor](amax, work.dtype)
        if self.encode_factor_limit is not None and bool(s_enc > self.encode_factor_limit):
            s_enc, ts = torch.ones_like(s_enc), torch.ones_like(ts)  # the per-tensor fallback: scale 1
        dt = SCALE_DTYPES[self.scale_dtype]
        vec_max = block_amax(work, 1, NVFP4_BLOCK)
        if self.zero_scale_fill is not None:  # Quark observer.py:179-180: scale.masked_fill(scale == 0.0, eps)
            filled = ts == 0
            ts = torch.where(filled, self.zero_scale_fill, ts)
            amax = torch.where(filled, self.zero_scale_fill * _E4M3_X_E2M1_MAX, amax)  # what dequantize reads: ts's amax
            vec_max = torch.where(vec_max / _E2M1.max == 0, _E2M1.max * self.zero_scale_fill, vec_max)
        ts = ts.to(dt).to(torch.float32)
        s_f32 = BLOCK_SCALES[self.block_scale](vec_max, s_enc, ts, work.dtype).to(dt).to(torch.float32)
        if self.zero_block_scale is not None:
            s_f32 = torch.where(s_f32 == 0, self.zero_block_scale, s_f32)
        if self.block_scale_min is not None:
            s_f32 = torch.clamp(s_f32, min=self.block_scale_min)
        block_scales = _encode_block_scales(s_f32, self.block_scale_rounding)
        if self.underflow_block_scale is not None:
            eps = _encode_block_scales(torch.tensor(self.underflow_block_scale), self.block_scale_rounding)
            block_scales = torch.where(block_scales == 0, eps.to(block_scales.dtype), block_scales)
        s = decode_table("ue4m3", x.device, torch.float32)[block_scales.to(torch.int64)]
        blocks = work.to(torch.float32).unflatten(-1, (-1, NVFP4_BLOCK))
        scaled = ELEMENT_SCALES[self.element_scale](blocks, s, s_enc, ts)
        if self.zero_scale_fill is not None:  # Quark hw_emulation_interface.py:1722-1723: a block scale of 0
            # divides as the fill; its dequantization multiplies by the 0 (values +-0, their codes' signs)
            scaled = torch.where((s * ts == 0).unsqueeze(-1), blocks / self.zero_scale_fill, scaled)
        scaled = scaled.flatten(-2)
        codes = encode_bits(torch.clamp(scaled, -f.max, f.max), f, self.rounding, True)
        # the sign of what was encoded: x / Inf is -0 for a negative x, and both released
        # libraries that keep -0 codes read the sign of the scaled value (ModelOpt _cast_fp4's
        # weight < 0, compressed-tensors cast_to_fp4's sign(x))
        codes = apply_zero_sign(self.zero_sign, scaled, codes, f)
        return NVFP4Tensor(codes=codes, block_scales=block_scales, tensor_scale=ts, amax=amax, hadamard=rot)


# ---- FP8 tensorwise --------------------------------------------------------------------

_TORCHAO_EPS = 1e-12


def _input_reciprocal(amax: torch.Tensor, dtype: torch.dtype, fp8_max: float) -> torch.Tensor:
    # torchao <= 0.5 float8_utils.py::amax_to_scale: finfo.max / torch.clamp(amax, min=EPS), amax
    # in x's dtype; torch evaluates scalar / tensor as tensor.reciprocal() * scalar in that dtype.
    return (torch.reciprocal(torch.clamp(amax.to(dtype), min=_TORCHAO_EPS)) * fp8_max).to(torch.float32)


def _amax_quotient(x: torch.Tensor, amax: torch.Tensor, fp8_max: float,
                   zero_fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, x / s), both in x's dtype: the dequantization scale s = amax / fp8_max computed in x's
    dtype, a zero s replaced by ``zero_fill`` (an all-zero tensor), and x divided by it there.
    compressed-tensors and AMD Quark quantize FP8 per tensor so; they differ in the fill."""
    s = amax.to(x.dtype) / torch.tensor(fp8_max, dtype=x.dtype)
    s = torch.where(s == 0, torch.tensor(zero_fill, dtype=x.dtype), s)
    return s, x / s


def _input_quotient(x: torch.Tensor, amax: torch.Tensor, fp8_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    # compressed-tensors 0.20 quantization/utils/helpers.py::calculate_qparams: scale = amax /
    # (range / 2) in x's dtype, a zero scale replaced by finfo(dtype).eps; then
    # lifecycle/forward_helpers.py::_quantize divides x by it and adds the zero point 0 (so -0
    # becomes +0), in x's dtype. (scale_inv, the values cast)
    scale_inv, quotient = _amax_quotient(x, amax, fp8_max, torch.finfo(x.dtype).eps)
    return scale_inv.to(torch.float32), (quotient + torch.zeros((), dtype=x.dtype)).to(torch.float32)


SCALE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SCALE_ARITHMETICS = ("float32", "input_reciprocal", "bfloat16", "float16", "input_quotient")
MULTIPLY_DTYPES = ("float32", "input")
DESCALES = ("reciprocal", "quotient_input")


@dataclass(frozen=True)
class FP8Profile(ProfileBase):
    """A tensorwise FP8 quantizer pinned to one implementation (saturating; ``rounding``
    other than RNE models a kernel's cast with another rounding mode)."""

    scale_formula: str = "te"
    scale_arithmetic: str = "float32"
    multiply_dtype: str = "float32"
    descale: str = "reciprocal"

    scaling: ClassVar[str] = "tensor"
    formats: ClassVar[tuple[str, ...]] = FP8_FORMATS
    spec_fields: ClassVar[tuple[str, ...]] = ("rounding", "hadamard", "scale_formula")
    spec_defaults: ClassVar[dict[str, object]] = {"margin": 0, "power_of_2": False}

    def _check(self) -> str:
        if self.scale_formula not in SCALE_FORMULAS:
            return f"scale_formula={self.scale_formula!r}; expected one of {sorted(SCALE_FORMULAS)}"
        for name, allowed in (("scale_arithmetic", SCALE_ARITHMETICS), ("multiply_dtype", MULTIPLY_DTYPES)):
            if getattr(self, name) not in allowed:
                return f"{name}={getattr(self, name)!r}; expected one of {list(allowed)}"
        if self.scale_arithmetic == "input_reciprocal" and self.scale_formula != "primus_turbo":
            return ("scale_arithmetic='input_reciprocal' evaluates fp8_max / max(amax, 1e-12): it needs "
                    f"scale_formula='primus_turbo', got {self.scale_formula!r}")
        if self.hadamard is not None:
            return f"hadamard={self.hadamard!r}; FP8 tensorwise profiles take no rotation (None)"
        if self.descale not in DESCALES:
            return f"descale={self.descale!r}; expected one of {list(DESCALES)}"
        if self.descale != "reciprocal" and (self.scale_arithmetic, self.multiply_dtype) != ("float32", "float32"):
            return (f"descale={self.descale!r} computes the scale and x / scale in x's dtype itself: it takes "
                    "scale_arithmetic='float32' and multiply_dtype='float32'")
        return ""

    def quantized(self, x: torch.Tensor, fmt: str | FloatFormat | None = None) -> FP8Tensor:
        """The FP8Tensor (granularity "tensor") the implementation makes of x."""
        f = self.element_format(fmt)
        if self.descale == "quotient_input":
            check_quantize_input(x, f"profile {self.name}")
            q = _quotient_in_input_dtype(x, f, self.rounding)
        elif (self.scale_arithmetic, self.multiply_dtype, self.rounding) == ("float32", "float32", "rne"):
            q = fp8_quantize(x, f, scale_formula=self.scale_formula)
            scaled = x.to(torch.float32) * q.scale
        else:
            check_quantize_input(x, f"profile {self.name}")
            amax = _amax(x, "tensor")
            if self.scale_arithmetic == "input_quotient":
                scale_inv, scaled = _input_quotient(x, amax, f.max)
                scale = torch.reciprocal(scale_inv)
            else:
                if self.scale_arithmetic in SCALE_DTYPES:
                    scale = SCALE_FORMULAS[self.scale_formula](amax, f.max, ScaleOptions())
                    scale = scale.to(SCALE_DTYPES[self.scale_arithmetic]).to(torch.float32)
                else:
                    scale = _input_reciprocal(amax, x.dtype, f.max)
                scale_inv, scaled = torch.reciprocal(scale), x.to(torch.float32) * scale
            if self.multiply_dtype == "input":
                scaled = scaled.to(x.dtype)
            q = FP8Tensor(codes=encode_bits(scaled, f, self.rounding, True), scale_inv=scale_inv, fmt=f,
                          granularity="tensor", scale=scale, amax=amax)
        if self.zero_sign == "source":
            return q
        # the sign of what was encoded (x / Inf is -0 for a negative x, and +0 once a library adds
        # its zero point), as the NVFP4 profile reads it
        return FP8Tensor(codes=apply_zero_sign(self.zero_sign, scaled, q.codes, f), scale_inv=q.scale_inv, fmt=f,
                         granularity="tensor", scale=q.scale, amax=q.amax)


def _quotient_in_input_dtype(x: torch.Tensor, f: FloatFormat, rounding: str) -> FP8Tensor:
    # amd-quark 0.13 observer.py:165-180 get_scale("float32"): scale = amax / quant_max in the
    # amax's dtype (x's), masked_fill(scale == 0, eps); hw_emulation_interface.py:715-722: x / scale
    # in x's dtype, clamp, cast, times scale. torch's amax propagates NaN: a NaN or Inf amax gives
    # a NaN or Inf scale, every value NaN (0 * Inf, or x / NaN).
    amax = x.abs().amax()
    s, quotient = _amax_quotient(x, amax, f.max, torch.finfo(torch.float32).eps)
    s32 = s.to(torch.float32)
    return FP8Tensor(codes=encode_bits(quotient.to(torch.float32), f, rounding, True), scale_inv=s32, fmt=f,
                     granularity="tensor", scale=torch.reciprocal(s32), amax=amax.to(torch.float32))


# ---- the profiles ----------------------------------------------------------------------

_TE_NVFP4 = ("NVIDIA/TransformerEngine transformer_engine/common/cast/nvfp4/core_nvfp4.cuh @0718c016 "
             "(as mxcheck.scaling.nvfp4)")
_TORCHAO_NVFP4 = "torchao/prototype/mx_formats/nvfp4_tensor.py::nvfp4_quantize (two-level: per_tensor_scale given)"
_TORCHAO_NVFP4_NOTES = (
    "per_tensor_scale = per_tensor_amax_to_scale(amax) = amax / 2688 (NVFP4Tensor.to_nvfp4); on CPU a true division",
    "block scale clamp(min=E4M3_EPS = 2^-6, max=448): no ue4m3 subnormal or zero block scale",
    "an all-zero tensor (per_tensor_scale 0): block scales NaN (0x7F); the element bits torchao's cast makes of "
    "NaN are not modelled (mxcheck writes 0)")

NVFP4_PROFILES: dict[str, NVFP4Profile] = {p.name: p for p in (
    NVFP4Profile("te.nvfp4", source=_TE_NVFP4,
                 notes=("nvfp4_quantize: the hardware cvt keeps a zero's sign",)),
    NVFP4Profile("te.nvfp4.reference", zero_sign="negative_values",
                 source="NVIDIA/TransformerEngine transformer_engine/pytorch/custom_recipes/reference_nvfp4.py"
                        "::cast_to_fp4x2 @1498424b",
                 notes=("threshold table: (x >= -0.25) & (x < -0.0) -> code 8, so -0.0 gives +0 and a negative "
                        "that rounds to zero gives -0",)),
    NVFP4Profile("torchao.nvfp4", block_scale="quotient", block_scale_min=2.0**-6, element_scale="reciprocal_quotient",
                 source=f"pytorch/ao v0.18.0 @5f2baf9d {_TORCHAO_NVFP4}",
                 notes=("data_hp * ((1.0 / per_tensor_scale) / fp32(s)), from 5c0c8148 (v0.17.0) on",
                        "amax < 2688 / FLT_MAX: per_tensor_scale is a subnormal whose reciprocal is Inf, so nonzero "
                        "elements saturate to +-6 and zeros become 0 * Inf = NaN (codes not modelled, as below)",
                        *_TORCHAO_NVFP4_NOTES)),
    NVFP4Profile("torchao0.16.nvfp4", block_scale="quotient", block_scale_min=2.0**-6,
                 element_scale="divide_product",
                 source=f"pytorch/ao v0.16.0 @3c1065ca {_TORCHAO_NVFP4} (v0.12.0-v0.16.0, from 7ca9f10d)",
                 notes=("data_hp / (per_tensor_scale * fp32(s)): one float32 product, then one division",
                        *_TORCHAO_NVFP4_NOTES)),
    NVFP4Profile("modelopt.nvfp4", block_scale="product", block_scale_min=2.0**-9, zero_block_scale=1.0,
                 element_scale="divide_product", zero_sign="negative_values",
                 source="NVIDIA/Model-Optimizer modelopt/torch/quantization/qtensor/nvfp4_tensor.py @211c6b34 "
                        "NVFP4QTensor.get_weights_scaling_factor, quantize, _cast_fp4",
                 notes=("per_block_amax / (6.0 * amax / 2688); a zero scale becomes 1.0, then clamp(min=2^-9), "
                        "then float8_e4m3fn", "input / (fp32(s) * weights_scaling_factor_2)",
                        "_cast_fp4: searchsorted over the midpoints, ties to even; sign bit = x < 0",
                        "TensorRT-Model-Optimizer @0ad6e5f0 had no 2^-9 clamp (a tiny block scale underflows to 0)")),
)}

FP8_PROFILES: dict[str, FP8Profile] = {p.name: p for p in (
    FP8Profile("torchao0.5.float8", scale_formula="primus_turbo", scale_arithmetic="input_reciprocal",
               multiply_dtype="input",
               source="pytorch/ao v0.5.0 @ae8384ba torchao/float8/float8_utils.py::tensor_to_amax, amax_to_scale; "
                      "float8_tensor.py::_ToFloat8ConstrFunc",
               notes=("amax = max(abs(x)) in x's dtype; scale = finfo.max / clamp(amax, min=1e-12) in that dtype "
                      "(bf16 for a bf16 input), then float32", "tensor * scale stays bf16 (a 0-dim float32 does "
                      "not promote), then to_fp8_saturated: clamp and an RNE cast",
                      "71be3159 (v0.6.0) moved the division to float64",
                      "not modelled: the float16 input's extra clamp of the scale to 65504")),
)}
