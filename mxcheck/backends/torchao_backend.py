"""torchao's MX quantizer (``torchao.prototype.mx_formats.mx_tensor.to_mx``) behind the Backend
protocol: quantize only.

This backend has no ``gemm`` and no ``linear``: torchao's MX GEMMs dispatch through
``MXTensor`` subclass ops (or cuBLAS / CUTLASS kernels on sm100) rather than a
codes-and-scales call, so only its quantizer is checked here.

``to_mx(x, elem_dtype, 32, ScaleCalculationMode(rule))`` returns (E8M0 scales, data) with
1x32 blocks along the last axis, for rules floor, ceil, even and rceil; fp4 data is packed
two per byte, low nibble = even index; fp6 and fp8 hold one code per byte. It matches
mxcheck's ``mx_quantize`` except in blocks whose scale byte is 0 (torchao divides by
2**-126 for FLOOR and by 1.0 for RCEIL, see ``mxcheck.profiles`` torchao.floor /
torchao.rceil), which randn data never produces. 2D blocks, Hadamard rotations, stochastic
rounding and a non-zero ``zero_scale`` are not in torchao's quantizer, and quantize()
refuses them by name.
"""

from __future__ import annotations

from typing import Any

import torch

from mxcheck.backends import import_vendor
from mxcheck.formats import get_format
from mxcheck.recipes import OPERANDS, OperandSpec, Recipe, get_recipe
from mxcheck.scaling.mx import MXTensor

__all__ = ["TORCHAO_DTYPES", "TORCHAO_SCALE_RULES", "TorchaoBackend"]

# mxcheck element format -> torchao elem_dtype (a torch dtype name, else torchao's string constant)
TORCHAO_DTYPES = {"e2m1": "float4_e2m1fn_x2", "e2m3": "fp6_e2m3", "e3m2": "fp6_e3m2",
                  "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
TORCHAO_SCALE_RULES = ("floor", "ceil", "even", "rceil")  # torchao ScaleCalculationMode values
_INPUTS = (torch.float32, torch.bfloat16)


def spec_refusal(spec: OperandSpec) -> str | None:
    """Why torchao's to_mx cannot produce what ``spec`` asks for, or None."""
    if spec.scaling != "mx":
        return f"torchao to_mx makes MX blocks; spec has scaling={spec.scaling!r}"
    if spec.fmt not in TORCHAO_DTYPES:
        return f"torchao to_mx takes {sorted(TORCHAO_DTYPES)}, not fmt={spec.fmt!r}"
    if spec.block_size != 32:
        return f"torchao to_mx is wired here for 32-blocks, spec has block_size={spec.block_size}"
    if spec.block_2d:
        return "torchao to_mx has no 2D (32x32) blocks; spec has block_2d=True"
    if spec.hadamard is not None:
        return f"torchao to_mx applies no Hadamard rotation; spec has hadamard={spec.hadamard!r}"
    if spec.rounding != "rne":
        return f"torchao to_mx rounds to nearest even only; spec has rounding={spec.rounding!r}"
    if spec.zero_scale != 0:
        return (f"torchao to_mx gives an all-zero block scale byte 0; spec has zero_scale={spec.zero_scale}")
    if spec.scale_rule not in TORCHAO_SCALE_RULES:
        return (f"torchao ScaleCalculationMode has {list(TORCHAO_SCALE_RULES)}; spec has "
                f"scale_rule={spec.scale_rule!r}")
    return None


class TorchaoBackend:
    """torchao's ``to_mx`` MX quantizer (quantize only; no gemm, no linear)."""

    name = "torchao"

    def available(self) -> tuple[bool, str]:
        why = import_vendor("torchao.prototype.mx_formats.mx_tensor")
        return why is None, why or ""

    def supports(self, recipe: Recipe | str) -> tuple[bool, str]:
        """Every operand 1x32 MX with a scale rule torchao has, RNE, no rotation, zero_scale 0."""
        r = get_recipe(recipe)
        for op in OPERANDS:
            if (why := spec_refusal(r.spec(op))) is not None:
                return False, f"torchao: recipe {r.name} {op}: {why}"
        return True, ""

    def quantize(self, x: torch.Tensor, spec: OperandSpec) -> MXTensor:
        """Quantize the NT operand x [rows, K] along K (the last axis) with torchao's to_mx."""
        if (why := spec_refusal(spec)) is not None:
            raise ValueError(why)
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError("torchao quantize takes a 2D [rows, K] operand (K = the contraction axis), got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.dtype not in _INPUTS:
            raise TypeError(f"x.dtype={x.dtype}; torchao to_mx takes float32 or bfloat16")
        from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: PLC0415
        from torchao.prototype.mx_formats.mx_tensor import to_mx  # noqa: PLC0415

        rows, k = x.shape
        xs = x.contiguous()
        if spec.pad_to is not None and k % spec.pad_to:
            # zero columns: whole zero blocks (byte 0, codes 0) where mx_quantize pads too
            xs = torch.nn.functional.pad(xs, (0, -k % spec.pad_to))
        if xs.shape[1] % 32:
            raise ValueError(f"x dim 1 (K) = {k} is not a multiple of 32 and spec has no pad_to; "
                             "torchao to_mx needs whole 32-blocks")
        name = TORCHAO_DTYPES[spec.fmt]
        elem_dtype: Any = getattr(torch, name, name)
        scale, data = to_mx(xs, elem_dtype, 32, ScaleCalculationMode(spec.scale_rule))
        raw = data.view(torch.uint8)
        if spec.fmt == "e2m1":  # two per byte, low nibble = even index
            codes = torch.stack([raw & 0xF, raw >> 4], dim=-1).reshape(xs.shape)
        else:
            codes = raw.reshape(xs.shape)
        scales = scale.view(torch.uint8).reshape(rows, -1)
        return MXTensor(codes=codes.contiguous(), scales=scales.contiguous(), fmt=get_format(spec.fmt),
                        block_size=32, axis=1, shape=(rows, k), scale_rule=spec.scale_rule,
                        rounding=spec.rounding, zero_scale=spec.zero_scale)
