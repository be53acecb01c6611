"""Emulated quantized GEMM in the NT convention: ``a[M, K] @ b[N, K]^T`` from quantized operands.

An operand is quantized along its last dim, the contraction dim (see ``mxcheck.recipes``).
The GEMM dequantizes both operands exactly to float32 and multiplies:

- ``accumulate=torch.float64``: the products and sums in float64, the reference.
- ``accumulate=torch.float32``, FP8 tensor- or row-scaled and NVFP4 operands: as FP8 and
  NVFP4 hardware (cuBLASLt's scale_a * scale_b, TE's NVFP4 alpha), the unscaled values
  (fp8 values; e2m1 times the ue4m3 block scale) are multiplied exactly, summed in float32,
  and the sum is multiplied once by ``outer_a * outer_b`` (scale_inv; tensor_scale). On
  CUDA the values are bf16 and the matmul is bf16 with fp32 accumulation.
- ``accumulate=torch.float32``, other operands: float32 accumulation. On CUDA, when both dequantized
  operands are exactly representable in bf16 (MX fp4/fp6/fp8 elements times E8M0 scales
  are, unless a scale leaves bf16's range: ``mx_fits_bf16``'s rule on the scale bytes;
  other operands are compared value by value), the fast path casts them to bf16 and runs a
  bf16 matmul with fp32 accumulation: the same product a hardware MX GEMM computes, and
  what a benchmark times against a plain bf16 matmul. Otherwise a float32 matmul. For two
  MX operands with Triton the rule is applied on the device, with no host read: the bf16
  dequantization flags a value bf16 cannot hold and a float32 GEMM from the exact values
  then overwrites the result (``_mx_gemm_without_a_read``).

Either way ``bias`` is added in the accumulation dtype (float32 for the float32 path) and
the result is cast once to ``out_dtype``.

Why one module, over the ~400-line guideline: every path above rests on one rule, when a
dequantized operand is exact in bf16 (``mx_fits_bf16``, ``_as_bf16_exactly``), and on one
check of the operands' pairing (``_check_operands``); split along the paths, each file would
import the others' private helpers and the rule would live apart from every caller it
constrains. The seam, if it grows: the operand helpers (``quantize_operand``,
``transposed_operand``, ``dequantize_operand``, about 140 lines) can move to their own module
in the same layer.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from mxcheck.formats import FloatFormat, decode_table, get_format
from mxcheck.profiles import get_profile
from mxcheck.recipes import OperandSpec
from mxcheck.scaling import (
    DelayedScaling,
    FP8Tensor,
    MXTensor,
    NVFP4Tensor,
    fp8_quantize,
    mx_quantize,
    nvfp4_quantize,
)
from mxcheck.scaling.blocks import per_row
from mxcheck.scaling.fp8 import FP8_GRANULARITIES
from mxcheck.scaling.mx_cuda import (
    dequantize_bf16,
    gemm_f32_where_inexact,
    outer_scaled_epilogue,
    transposed_codes,
)

__all__ = [
    "ACCUMULATE_DTYPES",
    "PlainTensor",
    "QTensor",
    "dequantize_operand",
    "emulated_gemm",
    "mx_fits_bf16",
    "quantize_operand",
    "transposed_operand",
]

ACCUMULATE_DTYPES = (torch.float32, torch.float64)
# "none" keeps an operand in a plain torch float dtype (rounded once, RNE).
_PLAIN_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_BF16_MIN_EXP = -133  # bf16's smallest subnormal is 2**-133


@dataclass(frozen=True, eq=False)
class PlainTensor:
    """An operand kept in a plain float dtype (scaling "none"): ``value`` rounded to it."""

    value: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    def dequantize(self) -> torch.Tensor:
        return self.value.to(torch.float32)


QTensor = MXTensor | NVFP4Tensor | FP8Tensor | PlainTensor
_QTYPES = (MXTensor, NVFP4Tensor, FP8Tensor, PlainTensor)


def quantize_operand(
    x: torch.Tensor,
    spec: OperandSpec,
    *,
    rand: torch.Tensor | None = None,
    state: DelayedScaling | None = None,
) -> QTensor:
    """Quantize a 2D operand along its last dim (its contraction dim) as ``spec`` says.

    ``rand``: uint8 random bits shaped like x, required when ``spec.rounding == "sr"``
    and refused otherwise. ``state``: the operand's ``DelayedScaling``, required for
    ``spec.scaling == "delayed"`` (it carries the amax history across steps, so it cannot
    be made here). ``spec.profile``: the named profile's bits, in the same tensor type.
    """
    if not isinstance(spec, OperandSpec):
        raise TypeError(f"spec must be an OperandSpec, got {type(spec).__name__}")
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a 2D operand [rows, contraction], got {shape}")
    if spec.rounding == "sr" and rand is None:
        raise ValueError(f"spec {_describe(spec)} rounds stochastically: pass rand, uint8 random bits "
                         f"of shape {tuple(x.shape)}")
    if spec.rounding != "sr" and rand is not None:
        raise ValueError(f"rand was given but spec {_describe(spec)} rounds with {spec.rounding!r}, not 'sr'")
    if spec.scaling != "delayed" and state is not None:
        raise ValueError(f"state was given but spec {_describe(spec)} is not delayed scaling")
    if spec.scaling not in ("mx", "nvfp4", "none") and spec.hadamard is not None:
        raise ValueError(f"spec {_describe(spec)}: FP8 scaling takes no Hadamard rotation here")
    if spec.profile is not None:  # the profile's bits, in the tensor type of its scaling
        return get_profile(spec.profile).quantized(x, spec.fmt)
    if spec.scaling == "mx":
        return mx_quantize(x, spec.fmt, block_size=spec.block_size, axis=-1, scale_rule=spec.scale_rule,
                           rounding=spec.rounding, block_2d=spec.block_2d, hadamard=spec.hadamard,
                           zero_scale=spec.zero_scale, pad_to=spec.pad_to, rand=rand)
    if spec.scaling == "nvfp4":
        _only_roundings(spec, ("rne", "sr"))
        return nvfp4_quantize(x, block_2d=spec.block_2d, hadamard=spec.hadamard, rand=rand)
    if spec.scaling in FP8_GRANULARITIES:
        _only_roundings(spec, ("rne",))
        return fp8_quantize(x, spec.fmt, granularity=spec.scaling, scale_formula=spec.scale_formula,
                            margin=spec.margin, power_of_2=spec.power_of_2)
    if spec.scaling == "delayed":
        _only_roundings(spec, ("rne",))
        if not isinstance(state, DelayedScaling):
            raise ValueError(f"spec {_describe(spec)} is delayed scaling: pass state=DelayedScaling"
                             f"({spec.fmt!r}, ...), kept across steps; got {type(state).__name__}")
        if state.fmt.name != spec.fmt:
            raise ValueError(f"state is a DelayedScaling for {state.fmt.name}, spec {_describe(spec)} "
                             f"wants {spec.fmt}")
        return state.quantize(x)
    # scaling == "none"
    _only_roundings(spec, ("rne",))
    dtype = _PLAIN_DTYPES.get(get_format(spec.fmt).name)
    if dtype is None:
        raise ValueError(f"spec {_describe(spec)}: scaling 'none' keeps one of {sorted(_PLAIN_DTYPES)}, "
                         f"not {spec.fmt!r}")
    return PlainTensor(x.to(dtype))


def transposed_operand(q: QTensor, spec: OperandSpec) -> QTensor | None:
    """``quantize_operand(x.T, spec)`` from q, the ``quantize_operand(x, spec)`` of a 2D x,
    where its blocks are symmetric, else None.

    Tensorwise FP8 (current scaling) and square tiles (FP8 128x128, MX and NVFP4 2D tiles,
    without a rotation or SR, and with nothing padded either way) take their amax over a
    set of elements that the transpose maps onto itself, and encode each element alone: the
    transposed codes and tile scales are the bits quantizing x.T gives (TE and Primus-Turbo
    build their columnwise copies so). A linear's x_col, w_col and g_col are such transposes
    of x_row, w_row and g_row; tests/test_linear_transposes.py holds both ways equal.
    """
    if spec.rounding == "sr" or spec.hadamard is not None:  # SR draws per position
        return None
    if isinstance(q, FP8Tensor) and spec.scaling == q.granularity:
        if q.granularity == "tensor":
            return replace(q, codes=_codes_t(q.codes))
        if q.granularity == "block128x128":
            return replace(q, codes=_codes_t(q.codes),
                           **{f: getattr(q, f).t().contiguous() for f in ("scale_inv", "scale", "amax")})
        return None
    if isinstance(q, MXTensor) and spec.scaling == "mx" and q.block_2d and q.hadamard is None:
        rows, cols = q.shape
        if tuple(q.codes.shape) != q.shape or (spec.pad_to is not None and rows % spec.pad_to):
            return None  # a padded axis: x.T pads the other one
        tiles = q.scales[:: q.block_size]  # each tile's byte sits on each of its rows
        return replace(q, codes=_codes_t(q.codes), scales=per_row(tiles.t().contiguous(), q.block_size),
                       shape=(cols, rows))
    if isinstance(q, NVFP4Tensor) and spec.scaling == "nvfp4" and q.block_2d and q.hadamard is None:
        tiles = q.block_scales[:: spec.block_size]
        return replace(q, codes=_codes_t(q.codes),
                       block_scales=per_row(tiles.t().contiguous(), spec.block_size))
    return None


def _codes_t(codes: torch.Tensor) -> torch.Tensor:
    """codes.t().contiguous(): one tiled Triton pass where it runs, else torch's copy."""
    fused = transposed_codes(codes)
    return codes.t().contiguous() if fused is None else fused


def _describe(spec: OperandSpec) -> str:
    return f"(fmt={spec.fmt}, scaling={spec.scaling}, rounding={spec.rounding})"


def _only_roundings(spec: OperandSpec, allowed: tuple[str, ...]) -> None:
    if spec.rounding not in allowed:
        raise ValueError(f"spec {_describe(spec)}: scaling {spec.scaling!r} supports rounding "
                         f"{list(allowed)}, not {spec.rounding!r}")


def _logical_shape(q: QTensor) -> tuple[int, ...]:
    if isinstance(q, (MXTensor, PlainTensor)):
        return tuple(q.shape)
    return tuple(q.codes.shape)


def _check_blocked_last(q: MXTensor) -> None:
    if q.axis != len(q.shape) - 1:
        raise ValueError(f"an NT GEMM operand is blocked along its last (contraction) axis; "
                         f"this MXTensor of shape {q.shape} is blocked along axis {q.axis}")


def dequantize_operand(q: QTensor, *, padded: bool = True, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float32 operand a GEMM consumes (exact: every value is element * scale).

    MX operands keep their zero padding along K by default: with a Hadamard the rotated
    blocks spread the real entries over the padded tail, so stripping it would drop part
    of the rotated operand. ``padded=False`` strips it (meaningful without a rotation).
    """
    if isinstance(q, MXTensor):
        _check_blocked_last(q)
        return q.dequantize(padded=padded, dtype=dtype)
    if isinstance(q, _QTYPES):
        return q.dequantize().to(dtype)
    raise TypeError(f"expected a quantized operand ({', '.join(t.__name__ for t in _QTYPES)}), got "
                    f"{type(q).__name__}; quantize a tensor with quantize_operand(x, spec)")


def _rotation(q: QTensor) -> object:
    return q.hadamard if isinstance(q, (MXTensor, NVFP4Tensor)) else None


def _check_operands(a: QTensor, b: QTensor) -> None:
    """Two 2D quantized operands of one K with the same rotation."""
    for name, q in (("a", a), ("b", b)):
        if not isinstance(q, _QTYPES):
            raise TypeError(f"{name} must be a quantized operand ({', '.join(t.__name__ for t in _QTYPES)}), "
                            f"got {type(q).__name__}; quantize it with quantize_operand(x, spec)")
        if len(_logical_shape(q)) != 2:
            raise ValueError(f"{name} must be 2D, got shape {_logical_shape(q)}")
    sa, sb = _logical_shape(a), _logical_shape(b)
    if sa[1] != sb[1]:
        raise ValueError(f"K differs: a has shape {sa} (M, K) and b has shape {sb} (N, K); "
                         "an NT GEMM contracts the last dim of both")
    # A rotation cancels only between two operands rotated alike: (A R)(B R)^T = A B^T.
    if _rotation(a) != _rotation(b):
        raise ValueError(f"a and b are rotated differently ({_rotation(a)} vs {_rotation(b)}); "
                         "the Hadamard cancels only when both contraction axes carry the same one")


def _operands(a: QTensor, b: QTensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Both operands dequantized (float32, or bf16 for the fast path) with one K
    (zero-extended where padded apart)."""
    _check_operands(a, b)
    da, db = dequantize_operand(a, dtype=dtype), dequantize_operand(b, dtype=dtype)
    if da.device != db.device:
        raise ValueError(f"a is on {da.device} and b on {db.device}; put both on one device")
    # Zero padding (rotated or not: a rotated all-zero block is zero) extends K exactly.
    k = max(da.shape[1], db.shape[1])
    da, db = (d if d.shape[1] == k else torch.nn.functional.pad(d, (0, k - d.shape[1])) for d in (da, db))
    return da, db


def _outer_scaled(q: QTensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(values, outer) with q == values * outer, values exact in bf16 and outer constant
    along K, or None. FP8 tensor- and row-scaled operands are fp8 values times scale_inv
    (shape () or (rows, 1)); NVFP4 operands are e2m1 values times their ue4m3 block scale
    (at most 6 significant bits) times ``tensor_scale``."""
    if isinstance(q, FP8Tensor) and FP8_GRANULARITIES[q.granularity].cols is None:
        return q.values(torch.bfloat16 if q.codes.is_cuda else torch.float32), q.scale_inv
    if isinstance(q, NVFP4Tensor):
        return q.block_values(torch.bfloat16 if q.codes.is_cuda else torch.float32), q.tensor_scale
    return None


def _outer_scaled_gemm(a: QTensor, b: QTensor, out_dtype: torch.dtype,
                       bias: torch.Tensor | None) -> torch.Tensor | None:
    """``((A_values @ B_values^T) * (outer_a * outer_b^T) + bias).to(out_dtype)`` when both
    operands are outer-scaled, else None.

    This is the GEMM FP8 and NVFP4 hardware computes (cuBLASLt's scale_a * scale_b, TE's
    NVFP4 alpha): products of the values are exact, the sum is float32, and the outer scales
    multiply the sum once. Dequantizing first would round every value * scale_inv to float32
    and, on CUDA, force a float32 matmul (the values are bf16, their scaled products are not).
    The epilogue (scale, bias, cast) is one fused pass where Triton runs, with the same
    roundings (``mx_cuda.outer_scaled_epilogue``), else torch's passes.
    """
    _check_operands(a, b)
    fa, fb = _outer_scaled(a), _outer_scaled(b)
    if fa is None or fb is None:
        return None
    (va, oa), (vb, ob) = fa, fb
    if va.device != vb.device:
        raise ValueError(f"a is on {va.device} and b on {vb.device}; put both on one device")
    _check_bias(bias, vb.shape[0], va.device)
    if va.is_cuda:  # the values are bf16 exactly: a bf16 matmul with float32 accumulation
        with _strict_cuda_matmul():
            acc = _bf16_matmul(va.to(torch.bfloat16), vb.to(torch.bfloat16), want_bf16=False)
    else:
        acc = va @ vb.T
    fused = outer_scaled_epilogue(acc, oa, ob, bias, out_dtype)
    if fused is not None:
        return fused
    y = acc.mul_(oa * ob.reshape(1, -1) if ob.ndim else oa * ob)
    return (y if bias is None else y + bias.float()).to(out_dtype)


def _check_bias(bias: torch.Tensor | None, n: int, device: torch.device) -> None:
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point:
        what = bias.dtype if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise TypeError(f"bias must be a floating-point tensor, got {what}")
    if tuple(bias.shape) != (n,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}; expected ({n},), one value per output column N")
    if bias.device != device:
        raise ValueError(f"bias is on {bias.device} and the operands on {device}")


@contextlib.contextmanager
def _strict_cuda_matmul() -> Iterator[None]:
    """Float32 accumulation as claimed: no TF32 inputs and no bf16 reduced-precision (split-K
    in bf16) reductions, whatever the process set. Restored afterwards."""
    m = torch.backends.cuda.matmul
    saved = m.allow_tf32, m.allow_bf16_reduced_precision_reduction
    m.allow_tf32, m.allow_bf16_reduced_precision_reduction = False, False
    try:
        yield
    finally:
        m.allow_tf32, m.allow_bf16_reduced_precision_reduction = saved


def mx_fits_bf16(q: MXTensor) -> bool:
    """Whether every value of q is what its bf16 cast gives, read from the scale bytes
    (1/32 of the data), and for most formats from the format alone.

    An element is an integer multiple of 2**(1 - bias - mbits) with at most mbits + 1
    significant bits; times 2**(s - 127) it is a bf16 while that lowest bit is at or above
    2**-133 (bf16's smallest subnormal). At the top nothing can go wrong: a value of at most
    8 significant bits below float32's overflow is at most bf16's max, and one that
    overflows float32 is Inf in both. So only the smallest bytes can fail, and for fp4 and
    fp6 elements not even byte 0 does (e2m1's lowest bit times 2**-127 is 2**-128): those
    need no device read at all. A block whose byte is too small passes only if all its codes
    are zero: all-zero blocks get byte 0 (``zero_scale``), and mxfp8 tensors have them
    routinely. NaN blocks (byte 255) are NaN in bf16 too.
    """
    return _all_fit_bf16(q)


def _all_fit_bf16(*qs: MXTensor) -> bool:
    """mx_fits_bf16 of every q. Each device read waits for the GPU to drain, so: none for
    formats that fit at every byte; one for the smallest bytes of the others (an emulated
    GEMM checks two operands); one more, over the codes, only where a byte is too small."""
    if any(q.fmt.mbits > 7 for q in qs):
        return False
    checked = [q for q in qs if _bf16_lowest_byte(q.fmt) > 0]
    if not checked:
        return True
    lowest = torch.stack([q.scales.amin() for q in checked]).tolist()
    small = [q for q, byte in zip(checked, lowest, strict=True) if byte < _bf16_lowest_byte(q.fmt)]
    return not small or not bool(torch.stack([_nonzero_in_small_blocks(q) for q in small]).any())


def _nonzero_in_small_blocks(q: MXTensor) -> torch.Tensor:
    """Whether a block whose byte is below bf16's range holds a nonzero code (0-dim bool)."""
    small = q.scales.to(torch.int32) < _bf16_lowest_byte(q.fmt)
    codes = q.codes.unflatten(-1, (-1, q.block_size))  # scales are per block of the last axis
    return (small.unsqueeze(-1) & (codes & q.fmt.magnitude_mask).ne(0)).any()


@functools.cache
def _bf16_lowest_byte(fmt: FloatFormat) -> int:
    """The smallest E8M0 byte at which the element's lowest bit times the scale is at least
    bf16's smallest subnormal (<= 0: every byte)."""
    return _BF16_MIN_EXP - (1 - fmt.bias - fmt.mbits) + 127


def _as_bf16_exactly(q: QTensor, d: torch.Tensor) -> torch.Tensor | None:
    """d (q dequantized) in bf16 if every value survives the cast, else None."""
    d16 = d.to(torch.bfloat16)
    if isinstance(q, MXTensor) and mx_fits_bf16(q):
        return d16
    # The general test: compare every value (NaN does not compare equal: no fast path).
    return d16 if torch.equal(d16.to(torch.float32), d) else None


def _bf16_matmul(a16: torch.Tensor, b16: torch.Tensor, want_bf16: bool) -> torch.Tensor:
    """bf16 x bf16 with fp32 accumulation; the fp32 sum when ``want_bf16`` is False."""
    if want_bf16:
        return a16 @ b16.T  # cuBLAS rounds the fp32 accumulator to bf16 once
    try:
        return torch.mm(a16, b16.T, out_dtype=torch.float32)
    except (TypeError, RuntimeError, NotImplementedError):  # torch without mm(out_dtype=)
        return a16.float() @ b16.float().T


def _mx_gemm_without_a_read(a: MXTensor, b: MXTensor, out_dtype: torch.dtype,
                            bias: torch.Tensor | None) -> torch.Tensor | None:
    """The bf16 fast path for two CUDA MX operands, exact with no device read, or None where
    the Triton kernels cannot run.

    The dequantization writes bf16 values and flags, on the device, any value bf16 cannot
    hold (``mx_fits_bf16``'s rule: a nonzero code under a byte below ``_bf16_lowest_byte``;
    only fp8 elements can have one). After the bf16 GEMM, a float32 GEMM from the exact
    values overwrites the result if the flag is set and returns at once if not. So the
    host never waits for the GPU to pick a path (each wait drained the queue), and a flagged
    GEMM still sums exact products in float32, as the float32 path does (in another order).
    """
    _check_operands(a, b)
    _check_blocked_last(a)
    _check_blocked_last(b)
    device = a.codes.device
    if b.codes.device != device:
        raise ValueError(f"a is on {device} and b on {b.codes.device}; put both on one device")
    checked = any(_bf16_lowest_byte(q.fmt) > 0 for q in (a, b))
    inexact = torch.zeros(1, dtype=torch.int32, device=device) if checked else None
    operands = [(q.codes, q.scales, decode_table(q.fmt, device, torch.float32), q.block_size)
                for q in (a, b)]
    values = [dequantize_bf16(*op, inexact=inexact, lowest_byte=max(0, _bf16_lowest_byte(q.fmt)),
                              magnitude_mask=q.fmt.magnitude_mask) for op, q in zip(operands, (a, b), strict=True)]
    if values[0] is None or values[1] is None:
        return None
    k = max(v.shape[1] for v in values)  # zero padding extends K exactly (as _operands)
    da, db = (v if v.shape[1] == k else torch.nn.functional.pad(v, (0, k - v.shape[1])) for v in values)
    _check_bias(bias, db.shape[0], device)
    fast_bf16 = out_dtype == torch.bfloat16 and bias is None
    with _strict_cuda_matmul():
        y = _bf16_matmul(da, db, fast_bf16)
    if inexact is not None and not gemm_f32_where_inexact(inexact, *operands, y):
        raise RuntimeError("the float32 fallback GEMM could not run where the dequantization did")
    return y if fast_bf16 else (y if bias is None else y + bias.float()).to(out_dtype)


def emulated_gemm(
    a: QTensor,
    b: QTensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    accumulate: torch.dtype = torch.float32,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``a[M, K] @ b[N, K]^T (+ bias[N])`` from quantized operands, cast to ``out_dtype``."""
    if accumulate not in ACCUMULATE_DTYPES:
        raise ValueError(f"accumulate={accumulate}; expected one of {[str(d) for d in ACCUMULATE_DTYPES]}")
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise TypeError(f"out_dtype={out_dtype!r}; expected a floating-point torch.dtype")
    if accumulate == torch.float32:
        y = _outer_scaled_gemm(a, b, out_dtype, bias)
        if y is not None:
            return y
    if accumulate == torch.float32 and isinstance(a, MXTensor) and isinstance(b, MXTensor) and a.codes.is_cuda:
        y = _mx_gemm_without_a_read(a, b, out_dtype, bias)
        if y is not None:
            return y
    # MX operands on CUDA whose values are all bf16 dequantize straight to bf16: the fast
    # path (decided from the scale bytes, before any full-size pass).
    direct_bf16 = (accumulate == torch.float32 and isinstance(a, MXTensor) and isinstance(b, MXTensor)
                   and a.codes.is_cuda and _all_fit_bf16(a, b))
    da, db = _operands(a, b, torch.bfloat16 if direct_bf16 else torch.float32)
    _check_bias(bias, db.shape[0], da.device)
    if direct_bf16:
        fast_bf16 = out_dtype == torch.bfloat16 and bias is None
        with _strict_cuda_matmul():
            y = _bf16_matmul(da, db, fast_bf16)
        return y if fast_bf16 else (y if bias is None else y + bias.float()).to(out_dtype)
    if accumulate == torch.float64:
        y = da.double() @ db.double().T
        return (y if bias is None else y + bias.double()).to(out_dtype)
    if da.is_cuda:
        a16, b16 = _as_bf16_exactly(a, da), _as_bf16_exactly(b, db)
        with _strict_cuda_matmul():
            if a16 is not None and b16 is not None:
                fast_bf16 = out_dtype == torch.bfloat16 and bias is None
                y = _bf16_matmul(a16, b16, fast_bf16)
                if fast_bf16:
                    return y
            else:
                y = da @ db.T
    else:
        y = da @ db.T
    return (y if bias is None else y + bias.float()).to(out_dtype)
