"""FP8 scaling: tensorwise, rowwise and blockwise current scaling, and TE delayed scaling.

A scale multiplies the input before the cast (``codes = fp8(x * scale)``, RNE, saturating
as TransformerEngine's ``satfinite`` casts); ``scale_inv = 1 / scale`` in float32 is the
dequantization multiplier stored beside the codes. On CUDA that encode is one fused Triton
pass with the same bits (``mx_cuda.scaled_encode``, held to the torch path by
tests/test_fp8_fused.py); the scale and amax are torch's either way. The scale formulas are
a table:

- ``"te"``: TransformerEngine ``compute_scale_from_amax``
  (transformer_engine/common/recipe/recipe_common.cuh, stored version 01c24fe): amax below
  ``eps`` becomes ``eps``; amax 0, Inf or NaN gives scale 1.0; otherwise
  ``(fp8_max * 2**-margin) / amax`` in float32; an Inf scale becomes ``value_for_inf``
  (FLT_MAX for tensor and row scaling, as current_scaling.cu; the input dtype's largest
  finite value for the 1x128 / 128x128 blocks, as ``compute_scale_from_types<IType, OType>``
  and tests/pytorch/references/quantize_scale_calc.py); ``power_of_2`` keeps only the sign
  and exponent bits (``& 0xFF800000``), an exact floor to a power of two.
- ``"primus_turbo"``: Primus-Turbo ``compute_scale_from_amax`` (csrc/include/primus_turbo/
  device/quant_utils.cuh): ``fp8_max / fmax(amax, 1e-12)`` in float32 (``fmax`` ignores a
  NaN amax, so NaN gives fp8_max / 1e-12).

The amax is ``max |x|`` over the granularity's block with NaN propagating (torch ``amax``,
as TE's Python references); TE's CUDA amax kernels use ``fmaxf`` and skip NaN elements, a
kernel detail not modelled here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mxcheck.formats import (
    FORMATS,
    FloatFormat,
    check_quantize_input,
    decode_table,
    encode_bits,
    get_format,
)
from mxcheck.scaling.blocks import block_amax, by_row_chunks, check_tiles, per_row
from mxcheck.scaling.mx_cuda import scaled_encode

__all__ = [
    "FP8_FORMATS",
    "FP8_GRANULARITIES",
    "SCALE_FORMULAS",
    "DelayedScaling",
    "FP8Tensor",
    "fp8_quantize",
]

FP8_FORMATS = tuple(name for name, f in FORMATS.items() if f.bits == 8 and f.signed)
FLT_MAX = torch.finfo(torch.float32).max


@dataclass(frozen=True)
class Granularity:
    """A scaling granularity: block shape ``(rows, cols)`` over a 2D (M, K) tensor;
    ``None`` means the whole tensor or the whole row."""

    rows: int | None
    cols: int | None
    # TE blockwise kernels replace an Inf scale by the input dtype's max, not FLT_MAX.
    inf_to_input_max: bool = False


FP8_GRANULARITIES: dict[str, Granularity] = {
    "tensor": Granularity(None, None),
    "row": Granularity(1, None),
    "block1x128": Granularity(1, 128, inf_to_input_max=True),
    "block128x128": Granularity(128, 128, inf_to_input_max=True),
}


@dataclass(frozen=True)
class ScaleOptions:
    margin: int = 0
    power_of_2: bool = False
    eps: float = 0.0
    value_for_inf: float = FLT_MAX


def _scaled_max(fp8_max: float, margin: int) -> torch.Tensor:
    """TE's ``fp8_max * 2**-margin`` as a float32 (exact), the numerator of every scale."""
    return _host_float32(fp8_max * 2.0**-margin)


def _inf_to(scale: torch.Tensor, value_for_inf: float = FLT_MAX) -> torch.Tensor:
    """An Inf scale replaced by a finite one (FLT_MAX, or the input dtype's max in TE's
    blockwise kernels), as every TE scale computation does."""
    # the fill on scale's device: where() copies a host tensor there, and the copy waits for the GPU
    return torch.where(torch.isinf(scale), torch.full_like(scale, value_for_inf), scale)


def _te(amax: torch.Tensor, fp8_max: float, opt: ScaleOptions) -> torch.Tensor:
    # recipe_common.cuh compute_scale_from_amax, in few passes (each a kernel launch on a GPU;
    # the scales of a step are many small tensors): amax >= 0 or NaN, so an eps of 0 floors
    # nothing; where amax is finite and nonzero the quotient is finite or +Inf.
    if opt.eps:
        amax = torch.where(amax < opt.eps, torch.full_like(amax, opt.eps), amax)
    scale = torch.nan_to_num(_scaled_max(fp8_max, opt.margin) / amax, posinf=opt.value_for_inf)
    if opt.power_of_2:
        scale = (scale.view(torch.int32) & -0x800000).view(torch.float32)  # & 0xFF800000
    # amax 0, Inf or NaN: scale 1
    return torch.where(torch.isfinite(amax) & (amax != 0), scale, 1.0)


_PRIMUS_EPS = torch.tensor(1e-12, dtype=torch.float32)


def _primus_turbo(amax: torch.Tensor, fp8_max: float, opt: ScaleOptions) -> torch.Tensor:
    return _host_float32(fp8_max) / torch.fmax(amax, _PRIMUS_EPS)


@functools.lru_cache(maxsize=32)
def _host_float32(value: float) -> torch.Tensor:
    """A float32 0-dim CPU tensor of value, made once (a device op takes it by value)."""
    return torch.tensor(value, dtype=torch.float32)


SCALE_FORMULAS: dict[str, Callable[[torch.Tensor, float, ScaleOptions], torch.Tensor]] = {
    "te": _te,
    "primus_turbo": _primus_turbo,
}
# Which of margin / power_of_2 / eps each formula reads; setting another one is an error.
_FORMULA_OPTIONS = {"te": ("margin", "power_of_2", "eps"), "primus_turbo": ()}


@dataclass(frozen=True, eq=False)
class FP8Tensor:
    """FP8 codes (one uint8 per element, shape of x) and float32 dequantization multipliers.

    ``scale_inv`` has shape ``()`` (tensor), ``(M, 1)`` (row), ``(M, K/128)`` (block1x128)
    or ``(M/128, K/128)`` (block128x128); ``scale`` (the multiplier applied before the cast,
    ``scale_inv = 1 / scale``) and ``amax`` have the same shape.
    """

    codes: torch.Tensor
    scale_inv: torch.Tensor
    fmt: FloatFormat
    granularity: str
    scale: torch.Tensor
    amax: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """float32 ``fp8_value * scale_inv`` (one float32 multiply, as TE's dequantize)."""
        table = decode_table(self.fmt, self.codes.device, torch.float32)
        return _blockwise(lambda c, s: table[c.to(torch.int32)] * s, self.codes, self.scale_inv,
                          FP8_GRANULARITIES[self.granularity])

    def values(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The fp8 values, unscaled, in ``dtype`` (exact in float32 and bf16): what an FP8
        GEMM multiplies before applying ``scale_inv`` to the sum. Torch's own fp8 dtype reads
        the codes where it has the format (one pass; tests/test_gemm.py checks it against the
        decode table on every code)."""
        torch_dtype = self.fmt.torch_dtype
        if torch_dtype is not None and torch_dtype.itemsize == 1:
            return self.codes.view(torch_dtype).to(dtype)
        return decode_table(self.fmt, self.codes.device).to(dtype)[self.codes.to(torch.int32)]


def _blockwise(fn, x: torch.Tensor, s: torch.Tensor, g: Granularity) -> torch.Tensor:
    """``fn(x, s)`` with s broadcast over x, computed on row chunks: a tensor scale is one
    value; a row scale (M, 1) broadcasts as it is; a block scale is spread over its rows,
    and over its columns by viewing x in blocks (no per-element copy of the scales)."""
    if g.rows is None:
        return by_row_chunks(lambda xc: fn(xc, s), x)
    if g.cols is None:
        return by_row_chunks(fn, x, s)
    blocks = x.unflatten(-1, (-1, g.cols))
    return by_row_chunks(lambda xc, sc: fn(xc, sc.unsqueeze(-1)), blocks, per_row(s, g.rows)).flatten(-2)


def _check_fp8_format(fmt: str | FloatFormat) -> FloatFormat:
    fmt = get_format(fmt)
    if fmt.name not in FP8_FORMATS:
        raise ValueError(f"fmt={fmt.name!r} is not an FP8 format; expected one of {list(FP8_FORMATS)}")
    return fmt


def _check_margin(margin: object) -> None:
    if not isinstance(margin, int) or isinstance(margin, bool):
        raise TypeError(f"margin must be an int (TE's recipe margin), got {type(margin).__name__}")
    if margin < 0:
        raise ValueError(f"margin={margin}; expected an int >= 0 (scale = fp8_max * 2**-margin / amax)")


def _check_options(scale_formula: str, margin: int, power_of_2: bool, eps: float) -> None:
    if scale_formula not in SCALE_FORMULAS:
        raise ValueError(f"scale_formula={scale_formula!r} is not known; expected one of {sorted(SCALE_FORMULAS)}")
    _check_margin(margin)
    if not isinstance(power_of_2, bool):
        raise TypeError(f"power_of_2 must be a bool, got {type(power_of_2).__name__}")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"eps={eps!r}; expected a finite float >= 0 (the floor for amax)")
    given = {"margin": margin != 0, "power_of_2": power_of_2, "eps": eps != 0}
    unused = [k for k, v in given.items() if v and k not in _FORMULA_OPTIONS[scale_formula]]
    if unused:
        raise ValueError(f"scale_formula={scale_formula!r} does not use {unused}; leave them at their defaults "
                         "or use scale_formula='te'")


def _amax(x: torch.Tensor, granularity: str) -> torch.Tensor:
    """float32 amax per block, NaN propagating; ValueError where the blocks do not tile x."""
    g = FP8_GRANULARITIES[granularity]
    if g.rows is None:
        if x.numel() == 0:
            return torch.zeros((), dtype=torch.float32, device=x.device)
        return block_amax(x.reshape(1, -1), 1, x.numel()).reshape(())
    if x.ndim != 2:
        raise ValueError(f"granularity={granularity!r} needs a 2D (M, K) tensor, got shape {tuple(x.shape)}; "
                         "reshape to (-1, K) first")
    m, k = x.shape
    cols = g.cols if g.cols is not None else k
    if k == 0 or m == 0:
        raise ValueError(f"granularity={granularity!r} needs a non-empty tensor, got shape {tuple(x.shape)}")
    check_tiles(k, cols, f"x dim 1 (K) of shape {tuple(x.shape)}", pad_hint=False)
    check_tiles(m, g.rows, f"x dim 0 (M) of shape {tuple(x.shape)}", pad_hint=False)
    return block_amax(x, g.rows, cols)


def _encode_scaled(x: torch.Tensor, scale: torch.Tensor, fmt: FloatFormat, g: Granularity) -> torch.Tensor:
    # x * scale is one float32 multiply (TE: `static_cast<float>(x) * scale`), then RNE with
    # saturation, which is cvt.rn.satfinite and equals clamp(+-max) followed by the cast.
    # A NaN x keeps its sign (sign | nan_code, as encode): torch's CPU float16 -> float32
    # cast keeps it in its vector lanes but drops it in a run's scalar tail (0x7FFFFFFF), so
    # for float16 it is put back from x's own bits. A NaN the multiply makes (Inf * a zero
    # scale) is the CPU's default NaN (negative on x86).
    # On CUDA one fused Triton pass gives the same codes (mx_cuda.scaled_encode).
    fused = scaled_encode(x, scale, fmt, g.rows, g.cols)
    if fused is not None:
        return fused
    signed_nan = x.dtype == torch.float16 and fmt.nan in ("ocp", "ieee")

    def encode(xc: torch.Tensor, sc: torch.Tensor) -> torch.Tensor:
        code = encode_bits(xc.to(torch.float32) * sc, fmt, "rne", True)
        if signed_nan:
            code |= (torch.isnan(xc) & torch.signbit(xc)).to(torch.uint8) << (fmt.bits - 1)
        return code

    return _blockwise(encode, x, scale, g)


def fp8_quantize(
    x: torch.Tensor,
    fmt: str | FloatFormat = "e4m3",
    *,
    granularity: str = "tensor",
    scale_formula: str = "te",
    margin: int = 0,
    power_of_2: bool = False,
    eps: float = 0.0,
) -> FP8Tensor:
    """Current-scaling FP8 quantization of x (float32, bfloat16 or float16).

    ``granularity``: ``"tensor"`` (any shape), ``"row"`` (one scale per row of a 2D
    tensor), ``"block1x128"`` (1x128 along the last dim) or ``"block128x128"`` (tiles).
    ``scale_formula``, ``margin``, ``power_of_2`` and ``eps``: see the module docstring.
    """
    fmt = _check_fp8_format(fmt)
    check_quantize_input(x, "fp8_quantize")
    if granularity not in FP8_GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is not known; expected one of {list(FP8_GRANULARITIES)}")
    _check_options(scale_formula, margin, power_of_2, eps)
    g = FP8_GRANULARITIES[granularity]
    amax = _amax(x, granularity)  # in x's dtype: exact, and no float32 copy of x
    inf_value = torch.finfo(x.dtype).max if g.inf_to_input_max else FLT_MAX
    opt = ScaleOptions(margin=margin, power_of_2=power_of_2, eps=float(eps), value_for_inf=inf_value)
    scale = SCALE_FORMULAS[scale_formula](amax, fmt.max, opt)
    codes = _encode_scaled(x, scale, fmt, g)
    # reciprocal is 1.0 / scale (which torch computes as reciprocal times 1.0) in one pass
    return FP8Tensor(codes=codes, scale_inv=torch.reciprocal(scale), fmt=fmt, granularity=granularity, scale=scale,
                     amax=amax)


# ---------------------------------------------------------------------------------------
# Delayed scaling (TransformerEngine DelayedScaling), matched against:
#   transformer_engine/common/recipe/delayed_scaling.cu @ 6b71a0adeedf9ab82c0ed2b179dc419cec2cc789
#     (kernel_bulk: the default fused_amax_and_scale_update_after_reduction path)
#   transformer_engine/pytorch/quantization.py @ f2b6810c5a7df9c443e53e685253387e2d5c133c
#     (reduce_and_update_fp8_tensors; the unfused path, NVTE_UNFUSED_FP8_UPDATE=1:
#      _default_get_amax_and_update_history, _update_amax_history, _default_sf_compute)
# The cast for step t uses the scale produced by the update after step t-1; the cast writes
# its amax into amax_history[0]; the update (at autocast exit) reads a window that includes
# that amax. So a scale lags its amax by one step.

_AMAX_ALGOS = ("max", "most_recent")


def _roll(h: torch.Tensor) -> torch.Tensor:
    # torch.roll(h, -1) then zero row 0: new[i] = old[i+1], new[L-1] = old[0], new[0] = 0.
    h = torch.roll(h, -1, 0)
    h[0] = 0.0
    return h


def _fused_update(h, scale, algo, fp8_max, margin):
    """delayed_scaling.cu kernel_bulk: no roll at all when the current amax is 0; fmaxf
    (NaN ignored) over the window; scale = scaled_max / amax in float32."""
    last = h[0].clone()
    amax = torch.zeros((), dtype=torch.float32)
    if bool(last != 0):  # NaN != 0 is true: a NaN amax rolls
        amax = torch.nan_to_num(h, nan=0.0, posinf=math.inf).amax().clamp(min=0.0)  # fmaxf from 0
        h = _roll(h)
    if algo == "most_recent":
        amax = last
    ok = torch.isfinite(amax) & (amax > 0)
    return h, _inf_to(torch.where(ok, _scaled_max(fp8_max, margin) / amax, scale))


def _unfused_update(h, scale, algo, fp8_max, margin):
    """quantization.py _amax_and_scale_update: always rolls; torch.max propagates NaN;
    sf = (fp8_max / amax) / 2**margin, kept where amax is not finite and > 0.

    TE writes ``fp8_max / amax`` with a Python float over a tensor, which torch evaluates as
    ``amax.reciprocal() * fp8_max`` (Tensor.__rtruediv__; torch.compile on CPU does the
    same): two roundings, so about a quarter of amaxes get a scale one ulp away from the
    fused kernel's single division.
    """
    amax = torch.max(h, dim=0).values if algo == "max" else h[0].clone()
    h = _roll(h)
    sf = (torch.reciprocal(amax) * fp8_max) / (2**margin)
    sf = torch.where(amax > 0.0, sf, scale)
    sf = torch.where(torch.isfinite(amax), sf, scale)
    return h, _inf_to(sf)


class DelayedScaling:
    """TransformerEngine delayed scaling for one tensor: an amax history and a scale.

    ``quantize(x)`` casts with the current scale (tensorwise, RNE, satfinite), then
    ``update(amax(x))``. ``update`` writes the amax into ``amax_history[0]`` and runs TE's
    update: ``fused=True`` the default CUDA ``kernel_bulk``, ``fused=False`` the Python
    path (``NVTE_UNFUSED_FP8_UPDATE=1``). They differ when the current amax is 0 (fused:
    no roll, scale kept) and on NaN in the window (fused: ignored; unfused: scale frozen).
    """

    def __init__(
        self,
        fmt: str | FloatFormat = "e4m3",
        amax_history_len: int = 1024,
        amax_compute_algo: str = "max",
        margin: int = 0,
        fused: bool = True,
    ) -> None:
        self.fmt = _check_fp8_format(fmt)
        if not isinstance(amax_history_len, int) or isinstance(amax_history_len, bool) or amax_history_len < 1:
            raise ValueError(f"amax_history_len={amax_history_len!r}; expected an int >= 1")
        if amax_compute_algo not in _AMAX_ALGOS:
            raise ValueError(f"amax_compute_algo={amax_compute_algo!r} is not known; expected one of {list(_AMAX_ALGOS)}")
        _check_margin(margin)
        if not isinstance(fused, bool):
            raise TypeError(f"fused must be a bool, got {type(fused).__name__}")
        self.amax_history_len = amax_history_len
        self.amax_compute_algo = amax_compute_algo
        self.margin = margin
        self.fused = fused
        self.amax_history = torch.zeros(amax_history_len, dtype=torch.float32)
        self.scale = torch.ones((), dtype=torch.float32)

    def __repr__(self) -> str:
        return (f"DelayedScaling(fmt={self.fmt.name!r}, amax_history_len={self.amax_history_len}, "
                f"amax_compute_algo={self.amax_compute_algo!r}, margin={self.margin}, fused={self.fused})")

    @property
    def scale_inv(self) -> torch.Tensor:
        return 1.0 / self.scale

    def quantize(self, x: torch.Tensor) -> FP8Tensor:
        """Cast x with the current scale, then record its amax and update the state."""
        check_quantize_input(x, "DelayedScaling.quantize")
        amax = _amax(x, "tensor")
        scale = self.scale.clone()
        codes = _encode_scaled(x, scale, self.fmt, FP8_GRANULARITIES["tensor"])
        out = FP8Tensor(codes=codes, scale_inv=1.0 / scale, fmt=self.fmt, granularity="tensor", scale=scale,
                        amax=amax)
        self.update(amax)
        return out

    def update(self, amax: float | torch.Tensor) -> None:
        """Record amax (>= 0, Inf or NaN) into amax_history[0] and run TE's update."""
        a = torch.as_tensor(amax, dtype=torch.float32).detach().cpu()
        if a.numel() != 1:
            raise ValueError(f"amax must be a scalar, got shape {tuple(a.shape)}")
        a = a.reshape(())
        if bool(a < 0):
            raise ValueError(f"amax={float(a)!r} is negative; an amax is max |x| (>= 0, Inf or NaN)")
        h = self.amax_history.clone()
        h[0] = a
        step = _fused_update if self.fused else _unfused_update
        self.amax_history, self.scale = step(h, self.scale, self.amax_compute_algo, self.fmt.max, self.margin)
