"""Conventions: one profile field at another value, each a quantize behaviour.

A :class:`Convention` is one field of a profile kind (``mxcheck.profiles.Profile`` for MX,
``mxcheck.profile_kinds`` for NVFP4 and FP8) set to a value a released implementation uses:
the spec's own quantizer (``spec_profile``) with that one field changed (a float32 log2,
ties away, no signed zero, the 2^-126 clamp, ...). ``CONVENTIONS`` are the ones the fit moves
over (``mxcheck.diagnose.fit``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from mxcheck.diagnose.behaviour import Behaviour
from mxcheck.gemm import quantize_operand
from mxcheck.profiles import FP8Profile, NVFP4Profile, Profile, get_profile
from mxcheck.recipes import OperandSpec
from mxcheck.scaling.mx import MXTensor

__all__ = ["CONVENTIONS", "CONVENTION_OF", "Convention", "convention_behaviour", "spec_profile"]


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


def _has_zero_block(x: torch.Tensor, block: int) -> bool:
    """Some block of ``block`` elements along x's last axis is all zeros (True where the axis
    is not a whole number of blocks: the convention decides)."""
    if x.ndim == 0 or x.shape[-1] % block:
        return True
    return bool((x.unflatten(-1, (-1, block)) == 0).all(-1).any())


def _convention_run(c: Convention) -> Callable[..., Any]:
    def run(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
        if c.field == "zero_scale" and not _has_zero_block(x, spec.block_size):
            return None  # the zero-block byte changes nothing here
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
_CT = "compressed-tensors 0.20.1"

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
    *(Convention(Profile, "half_away_sum", where, f"element ties away as floor(|t| + 0.5) with the sum rounded to "
                 f"{dt} (t in quanta): t = nextbelow(0.5) rounds up, a below-tie double rounding", (2,), seen,
                 (("rounding", "half_away"),))
      for where, dt, seen in (("float32", "float32", f"{_MICROX} (elemwise_ops.py round='nearest')"),
                              ("input", "the input's dtype", "microxcaling on bf16 tensors"))),
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
           f"{_TE_REF}, ModelOpt _cast_fp4"),
          ("zero_negative", "the zero code's sign from x <= 0 (an exact zero of either sign gives -0)",
           "ModelOpt 0.47.0 torch/quantization/qtensor/mxfp4_tensor.py:46-52 (cast_fp4)"))),
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
    # compressed-tensors 0.20.1 (0.20.0 the same lines): its per-tensor factor and block scale,
    # each a choice a correct kernel may make
    Convention(NVFP4Profile, "encode_factor", "input_dtype", "NVFP4 per-tensor encode factor 2688 / max(amax, "
               "tiny) computed in the input's dtype, NaN and Inf replaced by 1, and the decode scale its float32 "
               "reciprocal", (), f"{_CT} quantization/utils/helpers.py:340-353 (generate_gparam)"),
    Convention(NVFP4Profile, "block_scale", "factor_times_input_quotient", "NVFP4 block scale S_enc * (vec_max / "
               "6), the quotient in the input's dtype (rounded to bf16 or float16 first)", (),
               f"{_CT} quantization/utils/helpers.py:82-104 (calculate_qparams)"),
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
    Convention(FP8Profile, "scale_arithmetic", "input_quotient", "FP8 dequantization scale amax / fp8_max in the "
               "input's dtype (a zero scale replaced by the dtype's eps) and the elements x / scale in that dtype", (),
               f"{_CT} quantization/utils/helpers.py:88,117-128 (calculate_qparams), "
               "lifecycle/forward_helpers.py:533-536 (_quantize)"),
    Convention(FP8Profile, "multiply_dtype", "input", "x * scale rounded to the input's dtype before the cast",
               (), "torchao 0.5 _ToFloat8ConstrFunc"),
    # ---- MX scales a fake quantizer holds as floats (wt-quark) ----
    Convention(Profile, "scale_storage", "input_dtype", "MX block scale 2^e held as a float in the input's dtype, "
               "never an E8M0 byte: e below -127 kept (a float32 block scaled by 2^-135), and a 2^e that "
               "underflows the dtype (bf16 below 2^-133, float16 below 2^-24) replaced by float32 eps 2^-23", (),
               "amd-quark 0.12.post1 and 0.13, floor mode: quark/torch/quantization/observer/observer.py:126-127"),
    Convention(FP8Profile, "descale", "quotient_input", "FP8 dequantization scale amax / fp8_max computed in the "
               "input's dtype and x divided by it in that dtype (not fp8_max / amax in float32): a value one ulp "
               "of the input's dtype off wherever amax / fp8_max is not exact; a NaN or Inf amax makes every "
               "value NaN", (16,), "amd-quark 0.12.post1 and 0.13 FP8E4M3PerTensorSpec: "
               "quark/torch/quantization/observer/observer.py:165-180, kernel/hw_emulation/"
               "hw_emulation_interface.py:715-722"),
    Convention(NVFP4Profile, "zero_scale_fill", 2.0**-23, "NVFP4 per-tensor scale and first-stage block scale "
               "(amax / 6) of 0 replaced by float32 eps 2^-23 (the block scale is then eps / ts), and a block whose "
               "quantized scale is 0 divided by eps (its values +-0, each its code's sign): an all-zero or "
               "underflowing tensor quantizes to zeros, not 0 / 0", (15,),
               "amd-quark 0.12.post1 and 0.13 nvfp4 scheme (ScaleQuantSpec of FP4PerGroupSpec and "
               "FP8E4M3PerTensorSpec): quark/torch/quantization/observer/observer.py:179-180, "
               "kernel/hw_emulation/hw_emulation_interface.py:1722-1723",
               (("block_scale", "quotient"),)),
)


def convention_behaviour(c: Convention) -> Behaviour:
    return Behaviour(c.key, c.title, "quantize", _convention_run(c), c.cases, c.seen_in)


CONVENTION_OF: dict[str, Convention] = {c.key: c for c in CONVENTIONS}
