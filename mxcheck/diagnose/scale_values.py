"""MX block scales that are not powers of two: values-level behaviours.

An MX kernel that floors its block scale after the power-of-two restriction, or divides it by
a constant, quantizes a block on a grid no E8M0 byte describes, so its result cannot be an
``MXTensor``. Such a behaviour returns :class:`BlockScaledValues`: the element codes the
kernel wrote under its own scale, that scale per block, and ``dequantize()`` giving the values
(what the values judge compares: ``conformance.values_judge.values_agree``). On the codes path
it never matches (it has no ``scales`` field), so only a fake-quant kernel is named for it.

One path (``_scaled_by``) with the scale as a parameter:

- ``mx_scale_floor_after_pow2``: s = max(2^(e + emax), 1e-10) / 2^emax, the arithmetic (the
  floor constant, x / s, codes * s) in the input's dtype. Below 2^-33 the scale is
  1e-10 / 2^emax (no power of two: tiny blocks round to 0 or leave the MX grid); in float16
  the floor is 0 and a power that leaves float16's range gives a scale of 0 or Inf, and x / 0
  times 0 (or x / Inf times Inf) makes the block NaN. brevitas 0.13.3-0.13.4 does this
  (``core/scaling/runtime.py:237`` and ``core/restrict_val.py:56-59``: the clamp to
  ``scaling_min_val`` = 1e-10 of ``quant/float_base.py:24`` runs after ``PowerOfTwo``).
- ``mx_scale_in_input_dtype``: the same without the floor: the power of two and the division
  in the input's dtype, NaN blocks where the scale is 0 or Inf there (float16, and bf16 at
  2^128).
- ``mx_scale_divided_by_0.75``: s = 2^e / 0.75 in float32 (issue 42 names "a scale divided by
  0.75"; no public library was found doing it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mxcheck.diagnose.behaviour import Behaviour
from mxcheck.formats import FloatFormat, decode_table, encode_bits
from mxcheck.recipes import OperandSpec
from mxcheck.scaling.fp8 import FP8Tensor
from mxcheck.scaling.mx import MXTensor
from mxcheck.scaling.rules import E8M0_NAN

__all__ = ["MX_SCALE_FLOOR", "SCALE_VALUE_FAILURES", "BlockScaledValues", "fp8_divide_by_amax_over_max", "mx_scale_divided",
           "mx_scale_floored"]

MX_SCALE_FLOOR = 1e-10  # brevitas quant/float_base.py:24 scaling_min_val
SCALE_DIVISOR = 0.75  # issue 42: "a scale divided by 0.75"


@dataclass(frozen=True)
class BlockScaledValues:
    """A block-scaled tensor whose block scales are any float (no E8M0 byte holds them):
    ``codes`` (uint8, the element format's codes of x / scale, shaped like x) times
    ``block_scale`` (one per block, in ``dtype``, the arithmetic's type), each product rounded
    once in ``dtype``. ``lost``: elements whose quotient x / scale is not finite (a NaN input,
    a scale of 0): NaN, as is any code times an Inf scale."""

    codes: torch.Tensor
    block_scale: torch.Tensor
    lost: torch.Tensor
    fmt: FloatFormat
    block_size: int
    dtype: torch.dtype

    def dequantize(self) -> torch.Tensor:
        """float32 values (each the ``dtype`` product, exact in float32)."""
        s = self.block_scale.repeat_interleave(self.block_size, dim=-1)
        values = decode_table(self.fmt, self.codes.device, torch.float32)[self.codes.to(torch.int64)]
        product = (values.to(self.dtype) * s.to(self.dtype)).to(torch.float32)
        return torch.where(self.lost, torch.nan, product)


# (block exponent e as float32, the format's emax, the arithmetic's dtype) -> the block scale
ScaleOf = Callable[[torch.Tensor, int, torch.dtype], torch.Tensor]


def _values_under(x: torch.Tensor, scale: torch.Tensor, block_size: int, fmt: FloatFormat, rounding: str,
                  dtype: torch.dtype) -> BlockScaledValues:
    """x (2D, blocks of ``block_size`` along its last axis) quantized under ``scale`` (one per
    block, in ``dtype``): x / scale rounded in ``dtype``, encoded with ``rounding``, saturating."""
    quotient = (x.to(dtype).unflatten(-1, (-1, block_size)) / scale.unsqueeze(-1)).flatten(-2).to(torch.float32)
    lost = ~torch.isfinite(quotient)
    codes = encode_bits(torch.where(lost, 0.0, quotient), fmt, rounding, True)
    return BlockScaledValues(codes, scale, lost, fmt, block_size, dtype)


def _unless_same(out: BlockScaledValues, q: Any) -> BlockScaledValues | None:
    same = torch.equal(out.dequantize().view(torch.int32), q.dequantize().to(out.dtype).to(torch.float32)
                       .view(torch.int32))
    return None if same else out  # the quantized tensor's own values: the behaviour changes nothing


def _scaled_by(scale_of: ScaleOf, arithmetic: torch.dtype | None) -> Callable[..., Any]:
    """The MX behaviour: q's own exponents e (so conventions apply first), the block scale
    ``scale_of(e, emax, dtype)``, x quantized under it in ``dtype`` (the arithmetic's, the
    input's where ``arithmetic`` is None)."""
    def run(x: torch.Tensor, spec: OperandSpec, q: Any) -> Any:
        if not (isinstance(q, MXTensor) and not q.block_2d and q.hadamard is None and q.rounding != "sr"
                and x.ndim == 2 and q.axis in (-1, 1) and tuple(q.codes.shape) == tuple(x.shape)
                and x.shape[-1] % q.block_size == 0):
            return None
        dtype = x.dtype if arithmetic is None else arithmetic
        scale = scale_of(q.scales.to(torch.float32) - 127, q.fmt.emax, dtype).to(dtype)
        scale = torch.where(q.scales == E8M0_NAN, torch.nan, scale)
        return _unless_same(_values_under(x, scale, q.block_size, q.fmt, q.rounding, dtype), q)
    return run


def fp8_divide_by_amax_over_max(floor: float) -> Callable[..., Any]:
    """FP8 tensorwise: s = max(amax, floor) / fp8_max, x / s, and codes * s, all in the input's
    dtype (the floor too): a scale that is not the reciprocal of fp8_max / amax, and an Inf amax
    (s = Inf: x / Inf * Inf) or a float16 zero tensor (s = 0) NaN throughout."""
    def run(x: torch.Tensor, spec: OperandSpec, q: Any) -> Any:
        if not (isinstance(q, FP8Tensor) and q.granularity == "tensor" and spec.rounding == "rne" and x.ndim == 2
                and tuple(q.codes.shape) == tuple(x.shape) and x.numel()):
            return None
        dtype = x.dtype
        amax = x.abs().amax().to(dtype)  # NaN propagates, as torch's max does
        s = torch.maximum(amax, torch.tensor(floor, dtype=dtype)) / torch.tensor(q.fmt.max, dtype=dtype)
        scale = torch.where(torch.isnan(amax), torch.nan, s).expand(x.shape[0], 1)
        return _unless_same(_values_under(x, scale, x.shape[-1], q.fmt, "rne", dtype), q)
    return run


def mx_scale_floored(floor: float | None) -> Callable[..., Any]:
    """s = max(2^(e + emax), floor) / 2^emax with every step in the input's dtype (the floor
    constant too: 1e-10 is 0 in float16); no floor: 2^(e + emax) / 2^emax there."""
    def scale_of(e: torch.Tensor, emax: int, dtype: torch.dtype) -> torch.Tensor:
        pow2 = torch.exp2(e + emax).to(dtype)
        if floor is not None:
            pow2 = torch.maximum(pow2, torch.tensor(floor, dtype=dtype))
        return pow2 / torch.tensor(2.0**emax, dtype=dtype)
    return _scaled_by(scale_of, None)


def mx_scale_divided(divisor: float) -> Callable[..., Any]:
    """s = 2^e / divisor in float32."""
    def scale_of(e: torch.Tensor, emax: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.exp2(e) / torch.tensor(divisor, dtype=torch.float32)
    return _scaled_by(scale_of, torch.float32)


_BREVITAS = ("brevitas 0.13.3-0.13.4 core/scaling/runtime.py:237, core/restrict_val.py:56-59 "
             "(scaling_min_val 1e-10, quant/float_base.py:24)")

# Values-level failures: their result is BlockScaledValues, so they come last (a codes failure
# applied after them would find no MXTensor) and name only fake-quant kernels.
SCALE_VALUE_FAILURES: tuple[Behaviour, ...] = (
    Behaviour("mx_scale_floor_after_pow2", f"MX block scale floored at {MX_SCALE_FLOOR:g} after its power-of-two "
              "restriction, in the input's dtype: below 2^-33 the scale is 1e-10 / 2^emax, no power of two (tiny "
              "blocks round to 0); in float16 the floor is 0 and a scale outside float16's range makes the block NaN",
              "quantize", mx_scale_floored(MX_SCALE_FLOOR), (), _BREVITAS),
    Behaviour("mx_scale_in_input_dtype", "MX block scale 2^e computed in the input's dtype: where it underflows to 0 "
              "or overflows to Inf there (float16; bf16 at 2^128) the block is x / 0 times 0 (or x / Inf times Inf): NaN", "quantize",
              mx_scale_floored(None)),
    Behaviour("fp8_divide_by_amax_over_max", f"FP8 tensorwise scale max(amax, {MX_SCALE_FLOOR:g}) / fp8_max, x divided "
              "by it and the product taken in the input's dtype (not x * (fp8_max / amax)): one Inf makes the tensor "
              "NaN, and so does a float16 zero tensor", "quantize", fp8_divide_by_amax_over_max(MX_SCALE_FLOOR), (),
              "brevitas 0.13.3-0.13.4 quant/float_base.py:24-48 (FloatScaling, scaling_min_val 1e-10), "
              "core/quant/float.py:69-79"),
    Behaviour("mx_scale_divided_by_0.75", f"MX block scale 2^e divided by {SCALE_DIVISOR:g} (a scale no E8M0 byte "
              "holds: every block on a grid 4/3 coarser)", "quantize", mx_scale_divided(SCALE_DIVISOR), (),
              "issue 42 (reported, no public library found)"),
)
