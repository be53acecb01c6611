"""Fused kernels for CUDA with Triton: MX quantize in one pass, NVFP4 quantize in two, MX
dequantize to bf16 in one, the FP8 scaled encode in one, the FP8/NVFP4 GEMM epilogue in one,
and the byte transpose of a transposed operand's codes in one.

They are fast paths of the pure-PyTorch oracles in ``mxcheck.scaling.mx`` and
``mxcheck.scaling.fp8``, not a second definition: the same integer and float32 arithmetic,
so the same bits; ``tests/test_mx_fused.py`` and ``tests/test_fp8_fused.py`` compare them
with the torch paths on every code, tie, scale byte and special value. Each returns None
where it cannot run (no Triton, not CUDA, a case it does not take), and the caller then uses
the torch path. ``MXCHECK_FUSED_MX=0`` turns them all off (an A/B switch for benchmarks and
for bisecting). Under ``TRITON_INTERPRET=1`` they run on CPU tensors too, in Triton's
interpreter, which is how the CPU tests reach them. The kernels are in
``mx_cuda_kernels.py``; both quantizers encode their elements with its one ``encode_scaled``
(``formats.encode_bits_float``: clamp, exponent field, quantum multiply, rounding, sign).

- ``dequantize_bf16``: the torch path (``MXTensor.dequantize``) makes several full-size
  passes (index cast, table gather, scale broadcast, multiply); this kernel reads each code
  and its block's E8M0 byte once and writes the bf16 value once. It can also flag, on the
  device, a value bf16 cannot hold (``gemm.mx_fits_bf16``'s rule), and
  ``gemm_f32_where_inexact`` then redoes the GEMM from the exact float32 values: the
  emulated MX GEMM picks its path with no host read.
- ``quantize_blocks``: the torch path makes about twenty full-size passes (Hadamard
  butterflies, amax, the scale rule, the element encode); this kernel reads each element
  once (and its SR uniform) and writes its code, and each block's scale byte (2D tiles
  take the max of their rows' block maxima in the kernel too). The rotation
  is the same radix-2 butterfly in float32 as ``mxcheck.hadamard`` (the same sums in the
  same order, then one multiply by the norm), so its values are the same bits.
- ``scaled_encode``: FP8's ``codes = fp8(float32(x) * scale)`` (RNE, saturating; the scale
  and amax stay torch's). The torch path makes about four full-size float32 passes (widen,
  multiply, clamp, cast); this kernel reads each element and its scale once and writes its
  code. One indexing rule serves every granularity (tensor, row, 1x128, 128x128): the scale
  of (row // R, col // C), stride 0 along a dimension one scale spans. A NaN keeps its sign
  (sign | nan_code; fnuz: nan_code), read from x's own bits; a NaN the multiply makes (Inf
  times primus_turbo's zero scale for an Inf amax) is negative, as the torch path's x86
  multiply makes it.
- ``nvfp4_quantize_blocks``: the torch path makes about thirty passes and tiny ops (TE's RHT,
  the global and block amaxes, the scale arithmetic, the two encodes); here one pass takes the
  global amax of the (rotated) tensor, and the quantize kernel's NVFP4 rule takes each block's
  amax, ue4m3 scale, encode scale and codes (``tests/test_nvfp4_fused.py``).
- ``outer_scaled_epilogue``: the float32 sum of an FP8 (tensor, row) or NVFP4 GEMM times
  ``outer_a * outer_b``, plus the bias, cast once, each rounding apart (FMA contraction off),
  where torch made three or four passes over a float32 output (``tests/test_gemm_epilogue.py``).
- ``transposed_codes``: ``codes.t().contiguous()`` by tiles; torch's byte transpose is a
  strided copy.

The quantize kernels' helper functions take offsets and values, never a pointer:
torch.compile's analysis of which arguments a user kernel writes takes a pointer handed to a
helper as written, and then copies that argument around every compiled call (measured on the
quantize: 0.161 against 0.066 ms). ``_mx_values``, which the dequantize and the fallback GEMM
share, still takes pointers; those kernels have not been timed under torch.compile.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from types import MappingProxyType
from typing import Any

import torch

from mxcheck.formats import FloatFormat, get_format
from mxcheck.hadamard import Hadamard

__all__ = ["dequantize_bf16", "gemm_f32_where_inexact", "nvfp4_quantize_blocks", "outer_scaled_epilogue",
           "quantize_blocks", "scaled_encode", "transposed_codes"]

_cache: dict[tuple[str, bool], Any] = {}
_BLOCK = 2048
# Elements per program and warps of the quantize kernel (benchmarks/bench_fused_configs.py
# measured these on an H200; the bits do not depend on them).
_QUANT_BLOCK = 2048
_QUANT_WARPS = 4
# Kernel constants: the scale rules and roundings mxcheck.scaling.rules / formats define.
_RULES = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3}
_ROUNDINGS = {"rne": 0, "half_away": 1, "trunc": 2, "sr": 3}
# The kernels encode OCP e4m3 / e5m2 under RNE with the hardware's fp8 cast (encode_scaled's
# HW_CAST; tools/h200/hw_fp8_cast_probe.py and the cuda tests show the same bits on an H200).
# False: the software encode everywhere (an A/B switch for the probe).
_HW_FP8_CAST = True
_HW_CAST_FORMATS = ("e4m3", "e5m2")  # Triton's float8e4nv and float8e5


def _hw_cast(fmt: FloatFormat, rounding: str, scales_given: bool = False) -> bool:
    """Whether a kernel encodes fmt with the hardware's fp8 cast: not under the interpreter
    (its cast does not round to nearest even), and not with given MX scales (only the
    interpreter tests cover those)."""
    return (_HW_FP8_CAST and rounding == "rne" and not scales_given and not _interpreted()
            and any(fmt == get_format(name) for name in _HW_CAST_FORMATS))


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


_FUSED_SWITCH = {"0": False, "1": True}


def fused_enabled() -> bool:
    """``MXCHECK_FUSED_MX``: unset or "1" runs the fused kernels where they can run, "0" the
    torch paths; anything else is an error (a silent default would make an A/B run compare a
    path with itself)."""
    value = os.environ.get("MXCHECK_FUSED_MX", "1")
    if value not in _FUSED_SWITCH:
        raise ValueError(f"MXCHECK_FUSED_MX={value!r}; expected '1' (the fused Triton kernels where they "
                         "can run, the default) or '0' (the torch paths)")
    return _FUSED_SWITCH[value]


def _runs_here(t: torch.Tensor) -> bool:
    return fused_enabled() and (t.is_cuda or _interpreted())


def _kernels() -> dict[str, Any] | None:
    key = ("kernels", _interpreted())
    if key in _cache:
        return _cache[key]
    try:
        import triton  # noqa: F401, PLC0415  (optional, CUDA only)
    except ImportError:
        _cache[key] = None
        return None
    # A fresh copy of the kernels' module per mode: triton.jit picks the interpreter when it
    # decorates (the key above).
    spec = importlib.util.find_spec("mxcheck.scaling.mx_cuda_kernels")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _cache[key] = {"dequantize": module.mx_dequant_bf16, "quantize": module.mx_quantize_blocks,
                   "scaled_encode": module.fp8_scaled_encode, "gemm_f32": module.mx_gemm_f32_where_inexact,
                   "epilogue": module.outer_scaled_epilogue,
                   "amax": module.blocks_amax, "transpose": module.transpose_bytes}
    return _cache[key]


def dequantize_bf16(codes: torch.Tensor, scales: torch.Tensor, table: torch.Tensor, block_size: int,
                    inexact: torch.Tensor | None = None, lowest_byte: int = 0,
                    magnitude_mask: int = 0, scale_table: torch.Tensor | None = None) -> torch.Tensor | None:
    """bf16 ``table[codes] * 2**(scales - 127)`` per ``block_size`` run of the last axis, or
    None when the kernel cannot run here (no Triton, not CUDA). ``inexact`` (int32, one
    element): set to 1 on the device where a code with a nonzero ``magnitude_mask`` part
    sits under a byte below ``lowest_byte`` (its value is not a bf16), with no host read.
    ``scale_table``: the scales are codes of this float32 table (NVFP4's ue4m3), not E8M0
    bytes; the float32 product is rounded to bf16 (exact where it has <= 8 significant bits)."""
    if not _runs_here(codes) or (kernels := _kernels()) is None:
        return None
    codes, scales = codes.contiguous(), scales.contiguous()
    k = codes.shape[-1]
    out = torch.empty(codes.shape, dtype=torch.bfloat16, device=codes.device)
    n = codes.numel()
    if n:  # without a flag, codes stand in for the pointer the kernel then does not touch
        table = table.to(torch.float32).contiguous()
        kernels["dequantize"][((n + _BLOCK - 1) // _BLOCK,)](
            codes, scales, table, table if scale_table is None else scale_table.to(torch.float32).contiguous(), out,
            codes if inexact is None else inexact, n, k, scales.shape[-1], MX_BLOCK=block_size, BLOCK=_BLOCK,
            LOWEST_BYTE=lowest_byte if inexact is not None else 0, MAGNITUDE_MASK=magnitude_mask,
            SCALE_TABLE=scale_table is not None)
    return out


# Output tiles of the float32 fallback GEMM: when nothing is flagged each program reads one
# int and returns (a 16384 x 9216 output is 9,216 programs).
_GEMM_TILE = (128, 128, 32)


def gemm_f32_where_inexact(inexact: torch.Tensor, a: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int],
                           b: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], y: torch.Tensor) -> bool:
    """Where ``inexact`` (set by ``dequantize_bf16``) is nonzero on the device, overwrite y
    (M, N; float32 or bf16) with ``A @ B^T`` from the exact float32 values, summed in float32;
    else leave it. a and b: (codes, scale bytes, float32 decode table, block size), NT. False
    where the kernel cannot run here."""
    if not _runs_here(y) or (kernels := _kernels()) is None:
        return False
    (ca, sa, ta, block_a), (cb, sb, tb, block_b) = a, b
    ca, sa, cb, sb = ca.contiguous(), sa.contiguous(), cb.contiguous(), sb.contiguous()
    m, n = y.shape
    bm, bn, bk = _GEMM_TILE
    if m and n:
        kernels["gemm_f32"][(-(-m // bm), -(-n // bn))](
            inexact, ca, sa, ta.to(torch.float32).contiguous(), cb, sb, tb.to(torch.float32).contiguous(), y, m, n,
            ca.shape[-1], cb.shape[-1], max(ca.shape[-1], cb.shape[-1]), sa.shape[-1], sb.shape[-1],
            BLOCK_A=block_a, BLOCK_B=block_b, BM=bm, BN=bn, BK=bk, num_warps=8)
    return True


# The kernels' constants are made once per format and rotation, not per call (a step
# quantizes ~60 times; tools/wrapper_costs.py times a quantize's Python without its launch).
# Read-only mappings, since every call shares them.

@functools.cache
def _element_args(fmt: FloatFormat) -> MappingProxyType[str, Any]:
    """The element format's constants the quantize and FP8 encode kernels share."""
    return MappingProxyType(dict(MBITS=fmt.mbits, EMIN=fmt.emin, FMAX=fmt.max, BITS=fmt.bits, FNUZ=fmt.nan == "fnuz",
                                 NAN_CODE=0 if fmt.nan_code is None else fmt.nan_code))


@functools.cache
def _quantize_element_args(fmt: FloatFormat) -> MappingProxyType[str, Any]:
    return MappingProxyType({**_element_args(fmt), "EMAX": fmt.emax})


@functools.cache
def _rotation_args(hadamard: Hadamard | None, block_size: int) -> MappingProxyType[str, Any] | None:
    """The kernels' rotation constants for a rotation they take (input and output rounding
    none or bf16; signs within a block), or None."""
    if hadamard is None:
        return MappingProxyType(dict(H_SIZE=1, H_LOG2=0, H_NORM=1.0, H_INPUT_BF16=False, H_SIGNS=0,
                                     H_OUTPUT_BF16=False))
    if (hadamard.round_input_to not in (None, torch.bfloat16) or hadamard.round_output_to not in (None, torch.bfloat16)
            or hadamard.size > _QUANT_BLOCK or (hadamard.signs is not None and hadamard.size > block_size)):
        return None
    signs = sum(1 << i for i, sign in enumerate(hadamard.signs or ()) if sign < 0)
    return MappingProxyType(dict(H_SIZE=hadamard.size, H_LOG2=hadamard.size.bit_length() - 1, H_NORM=hadamard.scale,
                                 H_INPUT_BF16=hadamard.round_input_to is not None, H_SIGNS=signs,
                                 H_OUTPUT_BF16=hadamard.round_output_to is not None))


def _block_layout(xs: torch.Tensor, block_size: int, block_2d: bool, h_size: int,
                  scales_given: bool) -> tuple[torch.Tensor, dict[str, Any], tuple[int]] | None:
    """(xs as the kernels read it, their layout arguments, the grid) for blocks of
    ``block_size`` along the last axis, or None for a layout they do not take."""
    rows = xs.numel() // xs.shape[-1] if xs.dim() else 1
    groups = max(1, _QUANT_BLOCK // block_size)
    # A program's blocks lie on consecutive rows (ROW_FASTEST) for 2D tiles and for a
    # transposed operand; a rotation must then stay inside a block.
    if block_2d and (scales_given or rows % block_size or groups % block_size or h_size > block_size):
        return None
    # 2D: read in place when the rows or the columns are contiguous (a transposed operand)
    transposed = xs.dim() == 2 and xs.stride(0) == 1 and xs.stride(1) != 1
    if xs.dim() != 2 or (xs.stride(1) != 1 and not (transposed and h_size <= block_size)):
        xs = xs.contiguous()
    row_fastest = block_2d or (xs.dim() == 2 and xs.stride(1) != 1)
    n_blocks = xs.numel() // block_size
    # the largest offset a program forms: into x through its strides, or into the outputs
    extent = xs.numel() if xs.is_contiguous() else max(
        xs.numel(), 1 + sum((size - 1) * stride for size, stride in zip(xs.shape, xs.stride(), strict=True)))
    args = dict(n_blocks=n_blocks, rows=rows, stride_row=xs.stride(0) if xs.dim() == 2 else xs.shape[-1],
                stride_col=xs.stride(-1) if xs.dim() else 1, ROW_FASTEST=row_fastest, MX_BLOCK=block_size,
                GROUPS=groups, CONTIGUOUS=not row_fastest and xs.is_contiguous(),
                WIDE=extent + groups * block_size >= 2**31)
    return xs, args, ((n_blocks + groups - 1) // groups,)


def quantize_blocks(xs: torch.Tensor, fmt: FloatFormat, *, block_size: int, scale_rule: str, zero_scale: int,
                    rounding: str, u: torch.Tensor | None, scales: torch.Tensor | None = None,
                    hadamard: Hadamard | None = None, block_2d: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(codes, scale bytes) of xs (..., C) in MX blocks of ``block_size`` along the last axis,
    as ``mx_quantize`` computes them, or None where the kernel cannot run. ``scales``
    (..., C / block_size), when given, are used instead of each block's own amax.
    ``block_2d``: block_size x block_size tiles over the last two axes share their amax (each
    row of a tile carries the tile's byte). ``u``: float64 uniforms shaped like xs, for SR.
    ``hadamard``: rotate each run of its size along the last axis first (not with scales)."""
    rotation = _rotation_args(hadamard, block_size)
    if (not _runs_here(xs) or block_size & (block_size - 1) or block_size > _QUANT_BLOCK or fmt.bits > 8
            or scale_rule not in _RULES or rounding not in _ROUNDINGS or rotation is None
            or (hadamard is not None and scales is not None) or (kernels := _kernels()) is None):
        return None
    layout = _block_layout(xs, block_size, block_2d, rotation["H_SIZE"], scales is not None)
    if layout is None:
        return None
    xs, args, grid = layout
    codes = torch.empty(xs.shape, dtype=torch.uint8, device=xs.device)
    out_scales = (torch.empty((*xs.shape[:-1], xs.shape[-1] // block_size), dtype=torch.uint8, device=xs.device)
                  if scales is None else scales.contiguous())
    if args["n_blocks"]:
        # Stand-ins for the NVFP4 pointers the kernel then does not touch: codes for the one
        # it writes in NVFP4 (torch.compile's mutation analysis of a user kernel may count it
        # as written, and an input counted so is copied first), xs for the one it reads.
        kernels["quantize"][grid](
            xs, xs if u is None else u.contiguous(), out_scales, codes, codes, xs, 0.0, **args,
            **_quantize_element_args(fmt), RULE=_RULES[scale_rule],
            ROUNDING=_ROUNDINGS[rounding], RAND_BITS=False, ZERO_SCALE=zero_scale, SCALES_GIVEN=scales is not None,
            TILE_ROWS=block_size if block_2d else 1, **rotation, HW_CAST=_hw_cast(fmt, rounding, scales is not None),
            num_warps=_QUANT_WARPS)
    return codes, out_scales


_NVFP4_BLOCK = 16


def nvfp4_quantize_blocks(x: torch.Tensor, element: FloatFormat, ue4m3_table: torch.Tensor, rcp_element_max: float,
                          *, block_2d: bool, hadamard: Hadamard | None,
                          rand: torch.Tensor | None) -> tuple[torch.Tensor, ...] | None:
    """(codes, block scale codes, amax, tensor scale) of a 2D x (rows, K) as
    ``nvfp4.nvfp4_quantize`` computes them, in two passes: the global amax (of the rotated
    tensor, with ``hadamard``), then the block scales and codes; or None where the kernels
    cannot run. ``ue4m3_table``: the float32 values of the block scale codes on x's device;
    ``rcp_element_max``: fl32(1/6); ``rand``: uint8 bits shaped like x for SR (float32
    uniforms are the torch path's: the kernel reads bits)."""
    rotation = _rotation_args(hadamard, _NVFP4_BLOCK)
    if (not _runs_here(x) or x.dim() != 2 or not x.numel() or rotation is None
            or (rand is not None and rand.dtype != torch.uint8) or (kernels := _kernels()) is None):
        return None
    layout = _block_layout(x, _NVFP4_BLOCK, block_2d, rotation["H_SIZE"], False)
    if layout is None:
        return None
    xs, args, grid = layout
    # [amax, tensor scale] as float32 bits: the amax pass takes an integer max over them
    global_bits = torch.zeros(2, dtype=torch.int32, device=x.device)
    kernels["amax"][grid](xs, global_bits, **args, **rotation, num_warps=_QUANT_WARPS)
    codes = torch.empty(xs.shape, dtype=torch.uint8, device=x.device)
    scales = torch.empty((xs.shape[0], xs.shape[1] // _NVFP4_BLOCK), dtype=torch.uint8, device=x.device)
    kernels["quantize"][grid](
        xs, xs if rand is None else rand.contiguous(), scales, codes, global_bits, ue4m3_table, rcp_element_max,
        **args, **_quantize_element_args(element), RULE=4,
        ROUNDING=_ROUNDINGS["rne" if rand is None else "sr"], RAND_BITS=True, ZERO_SCALE=0, SCALES_GIVEN=False,
        TILE_ROWS=_NVFP4_BLOCK if block_2d else 1, **rotation, num_warps=_QUANT_WARPS)
    amax, tensor_scale = global_bits.view(torch.float32)
    return codes, scales, amax, tensor_scale


_SCALED_ENCODE_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


def _scale_layout(scale: torch.Tensor, m: int, k: int, block_rows: int | None,
                  block_cols: int | None) -> tuple[int, int, int, int]:
    """(rows, cols, stride_r, stride_c) of the one indexing rule: x[row, col] takes the
    scale at ``(row // rows) * stride_r + (col // cols) * stride_c`` of the contiguous
    (M / rows, K / cols) scales; a dimension one scale spans (None) has stride 0."""
    rows, cols = block_rows or m, block_cols or k
    if m % rows or k % cols or scale.numel() != (m // rows) * (k // cols):
        raise ValueError(f"scale of shape {tuple(scale.shape)} does not tile x of shape ({m}, {k}) in blocks of "
                         f"(block_rows, block_cols)=({block_rows}, {block_cols}); expected "
                         f"{m // rows} x {k // cols} scales")
    return block_rows or 1, block_cols or 1, k // cols if block_rows else 0, 1 if block_cols else 0


def scaled_encode(x: torch.Tensor, scale: torch.Tensor, fmt: FloatFormat, block_rows: int | None,
                  block_cols: int | None, rand: torch.Tensor | None = None) -> torch.Tensor | None:
    """uint8 codes of ``float32(x) * scale`` (one float32 multiply), RNE and saturating, as
    ``fp8._encode_scaled`` computes them, or None where the kernel cannot run (the caller
    then takes the torch path). ``rand``: uint8 random bits shaped like x, on its device:
    stochastic rounding with u = rand / 256, as ``formats.encode_bits(..., "sr", u=...)``
    (float32 uniforms are the torch path's). x: float32, bf16 or fp16, (M, K) with a scale per
    ``(block_rows, block_cols)`` block (None: the whole dimension), or any shape with both
    None. scale: float32 >= 0 (every FP8 scale formula's), on x's device, or one value on the
    CPU (DelayedScaling's), passed to the kernel by value. Formats: signed, <= 8 bits."""
    if (not _runs_here(x) or x.dtype not in _SCALED_ENCODE_INPUTS or scale.dtype != torch.float32
            or not fmt.signed or fmt.bits > 8 or (rand is not None and rand.dtype != torch.uint8)
            or (kernels := _kernels()) is None):
        return None
    if block_rows is None and block_cols is None:
        x2 = x.reshape(1, -1)
    elif x.dim() == 2:
        x2 = x
    else:
        raise ValueError(f"x of shape {tuple(x.shape)}: a scale per (block_rows, block_cols) block needs a 2D x")
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    n = x.numel()
    if not n:
        return codes
    x2 = x2.contiguous()
    m, k = x2.shape
    rows, cols, stride_r, stride_c = _scale_layout(scale, m, k, block_rows, block_cols)
    # One scale on the host goes by value (a float32, exact as a Python float): no copy, no
    # sync; x stands in for the pointer the kernel then does not read.
    on_host = scale.device.type == "cpu" and scale.numel() == 1
    mode = 0 if on_host else 1 if scale.numel() == 1 else 2
    scale_ptr = x2 if on_host else scale.to(x.device).contiguous()
    if rand is not None and (rand.shape != x.shape or rand.device != x.device):
        raise ValueError(f"rand of shape {tuple(rand.shape)} on {rand.device}: expected x's shape {tuple(x.shape)} "
                         f"on {x.device}")
    kernels["scaled_encode"][((n + _BLOCK - 1) // _BLOCK,)](
        x2, scale_ptr, float(scale) if on_host else 0.0, x2 if rand is None else rand.contiguous(), codes, n, k,
        stride_r, stride_c, SCALE=mode, ROWS=rows, COLS=cols, ROUNDING=0 if rand is None else 3,
        **_element_args(fmt), NAN_SIGNED=fmt.nan in ("ocp", "ieee"), WIDE=n + _BLOCK >= 2**31, BLOCK=_BLOCK,
        HW_CAST=_hw_cast(fmt, "rne" if rand is None else "sr"))
    return codes


_EPILOGUE_OUTPUTS = (torch.float32, torch.bfloat16, torch.float16)


def outer_scaled_epilogue(acc: torch.Tensor, outer_a: torch.Tensor, outer_b: torch.Tensor, bias: torch.Tensor | None,
                          out_dtype: torch.dtype) -> torch.Tensor | None:
    """``((acc * (outer_a * outer_b^T)) + bias).to(out_dtype)`` in one pass, as ``gemm``'s
    torch epilogue computes it (each float32 multiply and add rounded apart: the kernel runs
    with FMA contraction off), or None where the kernel cannot run. acc: the (M, N) float32
    sum; outer_a: one float32 or (M, 1); outer_b: one float32 or (N, 1); bias: (N,), any
    float dtype (widened to float32 exactly)."""
    if (not _runs_here(acc) or acc.dtype != torch.float32 or acc.dim() != 2 or out_dtype not in _EPILOGUE_OUTPUTS
            or any(t.dtype != torch.float32 or t.device != acc.device for t in (outer_a, outer_b))
            or (kernels := _kernels()) is None):
        return None
    m, n_cols = acc.shape
    sa_per_row, sb_per_col = outer_a.numel() != 1, outer_b.numel() != 1
    if (sa_per_row and outer_a.numel() != m) or (sb_per_col and outer_b.numel() != n_cols):
        raise ValueError(f"outer scales of {outer_a.numel()} and {outer_b.numel()} values do not fit an output of "
                         f"shape {(m, n_cols)}: expected 1 or {m}, and 1 or {n_cols}")
    acc = acc.contiguous()
    out = torch.empty(acc.shape, dtype=out_dtype, device=acc.device)
    n = acc.numel()
    if n:  # acc stands in for the bias pointer the kernel then does not read
        kernels["epilogue"][((n + _BLOCK - 1) // _BLOCK,)](
            acc, outer_a.contiguous(), outer_b.contiguous(), acc if bias is None else bias.contiguous(), out, n,
            n_cols, SA_PER_ROW=sa_per_row, SB_PER_COL=sb_per_col, HAS_BIAS=bias is not None,
            WIDE=n + _BLOCK >= 2**31, BLOCK=_BLOCK, enable_fp_fusion=False)
    return out


_TRANSPOSE_TILE = 64


def transposed_codes(codes: torch.Tensor) -> torch.Tensor | None:
    """``codes.t().contiguous()`` of a 2D uint8 tensor in one tiled pass, or None where the
    kernel cannot run (torch's byte transpose is a strided copy, several times slower)."""
    if not _runs_here(codes) or codes.dtype != torch.uint8 or codes.dim() != 2 or (kernels := _kernels()) is None:
        return None
    codes = codes.contiguous()
    rows, cols = codes.shape
    out = torch.empty((cols, rows), dtype=torch.uint8, device=codes.device)
    if codes.numel():
        kernels["transpose"][(-(-rows // _TRANSPOSE_TILE), -(-cols // _TRANSPOSE_TILE))](
            codes, out, rows, cols, TILE=_TRANSPOSE_TILE)
    return out
