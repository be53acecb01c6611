"""Quantizer behaviours that hold a scale (or a product) in too narrow a type, or treat a
small scale as missing: each a transform of the oracle's tensor on the same input.

They lose whole tensors at magnitudes the oracle keeps (gradient magnitudes, float16
tensors under 0.041), or differ quietly where a per-tensor scale is not a power of two:

- an absolute threshold on NVFP4's decoded block scale (``S if S >= 1e-5 else 1.0``):
  every block of a gradient-magnitude tensor is scaled by 1 and its codes round to 0;
- NVFP4's per-tensor encode factor 2688 / amax computed in the input's dtype (in float16
  it overflows for amax < 0.041; a non-finite factor falls back to 1), or held in bf16;
- NVFP4's float32 block scale rounded to bf16 before its ue4m3 cast (a double rounding);
- an MX block scale 2^e held in float16: below 2^-24 it flushes to 0, is replaced by 1,
  and the block stores byte 127 with its elements unscaled (codes 0 for tiny blocks);
- an FP8 tensorwise x * scale rounded to bf16 before the FP8 cast (two roundings).

Each is one named ``Behaviour`` in ``PRECISION_FAILURES``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from mxcheck.diagnose.behaviour import Behaviour
from mxcheck.formats import FORMATS, decode_table, encode_bits
from mxcheck.nan_blocks import nan_block_codes
from mxcheck.profile_kinds import ENCODE_FACTORS
from mxcheck.recipes import OperandSpec
from mxcheck.scaling.blocks import block_amax, per_row
from mxcheck.scaling.fp8 import FP8Tensor
from mxcheck.scaling.mx import MXTensor
from mxcheck.scaling.nvfp4 import (
    NVFP4_BLOCK,
    NVFP4Tensor,
    _encode_block_scales,
    _global_encode_scale,
    te_block_scale,
    te_encode_scale,
)
from mxcheck.scaling.rules import E8M0_NAN

__all__ = ["DECODED_SCALE_THRESHOLD", "FP16_MAX", "FP16_MIN_NORMAL", "FP16_SMALLEST_EXPONENT", "PRECISION_FAILURES",
           "fp8_product_in", "mx_divide_by_underflowed_pow2", "mx_scale_in_float16", "mx_subnormal_amax_float16",
           "mx_zero_block_nan_float16", "nvfp4_block_scale_in", "nvfp4_decoded_scale_threshold", "nvfp4_encode_factor",
           "nvfp4_encode_scale_in", "nvfp4_encode_scale_in_input_dtype"]

_E2M1 = FORMATS["e2m1"]
_E4M3_X_E2M1_MAX = 448.0 * 6.0
DECODED_SCALE_THRESHOLD = 1e-5  # the measured kernel's constant: S if S >= 1e-5 else 1.0
FP16_SMALLEST_EXPONENT = -24  # 2^-24, float16's smallest subnormal: 2^e below it flushes to 0


def _plain(spec: OperandSpec) -> bool:
    """Transforms recompute from x: no rotation, no SR (their bits are not the input's alone)."""
    return spec.hadamard is None and spec.rounding != "sr"


def _nvfp4(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> bool:
    return isinstance(oracle, NVFP4Tensor) and _plain(spec) and x.ndim == 2 and tuple(oracle.codes.shape) == tuple(
        x.shape)


def _nvfp4_from(x: torch.Tensor, oracle: NVFP4Tensor, s_enc: torch.Tensor,
                hold_block: torch.dtype | None = None) -> NVFP4Tensor:
    """NVFP4 of x as the oracle computes it (TE's arithmetic, 1D or 16x16 blocks) with the
    per-tensor encode factor ``s_enc`` and, with ``hold_block``, the float32 block scale
    rounded to that dtype before its ue4m3 cast. amax and tensor_scale stay the oracle's."""
    rows = NVFP4_BLOCK if oracle.block_2d else 1
    s_f32 = te_block_scale(per_row(block_amax(x, rows, NVFP4_BLOCK), rows), s_enc)
    if hold_block is not None:
        s_f32 = s_f32.to(hold_block).to(torch.float32)
    block_scales = _encode_block_scales(s_f32)
    s = decode_table("ue4m3", x.device, torch.float32)[block_scales.to(torch.int64)]
    enc = te_encode_scale(s, 1.0 / s_enc).unsqueeze(-1)
    scaled = torch.clamp(x.to(torch.float32).unflatten(-1, (-1, NVFP4_BLOCK)) * enc, -_E2M1.max, _E2M1.max)
    return replace(oracle, codes=encode_bits(scaled, _E2M1, "rne", True).flatten(-2), block_scales=block_scales)


def nvfp4_encode_scale_in_input_dtype(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    """S_enc = 2688 / amax evaluated in x's dtype; a non-finite or zero result becomes 1."""
    if not _nvfp4(x, spec, oracle) or (x.dtype == torch.float32 and bool(torch.isfinite(x).all()) and float(
            oracle.amax) >= _E4M3_X_E2M1_MAX / torch.finfo(torch.float32).max):
        return None  # float32 and in range: the oracle's own factor
    s = torch.tensor(_E4M3_X_E2M1_MAX, dtype=x.dtype) / oracle.amax.to(x.dtype)
    s_enc = torch.where(torch.isfinite(s) & (s != 0), s, torch.ones_like(s)).to(torch.float32)
    return _nvfp4_from(x, oracle, s_enc)


def nvfp4_encode_scale_in(dtype: torch.dtype) -> Callable[..., Any]:
    """The oracle's S_enc rounded to ``dtype`` (held in a tensor of that dtype)."""
    def run(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
        if not _nvfp4(x, spec, oracle):
            return None
        return _nvfp4_from(x, oracle, _global_encode_scale(oracle.amax).to(dtype).to(torch.float32))
    return run


def nvfp4_encode_factor(name: str, limit: float | None = None) -> Callable[..., Any]:
    """The oracle's arithmetic with the per-tensor encode factor and decode scale of
    ``profile_kinds.ENCODE_FACTORS[name]``; with ``limit``, a factor above it falls back to
    per-tensor scale 1 (factor and decode scale 1). 1D blocks and 16x16 tiles alike."""
    def run(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
        if not _nvfp4(x, spec, oracle):
            return None
        s_enc, ts = ENCODE_FACTORS[name](oracle.amax)
        amax = oracle.amax.to(torch.float32)
        if limit is not None and bool(torch.full_like(amax, _E4M3_X_E2M1_MAX) / amax > limit):  # 0 amax: Inf
            s_enc, ts = torch.ones_like(s_enc), torch.ones_like(ts)
        return replace(_nvfp4_from(x, oracle, s_enc.to(torch.float32)), tensor_scale=ts.to(oracle.tensor_scale.dtype))
    return run


def nvfp4_block_scale_in(dtype: torch.dtype) -> Callable[..., Any]:
    """The float32 block scale rounded to ``dtype`` before its ue4m3 cast."""
    def run(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
        if not _nvfp4(x, spec, oracle):
            return None
        return _nvfp4_from(x, oracle, _global_encode_scale(oracle.amax), hold_block=dtype)
    return run


def nvfp4_decoded_scale_threshold(threshold: float) -> Callable[..., Any]:
    """Blocks whose decoded scale S = fp32(s) * tensor_scale is under ``threshold`` are
    scaled by 1 instead (their codes are x's own, clamped); the bytes stay the oracle's."""
    def run(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
        if not _nvfp4(x, spec, oracle):
            return None
        s = decode_table("ue4m3", x.device, torch.float32)[oracle.block_scales.to(torch.int64)]
        small = (s * oracle.tensor_scale < threshold).repeat_interleave(NVFP4_BLOCK, dim=-1)
        if not bool(small.any()):
            return None
        unscaled = encode_bits(torch.clamp(x.to(torch.float32), -_E2M1.max, _E2M1.max), _E2M1, "rne", True)
        return replace(oracle, codes=torch.where(small, unscaled, oracle.codes))
    return run


def mx_scale_in_float16(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    """MX blocks whose scale 2^e flushes to 0 in float16 (e < -24) get scale 1: byte 127,
    the elements encoded unscaled."""
    if not (isinstance(oracle, MXTensor) and _plain(spec) and oracle.axis == x.ndim - 1
            and tuple(oracle.codes.shape) == tuple(x.shape)):
        return None
    b = oracle.scales.to(torch.int32)
    flushed = (b - 127 < FP16_SMALLEST_EXPONENT) & (b != E8M0_NAN)
    if not bool(flushed.any()):
        return None
    per_element = flushed.repeat_interleave(oracle.block_size, dim=-1)[..., : x.shape[-1]]
    unscaled = encode_bits(x.to(torch.float32), oracle.fmt, spec.rounding, True)
    return replace(oracle, codes=torch.where(per_element, unscaled, oracle.codes),
                   scales=torch.where(flushed, torch.tensor(127, dtype=torch.uint8), oracle.scales))


FP16_MAX = 65504.0  # float16's largest finite value
FP16_MIN_NORMAL = 2.0**-14  # float16's smallest normal: an amax under it is a float16 subnormal


def _mx_float16(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> bool:
    """An MX oracle of a float16 input, blocks along x's last axis: where float16 scale
    arithmetic can differ from the oracle's float32."""
    return (x.dtype == torch.float16 and isinstance(oracle, MXTensor) and _plain(spec)
            and oracle.axis == x.ndim - 1 and tuple(oracle.codes.shape) == tuple(x.shape))


def _blocks(x: torch.Tensor, oracle: MXTensor) -> torch.Tensor:
    return x.to(torch.float32).unflatten(-1, (-1, oracle.block_size))


def mx_divide_by_underflowed_pow2(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    """x / 2**e evaluated in float16: where 2**e underflows to 0 (e < -24) the block's elements
    are x / 0 (Inf, or NaN for a zero), cast without saturation (e4m3: NaN codes)."""
    if not _mx_float16(x, spec, oracle) or oracle.fmt.nan_code is None:
        return None
    under = (oracle.scales.to(torch.int32) - 127 < FP16_SMALLEST_EXPONENT) & (oracle.scales != E8M0_NAN)
    if not bool(under.any()):
        return None
    quotient = (_blocks(x, oracle) / 0.0).flatten(-2)  # +-Inf, or NaN for a zero (0 / 0)
    per_element = under.repeat_interleave(oracle.block_size, dim=-1)
    codes = encode_bits(quotient, oracle.fmt, "rne", False)
    return replace(oracle, codes=torch.where(per_element, codes, oracle.codes))


def mx_zero_block_nan_float16(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    """An all-zero float16 block becomes a NaN block (byte 0xFF, the format's NaN codes): the
    block scale is max(amax, floor) with a float32 floor constant that is 0 in float16, so
    the elements are 0 / 0."""
    if not _mx_float16(x, spec, oracle):
        return None
    zero = (_blocks(x, oracle) == 0).all(-1)
    if not bool(zero.any()):
        return None
    codes = nan_block_codes(oracle.codes.unflatten(-1, (-1, oracle.block_size)), zero, oracle.fmt).flatten(-2)
    return replace(oracle, codes=codes, scales=torch.where(zero, torch.tensor(E8M0_NAN, dtype=torch.uint8),
                                                           oracle.scales))


def mx_subnormal_amax_float16(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    """A float16 block whose amax is a float16 subnormal (0 < amax < 2^-14) stores byte 127
    (2^0) with every code 0: its exponent field, 0, is read as a zero block's."""
    if not _mx_float16(x, spec, oracle):
        return None
    amax = _blocks(x, oracle).abs().amax(-1)
    sub = (amax > 0) & (amax < FP16_MIN_NORMAL)
    if not bool(sub.any()):
        return None
    per_element = sub.repeat_interleave(oracle.block_size, dim=-1)
    return replace(oracle, codes=torch.where(per_element, 0, oracle.codes).to(torch.uint8),
                   scales=torch.where(sub, torch.tensor(127, dtype=torch.uint8), oracle.scales))


def fp8_product_in(dtype: torch.dtype) -> Callable[..., Any]:
    """FP8 tensorwise: x * scale rounded to ``dtype`` before the (RNE, saturating) FP8 cast."""
    def run(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
        if not (isinstance(oracle, FP8Tensor) and oracle.granularity == "tensor" and spec.rounding == "rne"
                and oracle.scale.numel() == 1):
            return None
        scaled = x.to(torch.float32) * oracle.scale.reshape(())
        return replace(oracle, codes=encode_bits(scaled.to(dtype).to(torch.float32), oracle.fmt, "rne", True))
    return run

# Scales (or products) held in too narrow a type, and a small scale treated as missing:
# the bugs that lose whole tensors at magnitudes the oracle keeps.
PRECISION_FAILURES: tuple[Behaviour, ...] = (
    Behaviour("nvfp4_decoded_scale_threshold", f"NVFP4 decoded block scale under {DECODED_SCALE_THRESHOLD:g} replaced "
              "by 1 (an absolute threshold: a gradient-magnitude tensor's codes all round to 0)", "quantize",
              nvfp4_decoded_scale_threshold(DECODED_SCALE_THRESHOLD)),
    Behaviour("nvfp4_encode_scale_input_dtype", "NVFP4 per-tensor encode factor 2688 / amax computed in the "
              "input's dtype, falling back to 1 where it is not finite (float16: every amax under 0.041)",
              "quantize", nvfp4_encode_scale_in_input_dtype),
    Behaviour("nvfp4_encode_scale_bf16", "NVFP4 per-tensor encode factor 2688 / amax held in bf16", "quantize",
              nvfp4_encode_scale_in(torch.bfloat16)),
    Behaviour("nvfp4_encode_factor_reciprocal", "NVFP4 per-tensor encode factor 2688 * (1 / amax), one float32 ulp "
              "from 2688 / amax for some amax (element ties move)", "quantize", nvfp4_encode_factor("reciprocal"), (),
              "released NVFP4 kernels (measured, not named)"),
    Behaviour("nvfp4_encode_factor_uncapped", "NVFP4 per-tensor encode factor 2688 / amax with no FLT_MAX cap (Inf "
              "below amax 7.9e-36) and the decode scale 1 / S_enc (0 there): every value 0 or NaN", "quantize",
              nvfp4_encode_factor("uncapped"), (27,), "released NVFP4 kernels (measured, not named)"),
    Behaviour("nvfp4_fp16_fallback_scale_1", f"NVFP4 per-tensor scale falls back to 1 where 2688 / amax overflows "
              f"float16 (above {FP16_MAX:g}: amax under 0.041)", "quantize",
              nvfp4_encode_factor("te", FP16_MAX), (), "a released NVFP4 library (measured, not named)"),
    Behaviour("nvfp4_block_scale_bf16", "NVFP4 float32 block scales rounded to bf16 before the ue4m3 cast (two "
              "roundings)", "quantize", nvfp4_block_scale_in(torch.bfloat16)),
    Behaviour("mx_scale_float16", f"MX block scale held in float16: 2^e below 2^{FP16_SMALLEST_EXPONENT} flushes to 0 "
              "and is replaced by 1 (byte 127, the elements unscaled: codes 0 for tiny blocks)", "quantize",
              mx_scale_in_float16),
    Behaviour("mx_divide_by_underflowed_pow2_float16", f"MX x / 2**e in float16: 2**e below 2^{FP16_SMALLEST_EXPONENT} "
              "is 0, so the block's codes are x / 0 (NaN in e4m3)", "quantize", mx_divide_by_underflowed_pow2, (),
              "a released MX library on float16 tensors (measured, not named)"),
    Behaviour("mx_zero_block_nan_float16", "an all-zero float16 MX block becomes a NaN block (byte 0xFF): a float32 "
              "floor constant that is 0 in float16, then 0 / 0", "quantize", mx_zero_block_nan_float16, (),
              "a released MX library on float16 tensors (measured, not named)"),
    Behaviour("mx_subnormal_amax_float16", "a float16 MX block whose amax is a float16 subnormal stores byte 127 "
              "(2^0) with every code 0", "quantize", mx_subnormal_amax_float16, (),
              "a released MX library on float16 tensors (measured, not named)"),
    Behaviour("fp8_product_bf16", "FP8 x * scale rounded to bf16 before the FP8 cast (two roundings)", "quantize",
              fp8_product_in(torch.bfloat16)),
)
