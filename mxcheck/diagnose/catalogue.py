"""Quantizer behaviours: what a kernel's quantization may do differently, each executable.

Every entry is a :class:`~mxcheck.diagnose.behaviour.Behaviour` of level "quantize": given
the input, the operand's spec and the oracle's tensor, it returns the tensor a kernel with
that behaviour makes (same type and fields as the oracle's), or None where it does not
apply. Three sources, all data:

- ``CONVENTIONS``: one profile field set to another value (``mxcheck.profiles`` for MX,
  ``mxcheck.profile_kinds`` for NVFP4 and FP8): the spec's own quantizer with one
  convention changed (a float32 log2, ties away, no signed zero, the 2^-126 clamp, ...).
- Every registered profile (``mxcheck.profiles.ALL_PROFILES``) of the spec's scaling.
- ``FAILURES``: transforms of the oracle's tensor that no profile models (fp4 nibble order,
  element subnormals flushed, NaN or Inf zeroing a block, NaN spreading over the tensor,
  a NaN or Inf amax with no special case in a tensorwise scale).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from mxcheck.diagnose.behaviour import Behaviour
from mxcheck.diagnose.precision import (
    DECODED_SCALE_THRESHOLD,
    FP16_SMALLEST_EXPONENT,
    fp8_product_in,
    mx_scale_in_float16,
    nvfp4_block_scale_in,
    nvfp4_decoded_scale_threshold,
    nvfp4_encode_scale_in,
    nvfp4_encode_scale_in_input_dtype,
)
from mxcheck.formats import FloatFormat, encode_bits, get_format
from mxcheck.gemm import quantize_operand
from mxcheck.profiles import ALL_PROFILES, FP8Profile, NVFP4Profile, Profile, get_profile
from mxcheck.recipes import OperandSpec
from mxcheck.scaling.fp8 import FP8Tensor
from mxcheck.scaling.mx import MXTensor
from mxcheck.scaling.nvfp4 import NVFP4Tensor
from mxcheck.scaling.rules import E8M0_NAN

__all__ = ["CONVENTIONS", "CONVENTION_OF", "FAILURES", "NOT_BLOCK_BEHAVIOURS", "PRECISION_FAILURES",
           "QUANTIZE_BEHAVIOURS", "Convention",
           "combined", "element_format", "spec_profile"]


# ---- the spec's own quantizer as a profile ------------------------------------------------


def spec_profile(spec: OperandSpec, x: torch.Tensor) -> Profile | NVFP4Profile | FP8Profile | None:
    """The profile that quantizes x exactly as the oracle does under ``spec`` (its pinned
    profile, or one built from its fields), or None where profiles cannot model the spec
    (2D blocks, padding that changes the shape, SR, FP8 other than tensorwise, delayed)."""
    if spec.block_2d or spec.rounding == "sr":
        return None
    if spec.pad_to is not None and x.shape[-1] % spec.pad_to:
        return None
    if spec.profile is not None:
        return get_profile(spec.profile)
    if spec.scaling == "mx":
        return Profile("oracle", block_size=spec.block_size, scale_rule=spec.scale_rule, rounding=spec.rounding,
                       zero_scale=spec.zero_scale, hadamard=spec.hadamard)
    if spec.scaling == "nvfp4":
        return NVFP4Profile("oracle", rounding=spec.rounding, hadamard=spec.hadamard)
    if spec.scaling == "tensor" and (spec.margin, spec.power_of_2) == (0, False):
        return FP8Profile("oracle", scale_formula=spec.scale_formula)
    return None


@dataclass(frozen=True)
class Convention:
    """One profile field at one value, with what a kernel that does it is doing."""

    kind: type
    field: str
    value: Any
    title: str
    cases: tuple[int, ...] = ()
    seen_in: str = ""
    also: tuple[tuple[str, Any], ...] = ()  # fields the value needs with it

    @property
    def key(self) -> str:
        return "+".join(f"{self.kind.scaling}.{f}={_show(v)}" for f, v in ((self.field, self.value), *self.also))


def _show(v: Any) -> str:
    if isinstance(v, float) and v > 0 and math.frexp(v)[0] == 0.5:
        return f"2^{math.frexp(v)[1] - 1}"
    return str(v)


# Profile fields that are OperandSpec fields mx_quantize takes with any layout (2D blocks, padding)
_SPEC_FIELDS = ("scale_rule", "rounding", "zero_scale", "hadamard")


def _oracle_takes(c: Convention, spec: OperandSpec) -> bool:
    return (c.kind is Profile and spec.scaling == "mx" and spec.profile is None and spec.rounding != "sr"
            and c.field in _SPEC_FIELDS and not c.also)


def _tiles_as_blocks(c: Convention, spec: OperandSpec, x: torch.Tensor, oracle: Any) -> MXTensor | None:
    """A convention on 2D MX tiles (bs x bs): each tile quantized as one 1D block of bs*bs
    elements (the tile's amax and scale are the block's), then put back in the oracle's
    layout (the tile's byte on each of its rows). Not with a rotation (it runs along K)."""
    bs = spec.block_size
    if not (isinstance(oracle, MXTensor) and spec.block_2d and spec.profile is None and spec.hadamard is None
            and spec.rounding != "sr" and x.ndim == 2 and x.shape[0] % bs == 0 and x.shape[1] % bs == 0
            and tuple(oracle.codes.shape) == tuple(x.shape)):
        return None
    base = Profile("oracle-tiles", block_size=bs * bs, scale_rule=spec.scale_rule, rounding=spec.rounding,
                   zero_scale=spec.zero_scale)
    if getattr(base, c.field) == c.value:
        return None
    try:
        variant = replace(base, **{c.field: c.value, **dict(c.also)})
    except ValueError:
        return None
    m, k = x.shape
    tiles = x.reshape(m // bs, bs, k // bs, bs).permute(0, 2, 1, 3).reshape(-1, bs * bs)
    codes, scales = variant.quantize(tiles, spec.fmt)
    codes = codes.reshape(m // bs, k // bs, bs, bs).permute(0, 2, 1, 3).reshape(m, k)
    return replace(oracle, codes=codes, scales=scales.reshape(m // bs, k // bs).repeat_interleave(bs, dim=0))


def _convention_run(c: Convention) -> Callable[..., Any]:
    def run(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
        base = spec_profile(spec, x)
        if base is None and c.kind is Profile and (tiled := _tiles_as_blocks(c, spec, x, oracle)) is not None:
            return tiled
        if base is None and _oracle_takes(c, spec):  # 2D blocks, padding: the oracle's own option
            if getattr(spec, c.field) == c.value:
                return None
            return quantize_operand(x, replace(spec, **{c.field: c.value}))
        if not isinstance(base, c.kind) or getattr(base, c.field) == c.value:
            return None
        try:
            variant = replace(base, name=c.key, **{c.field: c.value, **dict(c.also)})
        except ValueError:  # a combination the kind does not take (e.g. a log2 with no rule for it)
            return None
        return variant.quantized(x, spec.fmt)
    return run


_MICROX = "microxcaling mx/mx_ops.py @7bc4195"
_TORCHAO_MX = "torchao 0.18 mx_formats/mx_tensor.py::to_mx"
_AITER_TRITON = "AITER Triton packers (gemm_op_a6w6.py, fp4_utils.py)"
_TE_REF = "TE reference_nvfp4.py::cast_to_fp4x2 @1498424b"
_TORCHAO_NVFP4 = "torchao nvfp4_tensor.py::nvfp4_quantize"

CONVENTIONS: tuple[Convention, ...] = (
    # MX block exponents
    Convention(Profile, "exponent_source", "log2_fp32",
               "block exponent from a float32 log2 of the amax (one binade high at amax = nextbelow(2^k))",
               (3, 26), f"{_MICROX}, gfloat on float32, {_AITER_TRITON}, torchao RCEIL fallback"),
    Convention(Profile, "exponent_source", "log2_input",
               "block exponent from a log2 in the input's dtype (bf16: log2(255) rounds to 8.0)",
               (3,), "torchao 0.7-0.9 to_mx on bf16 tensors, microxcaling"),
    Convention(Profile, "scale_rule", "floor", "OCP floor scale rule: floor(log2 amax) - emax", (4,),
               "OCP MX v1.0, torchao FLOOR, microxcaling"),
    Convention(Profile, "scale_rule", "ceil", "ceil scale rule: ceil(log2 amax) - emax (a binade up unless "
               "amax is a power of two)", (), "torchao CEIL"),
    Convention(Profile, "scale_rule", "even", "even scale rule: amax rounded to the element's precision, "
               "then floored", (8,), "Primus-Turbo MXFP4, AITER MxScaleRoundMode.Even, torchao EVEN"),
    Convention(Profile, "scale_rule", "rceil", "rceil scale rule: ceil(log2(amax / max_elem))", (4,),
               "TE MXFP8, torchao RCEIL"),
    *(Convention(Profile, "scale_mbits", m, f"even scale rule at {m}-bit mantissa width (another element "
                 f"format's: {fmts}) for every element format", (), seen, (("scale_rule", "even"),))
      for m, fmts, seen in ((1, "e2m1", "a released library's MXFP8 (measured, not named)"),
                            (2, "e3m2, e5m2", ""), (3, "e2m3, e4m3", ""))),
    Convention(Profile, "amax_floor", 1e-30, "log2 of max(amax, 1e-30): a tiny block gets byte 25", (),
               "AITER quant_mxfp6_torch", (("exponent_source", "log2_fp32"),)),
    Convention(Profile, "exponent_range", "wrap",
               "block exponent stored unclamped to E8M0's range (the biased exponent kept modulo 256)", ()),
    Convention(Profile, "exponent_range", "unsigned",
               "a negative block exponent stored through an unsigned conversion that saturates to 0 (byte 127 "
               "for every block below 2^0; the codes use 2^e)", (29,),
               "AITER Triton dynamic_mxfp4_quant on NVIDIA (fp4_utils.py)"),
    Convention(Profile, "zero_scale", 0, "an all-zero block stores byte 0 (2^-127)", (), "OCP MX, torchao, TE"),
    Convention(Profile, "zero_scale", 127, "an all-zero block stores byte 127 (2^0)", (),
               "AITER MXFP6 (quant_mxfp6_gemm.cu)"),
    Convention(Profile, "inf_amax_byte", 254, "an Inf block saturates to byte 254 (0xFE, satfinite)", (5, 7),
               "TE MXFP8 cvt.rp.satfinite, AITER HIP"),
    Convention(Profile, "inf_amax_byte", 255, "an Inf block stores E8M0 NaN (0xFF)", (5, 7, 13), _MICROX),
    Convention(Profile, "inf_amax_byte", 253, "an Inf block stores byte 253", (5,),
               "Primus-Turbo compute_tile_scale"),
    Convention(Profile, "nan_policy", "ignore", "NaN ignored by the block amax (fmaxf): only the NaN element is "
               "NaN", (6, 9), "TE MXFP8, AITER HIP, Primus-Turbo"),
    Convention(Profile, "nan_policy", "zero_scale", "a NaN amax fails amax > 0: the block takes the zero-block "
               "byte", (6,), "AITER quant_mxfp6_torch"),
    Convention(Profile, "nan_policy", "block", "a NaN poisons its block (byte 0xFF)", (6,),
               "OCP MX, torchao, microxcaling"),
    Convention(Profile, "subnormal_scale_clamp", 2.0**-126,
               "byte-0 blocks divided by 2^-126 (float32's smallest normal), not 2^-127", (24,),
               f"{_TORCHAO_MX} (F32_MIN_NORMAL clamp)"),
    Convention(Profile, "subnormal_scale_clamp", 1.0, "byte-0 blocks left unscaled (their elements flush)", (25,),
               "torchao _to_mx_rceil CPU fallback"),
    Convention(Profile, "hadamard", None, "the Hadamard rotation is missing", ()),
    # element rounding (every kind)
    *(Convention(kind, "rounding", value, title, cases, seen)
      for kind in (Profile, NVFP4Profile, FP8Profile)
      for value, title, cases, seen in (
          ("half_away", "element ties rounded away from zero", (1,), f"{_MICROX}, {_AITER_TRITON}"),
          ("half_zero", "element ties rounded toward zero", (), ""),
          ("trunc", "element codes truncated toward zero", (), "a cvt with the rz suffix"),
          ("rne", "element ties rounded to nearest even", (1,), "torchao, TE, gfloat, ml_dtypes"))),
    *(Convention(kind, "zero_sign", value, title, (10,), seen)
      for kind in (Profile, NVFP4Profile, FP8Profile)
      for value, title, seen in (
          ("never", "-0 lost: every zero code is +0", "microxcaling"),
          ("negative_values", "the zero code's sign from x < 0 (-0.0 gives +0)",
           f"{_TE_REF}, ModelOpt _cast_fp4"))),
    *(Convention(NVFP4Profile, "block_scale_rounding", value, f"{title} in the elements and the ue4m3 block "
                 "scales (one rounding helper for both)", (), "", (("rounding", value),))
      for value, title in (("half_away", "ties rounded away from zero"), ("trunc", "truncation toward zero"),
                           ("half_zero", "ties rounded toward zero"))),
    Convention(NVFP4Profile, "block_scale_rounding", "half_away", "ue4m3 block-scale ties rounded away from zero"),
    # NVFP4 scale arithmetic
    Convention(NVFP4Profile, "block_scale", "quotient", "NVFP4 block scale (vec_max / 6) / ts: a different "
               "float32 operation order (scale-byte ties)", (23,), _TORCHAO_NVFP4),
    Convention(NVFP4Profile, "block_scale", "product", "NVFP4 block scale vec_max / (6 * ts)", (),
               "ModelOpt NVFP4QTensor"),
    Convention(NVFP4Profile, "element_scale", "divide_product", "NVFP4 elements x / (s * ts): a different "
               "float32 operation order (element ties)", (22,), "torchao 0.12-0.16, ModelOpt"),
    Convention(NVFP4Profile, "element_scale", "reciprocal_quotient", "NVFP4 elements x * ((1 / ts) / s): a "
               "different float32 operation order (element ties; Inf when the tensor amax is below 2688 / "
               "FLT_MAX)", (22, 27), "torchao 0.17+"),
    Convention(NVFP4Profile, "block_scale_min", 2.0**-6, "NVFP4 block scale floored at 2^-6 (no ue4m3 "
               "subnormal or zero scale)", (15,), _TORCHAO_NVFP4),
    Convention(NVFP4Profile, "block_scale_min", 2.0**-9, "NVFP4 block scale floored at 2^-9", (15,),
               "ModelOpt"),
    Convention(NVFP4Profile, "zero_block_scale", 1.0, "an NVFP4 zero block scale becomes 1.0", (15,), "ModelOpt"),
    Convention(NVFP4Profile, "underflow_block_scale", 0.125, "an NVFP4 block scale stored as 0 (a zero block, or "
               "one that underflows) becomes 0.125, e4m3's epsilon", (), "a released NVFP4 library (measured, not named)"),
    Convention(NVFP4Profile, "nonfinite_tensor_scale", 1.0, "a NaN or Inf NVFP4 tensor amax falls back to "
               "per-tensor scale 1", (), "a released NVFP4 library (measured, not named)"),
    *(Convention(NVFP4Profile, "scale_dtype", dt, f"NVFP4 scale arithmetic in {dt} (per-tensor and block scales "
                 f"rounded to {dt} before the ue4m3 cast)", ()) for dt in ("bfloat16", "float16")),
    # FP8 tensorwise scale arithmetic
    Convention(FP8Profile, "scale_formula", "te", "FP8 scale fp8_max / amax (TE: amax 0 or Inf gives scale 1)",
               (16,), "TransformerEngine"),
    Convention(FP8Profile, "scale_formula", "primus_turbo", "FP8 scale fp8_max / max(amax, 1e-12)", (16,),
               "Primus-Turbo, torchao"),
    Convention(FP8Profile, "scale_arithmetic", "input_reciprocal", "FP8 scale computed in the input's dtype "
               "(bf16 scale arithmetic)", (), "torchao 0.5 amax_to_scale", (("scale_formula", "primus_turbo"),)),
    *(Convention(FP8Profile, "scale_arithmetic", dt, f"FP8 scale rounded to {dt} (scale arithmetic in {dt})", ())
      for dt in ("bfloat16", "float16")),
    Convention(FP8Profile, "multiply_dtype", "input", "x * scale rounded to the input's dtype before the cast",
               (), "torchao 0.5 _ToFloat8ConstrFunc"),
)


# ---- registered profiles -------------------------------------------------------------------


def _profile_run(name: str) -> Callable[..., Any]:
    def run(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
        p = ALL_PROFILES[name]
        base = spec_profile(spec, x)
        if base is None or type(base) is not type(p) or spec.profile == name:
            return None
        if p.fmt not in (None, spec.fmt) or getattr(p, "block_size", spec.block_size) != spec.block_size:
            return None
        return p.quantized(x, spec.fmt)
    return run


def _profile_behaviour(name: str) -> Behaviour:
    p = ALL_PROFILES[name]
    return Behaviour(f"profile={name}", f"quantizes as profile {name}", "quantize", _profile_run(name),
                     seen_in=p.source.split(" @")[0] if p.source else "")


# ---- failures no profile models: transforms of the oracle's tensor ---------------------------


def _with_codes(q: Any, codes: torch.Tensor) -> Any:
    return replace(q, codes=codes)


def element_format(q: Any) -> FloatFormat:
    """The element format of a quantized tensor (NVFP4's is e2m1)."""
    return q.fmt if isinstance(q, (MXTensor, FP8Tensor)) else get_format("e2m1")


def _nibble_swap(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # Packed fp4 read with element 0 in the high nibble: adjacent codes trade places.
    if element_format(oracle).bits != 4 or oracle.codes.shape[-1] % 2:
        return None
    return _with_codes(oracle, oracle.codes.unflatten(-1, (-1, 2)).flip(-1).flatten(-2))


def _flush_element_subnormals(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    fmt = element_format(oracle)
    if not fmt.subnormals:
        return None
    c = oracle.codes.to(torch.int32)
    mant = c & ((1 << fmt.mbits) - 1)
    exp_field = (c & fmt.magnitude_mask) >> fmt.mbits
    sub = (exp_field == 0) & (mant != 0)
    if not bool(sub.any()):
        return None
    return _with_codes(oracle, torch.where(sub, c & ~fmt.magnitude_mask, c).to(torch.uint8))


def _daz(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # float32 (or bf16) subnormal inputs read as zero, sign kept (a kernel built with DAZ)
    tiny = (x != 0) & (x.abs() < torch.finfo(x.dtype).tiny)
    if not bool(tiny.any()) or spec.scaling == "delayed" or spec.rounding == "sr":
        return None
    return quantize_operand(torch.where(tiny, x * 0, x), spec)


def _specials(x: torch.Tensor) -> torch.Tensor:
    return ~torch.isfinite(x)


def _block_mask(q: Any, per_element: torch.Tensor) -> tuple[str, torch.Tensor] | None:
    """(scale field, its mask) of the blocks holding any True of per_element (MX, NVFP4)."""
    if isinstance(q, MXTensor) and not q.block_2d and q.codes.shape == per_element.shape:
        return "scales", per_element.unflatten(-1, (-1, q.block_size)).any(-1)
    if isinstance(q, NVFP4Tensor) and not q.block_2d and q.codes.shape == per_element.shape:
        return "block_scales", per_element.unflatten(-1, (-1, 16)).any(-1)
    return None


def _special_zeroes_block(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # A NaN or Inf fails a finiteness test and the whole block is written as zeros.
    found = _block_mask(oracle, _specials(x))
    if found is None or not bool(found[1].any()):
        return None
    field, blocks = found
    zero_byte = oracle.zero_scale if isinstance(oracle, MXTensor) else 0
    per_element = blocks.repeat_interleave(oracle.codes.shape[-1] // blocks.shape[-1], dim=-1)
    scales = torch.where(blocks, torch.tensor(zero_byte, dtype=torch.uint8), getattr(oracle, field))
    return replace(oracle, codes=torch.where(per_element, 0, oracle.codes).to(torch.uint8), **{field: scales})


def _signed_zero_block(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # As _special_zeroes_block, but each zero code keeps its element's sign (x < 0 -> -0):
    # a block failure that writes 0x8 in e2m1 where the catalogue's writes +0.
    q = _special_zeroes_block(x, spec, oracle)
    if q is None:
        return None
    fmt, found = element_format(oracle), _block_mask(oracle, _specials(x))
    blocks = found[1].repeat_interleave(oracle.codes.shape[-1] // found[1].shape[-1], dim=-1)
    sign = (x < 0).to(torch.uint8) << (fmt.bits - 1)
    return _with_codes(q, torch.where(blocks & (x.shape == q.codes.shape), sign, q.codes).to(torch.uint8))


def _inf_block_byte_127(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # A block holding an Inf stores scale byte 127 (MX: 2^0; NVFP4 ue4m3: 0x7F, NaN) with every code 0.
    found = _block_mask(oracle, torch.isinf(x))
    if found is None or not bool(found[1].any()):
        return None
    field, blocks = found
    per_element = blocks.repeat_interleave(oracle.codes.shape[-1] // blocks.shape[-1], dim=-1)
    scales = torch.where(blocks, torch.tensor(127, dtype=torch.uint8), getattr(oracle, field))
    return replace(oracle, codes=torch.where(per_element, 0, oracle.codes).to(torch.uint8), **{field: scales})


def _nan_codes(oracle: Any) -> tuple[FloatFormat, torch.Tensor] | None:
    """(element format, mask of the oracle's NaN codes), or None where the format has no NaN
    code with a sign (fnuz) or the oracle wrote none."""
    fmt = element_format(oracle)
    if fmt.nan_code is None or fmt.nan == "fnuz":
        return None
    nan = (oracle.codes & fmt.magnitude_mask) == fmt.nan_code
    return (fmt, nan) if bool(nan.any()) else None


def _canonical_nan_code(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # CUDA's float -> e4m3 conversion writes 0x7F for every NaN, whatever its sign.
    if (found := _nan_codes(oracle)) is None or not bool((found[1] & (oracle.codes != found[0].nan_code)).any()):
        return None
    fmt, nan = found
    return _with_codes(oracle, torch.where(nan, fmt.nan_code, oracle.codes).to(torch.uint8))


def _nan_whole_tensor(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # One NaN reaches a tensor-wide reduction and every scale (so every value) becomes NaN.
    if not bool(torch.isnan(x).any()):
        return None
    if isinstance(oracle, MXTensor):
        return replace(oracle, scales=torch.full_like(oracle.scales, E8M0_NAN))
    nan = torch.tensor(math.nan)
    if isinstance(oracle, NVFP4Tensor):
        return replace(oracle, amax=nan.expand_as(oracle.amax).clone(), tensor_scale=nan.expand_as(
            oracle.tensor_scale).clone(), block_scales=torch.full_like(oracle.block_scales, 0x7F))
    return None


def _no_special_case_amax(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # torchao float8_utils.py: amax by torch.max (NaN propagates) and fp8_max / amax with no
    # case for NaN or Inf: a NaN amax gives a NaN scale (every code NaN), an Inf amax scale 0.
    if not isinstance(oracle, FP8Tensor) or oracle.granularity not in ("tensor", "row") or bool(
            torch.isfinite(x).all()):
        return None
    fmt = oracle.fmt
    dims = (0, 1) if oracle.granularity == "tensor" else (1,)
    amax = x.to(torch.float32).abs().amax(dim=dims, keepdim=True)  # torch's amax propagates NaN
    scale = torch.tensor(fmt.max, dtype=torch.float32) / amax
    scale = torch.where(amax == 0, oracle.scale.reshape(scale.shape) if oracle.scale.numel() > 1
                        else oracle.scale, scale)
    codes = encode_bits((x.to(torch.float32) * scale).clamp(-fmt.max, fmt.max), fmt, "rne", True)
    shape = oracle.scale.shape
    return replace(oracle, codes=codes, scale=scale.reshape(shape), scale_inv=torch.reciprocal(scale).reshape(shape),
                   amax=amax.reshape(shape))


def _nan_code_sign(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # The NaN code with the other sign bit (0x7F against 0xFF in e4m3): a cast that drops or
    # sets a NaN's sign.
    if (found := _nan_codes(oracle)) is None:
        return None
    fmt, nan = found
    c = oracle.codes
    return _with_codes(oracle, torch.where(nan, c ^ (1 << (fmt.bits - 1)), c).to(torch.uint8))


def _nan_scale_sign(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # An NVFP4 NaN block scale stored as 0xFF, not ue4m3's 0x7F: a float32 NaN with its sign
    # set (x86's default NaN from 0 * Inf or Inf - Inf is negative) cast to a signed e4m3 byte.
    if not isinstance(oracle, NVFP4Tensor):
        return None
    nan = oracle.block_scales == _UE4M3_NAN
    if not bool(nan.any()):
        return None
    return replace(oracle, block_scales=torch.where(nan, _UE4M3_NAN | 0x80, oracle.block_scales).to(torch.uint8))


_UE4M3_NAN = 0x7F  # ue4m3's one NaN byte (decode_table("ue4m3")[0x7f])


def _inf_not_saturated(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # An Inf input element gives Inf (e5m2) or NaN (e4m3) instead of the saturated max code.
    fmt = element_format(oracle)
    inf = torch.isinf(x)
    if fmt.nan_code is None or spec.hadamard or oracle.codes.shape != x.shape or not bool(inf.any()):
        return None
    magnitude = (((1 << fmt.ebits) - 1) << fmt.mbits) if fmt.inf else fmt.nan_code
    sign = (x < 0).to(torch.uint8) << (fmt.bits - 1)
    return _with_codes(oracle, torch.where(inf, sign | magnitude, oracle.codes).to(torch.uint8))


# Divergence-table cases that are not something a kernel does to a block of its input, and why.
NOT_BLOCK_BEHAVIOURS: dict[int, str] = {
    2: "a float32 artefact of microxcaling's Python rounding just below a tie (floor(|x| + 0.5)); profile "
       "microxcaling does not model it",
    14: "casts of a float to the E8M0 dtype by torch, ml_dtypes and gfloat (witnesses), not a block scale rule",
    17: "FP8 power-of-2 scales (OperandSpec.power_of_2) are not modelled by the FP8 profile kind",
    18: "a delayed-scaling history rule across steps; check_quantize judges one fresh step",
    20: "fp6 packing: the quantize contract holds unpacked codes",
    21: "float64 inputs: check_quantize feeds float32, bf16 and fp16 tensors",
    28: "a delayed-scaling option (DelayedScaling(fused=)), across steps",
    30: "a linear's epilogue (the bias added after a bf16 rounding): within the same-operands SNR floor, so no "
        "check fails on it",
}


FAILURES: tuple[Behaviour, ...] = (
    # first: they quantize x afresh, so a fit applies the code transforms below after them
    Behaviour("fp8_amax_no_special_case", "FP8 scale fp8_max / amax with no case for a NaN or Inf amax "
              "(NaN: every code NaN; Inf: the row's finite values flush to zero)", "quantize",
              _no_special_case_amax, (16,), "torchao Float8 (float8_utils.py::amax_to_scale)"),
    Behaviour("nibble_order", "fp4 element pairs swapped (element 0 in the high nibble)", "quantize", _nibble_swap,
              (19,), "torchao before 2025-10 (pytorch/ao#2939)"),
    Behaviour("canonical_nan_code", "every NaN code is the positive NaN (CUDA writes 0x7F for an e4m3 NaN)",
              "quantize", _canonical_nan_code, (9,), "CUDA __nv_cvt_float_to_fp8 on the H200"),
    Behaviour("nan_code_sign", "NaN codes with the other sign bit", "quantize", _nan_code_sign, (9, 11)),
    Behaviour("nan_scale_sign", "an NVFP4 NaN block scale stored as 0xff (a signed e4m3 NaN, sign bit set), "
              "not ue4m3's 0x7f", "quantize", _nan_scale_sign),
    Behaviour("inf_not_saturated", "an Inf input element gives an Inf or NaN code instead of the saturated "
              "maximum", "quantize", _inf_not_saturated, (12,), "torch and ml_dtypes casts without satfinite"),
    Behaviour("ftz_elements", "element subnormals flushed to zero", "quantize", _flush_element_subnormals),
    Behaviour("daz_inputs", "subnormal inputs read as zero (DAZ)", "quantize", _daz),
    Behaviour("special_zeroes_block", "a NaN or Inf zeroes its whole block", "quantize", _special_zeroes_block,
              (6,), "AITER quant_mxfp6_torch (NaN)"),
    Behaviour("special_zeroes_block_signed", "a NaN or Inf zeroes its whole block, each zero with its "
              "element's sign (x < 0 gives -0)", "quantize", _signed_zero_block, (6,),
              "a released QAT library (measured, not named)"),
    Behaviour("inf_block_byte_127", "a block holding an Inf stores scale byte 127 with every code 0", "quantize",
              _inf_block_byte_127, (), "a released NVFP4 library (measured, not named)"),
    Behaviour("nan_whole_tensor", "a NaN spreads over the whole tensor (every scale NaN)", "quantize",
              _nan_whole_tensor),
)


# Scales (or products) held in too narrow a type, and a small scale treated as missing:
# the bugs that lose whole tensors at magnitudes the oracle keeps (mxcheck.diagnose.precision).
PRECISION_FAILURES: tuple[Behaviour, ...] = (
    Behaviour("nvfp4_decoded_scale_threshold", f"NVFP4 decoded block scale under {DECODED_SCALE_THRESHOLD:g} replaced "
              "by 1 (an absolute threshold: a gradient-magnitude tensor's codes all round to 0)", "quantize",
              nvfp4_decoded_scale_threshold(DECODED_SCALE_THRESHOLD)),
    Behaviour("nvfp4_encode_scale_input_dtype", "NVFP4 per-tensor encode factor 2688 / amax computed in the "
              "input's dtype, falling back to 1 where it is not finite (float16: every amax under 0.041)",
              "quantize", nvfp4_encode_scale_in_input_dtype),
    Behaviour("nvfp4_encode_scale_bf16", "NVFP4 per-tensor encode factor 2688 / amax held in bf16", "quantize",
              nvfp4_encode_scale_in(torch.bfloat16)),
    Behaviour("nvfp4_block_scale_bf16", "NVFP4 float32 block scales rounded to bf16 before the ue4m3 cast (two "
              "roundings)", "quantize", nvfp4_block_scale_in(torch.bfloat16)),
    Behaviour("mx_scale_float16", f"MX block scale held in float16: 2^e below 2^{FP16_SMALLEST_EXPONENT} flushes to 0 "
              "and is replaced by 1 (byte 127, the elements unscaled: codes 0 for tiny blocks)", "quantize",
              mx_scale_in_float16),
    Behaviour("fp8_product_bf16", "FP8 x * scale rounded to bf16 before the FP8 cast (two roundings)", "quantize",
              fp8_product_in(torch.bfloat16)),
)


def _convention_behaviour(c: Convention) -> Behaviour:
    return Behaviour(c.key, c.title, "quantize", _convention_run(c), c.cases, c.seen_in)


CONVENTION_OF: dict[str, Convention] = {c.key: c for c in CONVENTIONS}


def combined(*behaviours: Behaviour) -> Behaviour | None:
    """Several conventions at once (one kernel may do three: the even rule, -0 lost, an Inf
    byte), with failures (``FAILURES``) applied to their tensor after, in the order given;
    None where a behaviour is neither, the conventions are of two kinds, or they set one
    field to two values."""
    convs = [CONVENTION_OF.get(b.key) for b in behaviours]
    failures = [b for b, c in zip(behaviours, convs, strict=True) if c is None]
    convs = [c for c in convs if c is not None]
    if len(behaviours) < 2 or any(b not in FAILURES for b in failures) or len({c.kind for c in convs}) > 1:
        return None
    fields: dict[str, Any] = {}
    for c in convs:
        for f, v in ((c.field, c.value), *c.also):
            if fields.setdefault(f, v) != v:
                return None
    title = ", together with ".join(b.title for b in behaviours)
    cases = tuple(sorted({n for b in behaviours for n in b.cases}))
    seen = "; ".join(filter(None, (b.seen_in for b in behaviours)))
    key = " & ".join(b.key for b in behaviours)
    if convs:
        a = convs[0]
        first = _convention_run(Convention(a.kind, a.field, a.value, title, cases, seen,
                                           tuple((f, v) for f, v in fields.items() if f != a.field)))
    else:
        def first(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
            return oracle

    def run(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
        q = first(x, spec, oracle) if convs else oracle
        if q is None:
            return None
        for b in failures:
            moved = b.run(x, spec, q)
            q = q if moved is None else moved
        return q
    return Behaviour(key, title, "quantize", run, cases, seen)


QUANTIZE_BEHAVIOURS: tuple[Behaviour, ...] = (
    *(_convention_behaviour(c) for c in CONVENTIONS),
    *FAILURES,
    *PRECISION_FAILURES,
    *(_profile_behaviour(name) for name in ALL_PROFILES),
)
