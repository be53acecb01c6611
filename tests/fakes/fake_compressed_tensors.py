"""A fake ``compressed_tensors`` as strict as release 0.20.1 (PyPI wheel, vllm-project/compressed-tensors),
for CPU tests of ``mxcheck.backends.compressed_tensors_backend`` without the package.

What it models, each function with the real one's signature and CPU path:

* ``quantization/quant_scheme.py::preset_name_to_scheme`` (KeyError for an unknown name) and
  the weight ``QuantizationArgs`` of presets NVFP4 (TENSOR_GROUP, group 16, scale
  float8_e4m3fn), MXFP4 / MXFP8A16 (GROUP, group 32, scale uint8) and FP8 (TENSOR).
* ``quantization/utils/helpers.py::generate_gparam``: ``2688 / max(|min|, |max|, tiny)`` in
  the dtype of the min / max it is given, NaN / Inf replaced by 1.0, cast to float32, shape [1].
* ``helpers.py::compute_dynamic_scales_and_zp`` and ``calculate_qparams``: per-group amax in
  the value's dtype; MX: ``utils/mxfp_utils.py::generate_mx_scales`` (``round_to_power_2``
  at e2m1's mantissa width, ``127 + floor(log2) - offset``), rounded to uint8 and turned back
  into ``2 ** (e - 127)`` in the value's dtype; others ``amax / 6`` (fp4) or ``amax / 448``
  (fp8), times the global scale, rounded to float8_e4m3fn; a 0 scale becomes the scale
  dtype's eps (0.125 for float8_e4m3fn, 1 for uint8).
* ``quantization/lifecycle/forward.py::quantize`` / ``fake_quantize``: ``x / (scale / gs)``
  clamped to the format's range and rounded (fp4: ``utils/fp4_utils.py::cast_to_fp4``, CPU
  thresholds, ties to even; fp8: a float8_e4m3fn cast), in x's dtype; ``fake_quantize``
  multiplies back by the scale.
* ``compressors/nvfp4/helpers.py::pack_fp4_to_uint8`` (2D, even columns: ValueError
  otherwise; low nibble = even index) and ``compressors/mx_utils.py::compress_mx_scale``.
* What its decompressors read back: ``forward.py::dequantize`` (``x_q * (scale / gs)`` in the
  scale's dtype, then ``dtype``), ``compressors/nvfp4/helpers.py::unpack_fp4_from_uint8``
  (bfloat16 by default) and ``compressors/mx_utils.py::decompress_mx_scale`` (bfloat16).
* ``importlib.metadata.version("compressed-tensors")`` answers ``version``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from tests.fakes.fake_aiter import _DistFinder, module_tree

RELEASED = "0.20.1"
_FP4_MAX, _FP8_MAX = 6.0, 448.0


@dataclass
class QuantizationArgs:
    num_bits: int
    strategy: str  # "tensor_group", "group", "tensor"
    group_size: int | None = None
    scale_dtype: torch.dtype | None = None
    type: str = "float"
    symmetric: bool = True


_PRESETS = {
    "NVFP4": QuantizationArgs(4, "tensor_group", 16, torch.float8_e4m3fn),
    "MXFP4": QuantizationArgs(4, "group", 32, torch.uint8),
    "MXFP8A16": QuantizationArgs(8, "group", 32, torch.uint8),
    "FP8": QuantizationArgs(8, "tensor"),
}


def preset_name_to_scheme(name: str, targets: list[str]) -> SimpleNamespace:
    if name.upper() not in _PRESETS:
        raise KeyError(f"Unknown preset scheme name {name}, available names: {list(_PRESETS)}")
    return SimpleNamespace(targets=targets, weights=_PRESETS[name.upper()])


def generate_gparam(updated_min_val: torch.Tensor, updated_max_val: torch.Tensor, scale_data=None, quant_data=None,
                    dtype: torch.dtype | None = torch.float32) -> torch.Tensor:
    max_val_pos = torch.max(torch.min(updated_min_val, torch.zeros_like(updated_min_val)).abs(),
                            torch.max(updated_max_val, torch.zeros_like(updated_max_val)).abs())
    max_val_pos = torch.clamp(max_val_pos, min=torch.finfo(max_val_pos.dtype).tiny)
    global_scale = _FP8_MAX * _FP4_MAX / max_val_pos
    return torch.nan_to_num(global_scale, nan=1.0, posinf=1.0, neginf=1.0).to(dtype).reshape([1])


def _round_to_power_2(x: torch.Tensor, elem_mantissa: int = 1) -> torch.Tensor:
    mantissa, exponent, int_dtype = {torch.bfloat16: (7, 8, torch.uint16), torch.float16: (10, 5, torch.uint16),
                                     torch.float32: (23, 8, torch.uint32)}[x.dtype]
    bits = x.view(int_dtype).to(torch.int32)
    masked = torch.bitwise_and(bits + (1 << (mantissa - elem_mantissa - 1)), ((1 << (exponent + 1)) - 1) << mantissa)
    return masked.to(int_dtype).view(x.dtype) if int_dtype is torch.uint16 else masked.view(x.dtype)


def _eps(dtype: torch.dtype) -> float:
    if dtype == torch.float8_e4m3fn:
        return 0.125
    return torch.finfo(dtype).eps if dtype.is_floating_point else 1


def calculate_qparams(min_vals, max_vals, args: QuantizationArgs, global_scale=None):
    max_val_pos = torch.max(torch.min(min_vals, torch.zeros_like(min_vals)).abs(),
                            torch.max(max_vals, torch.zeros_like(max_vals)).abs())
    mx = args.num_bits in (4, 6, 8) and args.group_size == 32 and args.scale_dtype == torch.uint8
    if mx:
        scales = 127 + torch.floor(torch.log2(_round_to_power_2(max_val_pos))) - {4: 2, 8: 8}[args.num_bits]
    else:
        scales = max_val_pos / (_FP4_MAX if args.num_bits == 4 else _FP8_MAX)
    if global_scale is not None:
        scales = global_scale * scales
    if args.scale_dtype is not None:
        low, high = ((torch.finfo(args.scale_dtype).min, torch.finfo(args.scale_dtype).max)
                     if args.scale_dtype.is_floating_point else (0, 255))
        clamped = torch.clamp(scales, low, high)
        rounded = clamped.to(args.scale_dtype) if args.scale_dtype.is_floating_point else torch.round(clamped).to(
            args.scale_dtype)
        scales = rounded.to(scales.dtype)
    if mx:
        scales = (2.00 ** ((scales.to(torch.int32) - 127).to(torch.float))).to(scales.dtype)
    eps = _eps(args.scale_dtype if args.scale_dtype is not None else scales.dtype)
    scales = torch.where(scales == 0, torch.tensor(eps, dtype=scales.dtype), scales)
    zero_points = torch.zeros(scales.shape, dtype=min_vals.dtype)
    return (scales.reshape(1), zero_points.reshape(1)) if scales.ndim == 0 else (scales, zero_points)


def compute_dynamic_scales_and_zp(value: torch.Tensor, args: QuantizationArgs, module: torch.nn.Module,
                                  global_scale: torch.Tensor | None = None):
    if args.strategy == "tensor":
        return calculate_qparams(*torch.aminmax(value), args, global_scale=global_scale)
    if args.strategy not in ("group", "tensor_group"):
        raise ValueError(f"Dynamic quantization is only supported for tensor, group, tensor_group: {args.strategy}")
    grouped = value.unflatten(-1, (math.ceil(value.shape[-1] / args.group_size), args.group_size))
    return calculate_qparams(grouped.amin(-1), grouped.amax(-1), args, global_scale=global_scale)


def _cast_to_fp4(x: torch.Tensor) -> torch.Tensor:
    sign, x = torch.sign(x), torch.abs(x)
    x[(x >= 0.0) & (x <= 0.25)] = 0.0
    x[(x > 0.25) & (x < 0.75)] = 0.5
    x[(x >= 0.75) & (x <= 1.25)] = 1.0
    x[(x > 1.25) & (x < 1.75)] = 1.5
    x[(x >= 1.75) & (x <= 2.5)] = 2.0
    x[(x > 2.5) & (x < 3.5)] = 3.0
    x[(x >= 3.5) & (x <= 5.0)] = 4.0
    x[x > 5.0] = 6.0
    return x * sign


def _process(x, scale, args, global_scale, dequantize: bool, dtype: torch.dtype | None = None) -> torch.Tensor:
    if args.strategy != "tensor":
        if x.shape[-1] % args.group_size:
            raise ValueError(f"tensor column shape must be divisble by the given group_size {args.group_size}")
        out_dtype = dtype or x.dtype
        x, scale = x.unflatten(-1, (x.shape[-1] // args.group_size, args.group_size)), scale.unsqueeze(-1)
    if global_scale is not None:
        scale = scale / global_scale
    limit = _FP4_MAX if args.num_bits == 4 else _FP8_MAX
    scaled = torch.clamp(x / scale, -limit, limit)
    grid = (_cast_to_fp4(scaled) if args.num_bits == 4 else scaled.to(torch.float8_e4m3fn)).to(scaled.dtype)
    out = grid.to(scale.dtype) * scale if dequantize else (grid.to(dtype) if dtype is not None else grid)
    return out.flatten(start_dim=-2).to(out_dtype) if args.strategy != "tensor" else out


def quantize(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, args: QuantizationArgs,
             dtype: torch.dtype | None = None, global_scale: torch.Tensor | None = None) -> torch.Tensor:
    return _process(x, scale, args, global_scale, dequantize=False, dtype=dtype)


def fake_quantize(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, args: QuantizationArgs,
                  global_scale: torch.Tensor | None = None) -> torch.Tensor:
    return _process(x, scale, args, global_scale, dequantize=True)


def dequantize(x_q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None,
               args: QuantizationArgs | None = None, dtype: torch.dtype | None = None,
               global_scale: torch.Tensor | None = None) -> torch.Tensor:
    if args is None:
        raise ValueError("Infering qargs from shape is no longer supported")
    dtype = dtype or scale.dtype
    if args.strategy != "tensor":
        x_q, scale = x_q.unflatten(-1, (x_q.shape[-1] // args.group_size, args.group_size)), scale.unsqueeze(-1)
    if global_scale is not None:
        scale = scale / global_scale
    out = (x_q.to(scale.dtype) * scale).to(dtype)
    return out.flatten(start_dim=-2).to(dtype) if args.strategy != "tensor" else out


def unpack_fp4_from_uint8(a: torch.Tensor, m: int, n: int, dtype: torch.dtype | None = torch.bfloat16) -> torch.Tensor:
    assert a.dtype == torch.uint8
    nibbles = torch.stack(((a.flatten() & 0x0F), (a.flatten() & 0xF0) >> 4), dim=1).flatten()
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])[(nibbles & 0x07).long()]
    return (values * torch.where((nibbles & 0x08).bool(), -1.0, 1.0)).reshape(m, n).to(dtype=dtype)


def decompress_mx_scale(scale: torch.Tensor) -> torch.Tensor:
    return 2.0 ** (scale.to(torch.int32) - 127).to(torch.bfloat16)


def pack_fp4_to_uint8(x: torch.Tensor) -> torch.Tensor:
    m, n = x.shape  # a ValueError for anything but 2D, as the real unpacking
    if n % 2 != 0:
        raise ValueError("tensor must have an even number of columns for nvfp4 compression")
    sign = torch.signbit(x).to(torch.uint8)
    doubled = (x * 2).to(torch.int8).abs_()
    indices = torch.zeros_like(doubled, dtype=torch.uint8)
    for twice, index in ((1, 1), (2, 2), (3, 3), (4, 4), (6, 5), (8, 6)):
        indices[doubled == twice] = index
    indices[doubled >= 12] = 7
    pairs = (indices | (sign << 3)).reshape(-1, 2)
    return (pairs[:, 0] | (pairs[:, 1] << 4)).reshape(m, n // 2)


def compress_mx_scale(scale: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    return (127 + torch.floor(torch.log2(scale)).to(torch.int32)).to(scale_dtype)


def install(mp: pytest.MonkeyPatch, *, version: str = RELEASED) -> SimpleNamespace:
    """Put the fake in sys.modules (undone with ``mp``)."""
    mods = module_tree(mp, "compressed_tensors", "compressed_tensors.quantization",
                       "compressed_tensors.quantization.utils", "compressed_tensors.quantization.lifecycle",
                       "compressed_tensors.quantization.lifecycle.forward", "compressed_tensors.compressors",
                       "compressed_tensors.compressors.mx_utils", "compressed_tensors.compressors.nvfp4",
                       "compressed_tensors.compressors.nvfp4.helpers")
    mp.setattr(sys, "meta_path", [_DistFinder(version, "compressed-tensors"), *sys.meta_path])
    mods["compressed_tensors.quantization"].preset_name_to_scheme = preset_name_to_scheme
    utils = mods["compressed_tensors.quantization.utils"]
    utils.generate_gparam, utils.compute_dynamic_scales_and_zp = generate_gparam, compute_dynamic_scales_and_zp
    forward = mods["compressed_tensors.quantization.lifecycle.forward"]
    forward.quantize, forward.fake_quantize, forward.dequantize = quantize, fake_quantize, dequantize
    mx_utils = mods["compressed_tensors.compressors.mx_utils"]
    mx_utils.compress_mx_scale, mx_utils.decompress_mx_scale = compress_mx_scale, decompress_mx_scale
    helpers = mods["compressed_tensors.compressors.nvfp4.helpers"]
    helpers.pack_fp4_to_uint8, helpers.unpack_fp4_from_uint8 = pack_fp4_to_uint8, unpack_fp4_from_uint8
    return SimpleNamespace(**mods)
