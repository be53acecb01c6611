"""Failures no profile models: transforms of the oracle's tensor, each a quantize behaviour.

Each function takes ``(x, spec, oracle)`` and returns the tensor a kernel with the failure
makes on x (the oracle's type and fields), or None where it does not apply: fp4 nibble
order, element subnormals flushed, NaN or Inf zeroing a block, NaN spreading over the
tensor, a NaN or Inf amax with no special case in a tensorwise scale, NaN codes' signs.
``FAILURES`` lists them as behaviours; the fit applies them after the conventions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from mxcheck.diagnose.behaviour import Behaviour
from mxcheck.diagnose.scale_values import SCALE_VALUE_FAILURES
from mxcheck.formats import FloatFormat, encode_bits, get_format
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import OperandSpec
from mxcheck.scaling.fp8 import SCALE_FORMULAS, FP8Tensor, ScaleOptions
from mxcheck.scaling.mx import MXTensor
from mxcheck.scaling.nvfp4 import NVFP4Tensor
from mxcheck.scaling.rules import E8M0_NAN

__all__ = ["FAILURES", "NOT_BLOCK_BEHAVIOURS", "ZERO_BLOCK_BYTES", "element_format"]


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


def _special_zeroes_block_finite_amax(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # NVFP4 (a per-tensor amax): the tensor is quantized with its NaN and Inf read as 0 (the
    # per-tensor amax over the finite values), then each block holding one is written as zeros.
    if not isinstance(oracle, NVFP4Tensor) or spec.rounding == "sr" or not bool(_specials(x).any()):
        return None
    clean = quantize_operand(torch.where(_specials(x), 0, x).to(x.dtype), spec)
    if tuple(clean.codes.shape) != tuple(oracle.codes.shape):
        return None
    return _special_zeroes_block(x, spec, clean)


TORCHAO_FP8_EPS = 1e-12  # torchao float8_utils.py EPS: amax_to_scale clamps the amax to it


def _fp8_eps_floor(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # torchao float8 rowwise: scale = fp8_max / clamp(amax, min=1e-12), rounded down to a
    # power of two: an all-zero row gets scale 2^48 (e4m3), scale_inv 2^-48, where TE's rule
    # (the oracle's) gives an amax-0 row scale 1. Rows (or a tensor) only: blocks keep theirs.
    if not (isinstance(oracle, FP8Tensor) and oracle.granularity in ("row", "tensor") and spec.scale_formula == "te"
            and spec.rounding == "rne" and oracle.amax is not None and x.shape == oracle.codes.shape):
        return None
    amax = oracle.amax.to(torch.float32)
    floored = (amax < TORCHAO_FP8_EPS) & (amax >= 0)
    if not bool(floored.any()):
        return None
    fmt = oracle.fmt
    options = ScaleOptions(margin=spec.margin, power_of_2=spec.power_of_2, eps=TORCHAO_FP8_EPS)
    scale = torch.where(floored, SCALE_FORMULAS["te"](amax, fmt.max, options), oracle.scale.to(torch.float32))
    codes = encode_bits((x.to(torch.float32) * scale.reshape(-1, 1) if scale.numel() > 1 else x.to(torch.float32)
                         * scale.reshape(())).clamp(-fmt.max, fmt.max), fmt, "rne", True)
    rows = floored.reshape(-1, 1) if floored.numel() > 1 else floored.reshape(())
    return replace(oracle, codes=torch.where(rows, codes, oracle.codes), scale=scale,
                   scale_inv=torch.where(floored, torch.reciprocal(scale), oracle.scale_inv))


def _zero_block_byte(byte: int) -> Callable[..., Any]:
    # An all-zero MX block stores ``byte``: its codes are 0 under any scale, so only the byte
    # moves (cheap: 253 of these are tried, one per byte no convention names).
    def run(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
        if not (isinstance(oracle, MXTensor) and not oracle.block_2d and oracle.axis == x.ndim - 1
                and x.shape == oracle.codes.shape):
            return None
        zero = (x.unflatten(-1, (-1, oracle.block_size)) == 0).all(-1)
        if not bool(zero.any()):
            return None
        return replace(oracle, scales=torch.where(zero, torch.tensor(byte, dtype=torch.uint8), oracle.scales))
    return run


# Every byte an all-zero MX block may store that no convention names (a floor constant's byte,
# a sentinel); keys as the zero_scale convention's, so a profile reads them the same.
ZERO_BLOCK_BYTES: tuple[Behaviour, ...] = tuple(
    Behaviour(f"mx.zero_scale={b}", f"an all-zero block stores byte {b} (2^{b - 127})", "quantize",
              _zero_block_byte(b), (), "released MX libraries whose zero-block scale is a floor constant's")
    for b in range(1, 255) if b != 127)


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


def _byte_127_zero_codes(oracle: Any, found: tuple[str, torch.Tensor] | None) -> Any:
    """The blocks of ``found`` (scale field, block mask) with scale byte 127 and every code 0."""
    if found is None or not bool(found[1].any()):
        return None
    field, blocks = found
    per_element = blocks.repeat_interleave(oracle.codes.shape[-1] // blocks.shape[-1], dim=-1)
    scales = torch.where(blocks, torch.tensor(127, dtype=torch.uint8), getattr(oracle, field))
    return replace(oracle, codes=torch.where(per_element, 0, oracle.codes).to(torch.uint8), **{field: scales})


def _inf_block_byte_127(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # A block holding an Inf stores scale byte 127 (MX: 2^0; NVFP4 ue4m3: 0x7F, NaN) with every code 0.
    return _byte_127_zero_codes(oracle, _block_mask(oracle, torch.isinf(x)))


def _mx_overflow_scale_byte_127(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
    # compressed-tensors 0.20 (mxfp_utils.py::generate_mx_scales, compressors/mx_utils.py):
    # the block amax rounded up to a power of two in x's dtype overflows to Inf (an Inf amax, or
    # one the rule rounds past the dtype's largest binade), so the scale is Inf, x / Inf is 0,
    # and the exported byte 127 + int32(floor(log2 Inf)) = 127 + INT_MIN wraps to 0x7F.
    if not isinstance(oracle, MXTensor) or oracle.block_2d or not x.dtype.is_floating_point:
        return None
    top = math.frexp(torch.finfo(x.dtype).max)[1]  # 2^top is Inf in x's dtype
    b = oracle.scales.to(torch.int32)
    overflow = (b != E8M0_NAN) & (b - 127 + oracle.fmt.emax >= top)
    return _byte_127_zero_codes(oracle, ("scales", overflow) if oracle.codes.shape == x.shape else None)


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
    Behaviour("special_zeroes_block_finite_amax", "a NaN or Inf zeroes its whole NVFP4 block, the per-tensor amax "
              "taken over the finite values", "quantize", _special_zeroes_block_finite_amax, (6,),
              "released NVFP4 weight quantizers (a NaN or Inf weight block written as zeros)"),
    Behaviour("fp8_eps_floor", f"FP8 amax clamped to at least {TORCHAO_FP8_EPS:g} before fp8_max / amax: an "
              "all-zero row gets scale fp8_max / 1e-12 (2^48 in e4m3 once rounded to a power of two), not 1",
              "quantize", _fp8_eps_floor, (16,), "torchao float8 rowwise (float8_utils.py::amax_to_scale, EPS)"),
    Behaviour("inf_block_byte_127", "a block holding an Inf stores scale byte 127 with every code 0", "quantize",
              _inf_block_byte_127, (), "a released NVFP4 library (measured, not named)"),
    Behaviour("nan_whole_tensor", "a NaN spreads over the whole tensor (every scale NaN)", "quantize",
              _nan_whole_tensor),
    Behaviour("mx_overflow_scale_byte_127", "an MX block whose power-of-two scale overflows the input's dtype (an "
              "Inf amax, or one rounded past the dtype's largest binade) stores byte 127 with every code 0 (x / Inf; "
              "the byte 127 + int32(floor(log2 Inf)) wraps)", "quantize", _mx_overflow_scale_byte_127, (),
              "compressed-tensors 0.20.1 quantization/utils/mxfp_utils.py:146-152, compressors/mx_utils.py:29-30"),
    # last: values-level (their result is no MXTensor, so no failure above may follow them)
    *SCALE_VALUE_FAILURES,
)
