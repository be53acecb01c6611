"""compressed-tensors (0.20.0 to 0.20.1, vllm-project/compressed-tensors) behind the Backend
protocol: its preset schemes' quantizers, on CPU, through its own public functions.

Each configuration is a preset scheme's weight ``QuantizationArgs``
(``quantization/quant_scheme.py``: NVFP4, MXFP4, MXFP8A16, FP8), and the arguments are
computed as its observers and its dynamic activation path compute them:
``quantization/utils/helpers.py::generate_gparam`` (NVFP4's per-tensor global scale, from
the tensor's min and max in the tensor's own dtype) and ``compute_dynamic_scales_and_zp``
(per-group or per-tensor scales, ``calculate_qparams``). Then:

* ``fake_quantize``: ``quantization/lifecycle/forward.py::fake_quantize`` (values in x's dtype);
* ``quantize``: ``forward.py::quantize`` (the codes as grid values) and the export its
  compressors write: ``compressors/nvfp4/helpers.py::pack_fp4_to_uint8`` for e2m1 (two codes
  a byte, low nibble the even index), a cast to ``float8_e4m3fn`` for e4m3
  (``naive_quantized``), the block scales cast to ``float8_e4m3fn`` (NVFP4) or
  ``compressors/mx_utils.py::compress_mx_scale`` (MX: ``127 + floor(log2(scale))``).

compressed-tensors stores NVFP4's per-tensor *encode* factor (``global_scale = 2688 / amax``)
and dequantizes with ``scale / global_scale``; ``NVFP4Tensor.tensor_scale`` is the decode
factor, ``1 / global_scale`` in float32 here. Inputs are float32, bfloat16 or float16: the
library computes in the input's dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from mxcheck.backends.contract import Refusal
from mxcheck.backends.library_configs import (
    LibraryConfig,
    find_config,
    library_available,
    supports_every_copy,
)
from mxcheck.formats import get_format
from mxcheck.packing import pack_fp4, unpack_fp4
from mxcheck.recipes import OPERANDS, OperandSpec, Recipe, get_recipe
from mxcheck.scaling.fp8 import FP8Tensor
from mxcheck.scaling.mx import MXTensor
from mxcheck.scaling.nvfp4 import NVFP4Tensor

__all__ = ["CHECKED", "CT_CONFIGS", "CompressedTensorsBackend"]

CHECKED = (">=0.20", "<0.21")  # the releases this adapter was run on (0.20.0, 0.20.1)
_SOURCE = "vllm-project/compressed-tensors 0.20.1 quantization/quant_scheme.py"


def _mx(fmt: str, preset: str) -> Recipe:
    return Recipe(f"compressed-tensors-{preset.lower()}", **dict.fromkeys(
        OPERANDS, OperandSpec(fmt, "mx", scale_rule="even")),
                  source=f"{_SOURCE}::{preset} (generate_mx_scales: round_to_power_2, then floor(log2))")


# Preset scheme -> the recipe it claims. MX scales round the block amax to a power of two
# at e2m1's mantissa width (quantization/utils/mxfp_utils.py::generate_mx_scales), the even
# rule; MXFP8 uses the same width (only 6-bit elements take e2m3's), which mxcheck fits.
CT_CONFIGS: tuple[LibraryConfig, ...] = (
    LibraryConfig("NVFP4", get_recipe("nvfp4-1x16")),
    LibraryConfig("MXFP4", get_recipe("mxfp4-1x32")),
    LibraryConfig("MXFP8A16", _mx("e4m3", "MXFP8A16")),
    LibraryConfig("FP8", get_recipe("fp8-tensorwise")),
)


class CompressedTensorsBackend:
    """compressed-tensors' quantize / fake_quantize for its NVFP4, MXFP4, MXFP8 and FP8 presets."""

    name = "compressed_tensors"
    device = "cpu"
    claims: tuple[Recipe, ...] = tuple(c.recipe for c in CT_CONFIGS)
    input_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)

    def available(self) -> tuple[bool, str]:
        return library_available("compressed-tensors", (CHECKED[0][2:], CHECKED[1][1:]),
                                 "compressed_tensors.quantization")

    def supports(self, recipe: Recipe | str) -> tuple[bool, str]:
        return supports_every_copy("compressed_tensors", "compressed-tensors", CT_CONFIGS, recipe)

    @staticmethod
    def _preset(spec: OperandSpec) -> Any:
        from compressed_tensors.quantization import preset_name_to_scheme  # noqa: PLC0415

        config = find_config("compressed-tensors", CT_CONFIGS, spec)
        return config.name, preset_name_to_scheme(config.name, ["Linear"]).weights

    def _args(self, x: Any, spec: OperandSpec) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(QuantizationArgs, scale, zero point, global scale) as the library computes them for x."""
        from compressed_tensors.quantization.utils import (  # noqa: PLC0415
            compute_dynamic_scales_and_zp,
            generate_gparam,
        )

        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError("compressed_tensors takes a 2D [rows, K] operand (K = the contraction axis), got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.dtype not in self.input_dtypes:
            raise TypeError(f"x.dtype={x.dtype}; expected one of {list(self.input_dtypes)}")
        name, args = self._preset(spec)
        if args.group_size and x.shape[1] % args.group_size:
            raise Refusal(f"compressed-tensors {name} needs K a multiple of its group_size "
                          f"{args.group_size}; got K={x.shape[1]}")
        global_scale = generate_gparam(x.amin(), x.amax()) if spec.scaling == "nvfp4" else None
        scale, zero_point = compute_dynamic_scales_and_zp(x, args, module=None, global_scale=global_scale)
        return args, scale, zero_point, global_scale

    def fake_quantize(self, x: torch.Tensor, spec: OperandSpec, *, state: object = None) -> torch.Tensor:
        """``forward.fake_quantize``: x quantized and dequantized, in x's dtype."""
        from compressed_tensors.quantization.lifecycle.forward import fake_quantize  # noqa: PLC0415

        args, scale, zero_point, global_scale = self._args(x, spec)
        return fake_quantize(x, scale, zero_point, args, global_scale=global_scale)

    def quantize(self, x: torch.Tensor, spec: OperandSpec, *, state: object = None) -> Any:
        """The codes and scales compressed-tensors' compressors export."""
        from compressed_tensors.compressors.mx_utils import compress_mx_scale  # noqa: PLC0415
        from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8  # noqa: PLC0415
        from compressed_tensors.quantization.lifecycle.forward import quantize  # noqa: PLC0415

        args, scale, zero_point, global_scale = self._args(x, spec)
        grid = quantize(x, scale, zero_point, args, global_scale=global_scale)
        fmt = get_format(spec.fmt)
        # e2m1: the packer's bytes, unpacked (low nibble = even index, as mxcheck packs)
        codes = (unpack_fp4(pack_fp4_to_uint8(grid)) if fmt.bits == 4
                 else grid.to(torch.float8_e4m3fn).view(torch.uint8)).reshape(x.shape)
        rows, k = x.shape
        if spec.scaling == "nvfp4":
            return NVFP4Tensor(codes=codes, block_scales=scale.to(torch.float8_e4m3fn).view(torch.uint8)
                               .reshape(rows, k // 16), tensor_scale=torch.reciprocal(global_scale.float()).reshape(()),
                               amax=x.abs().amax().float())
        if spec.scaling == "mx":
            return MXTensor(codes=codes, scales=compress_mx_scale(scale, torch.uint8).reshape(rows, -1), fmt=fmt,
                            block_size=32, axis=1, shape=(rows, k), scale_rule=spec.scale_rule,
                            rounding=spec.rounding, zero_scale=spec.zero_scale)
        scale_inv = scale.float().reshape(())
        return FP8Tensor(codes=codes, scale_inv=scale_inv, fmt=fmt, granularity="tensor",
                         scale=torch.reciprocal(scale_inv), amax=x.abs().amax().float())

    def dequantize(self, q: Any, spec: OperandSpec) -> torch.Tensor:
        """What compressed-tensors' decompressors read from an export in mxcheck's layout
        (``q`` as ``quantize`` returns it, from any library): fp4 codes through
        ``unpack_fp4_from_uint8`` (bfloat16, its default), MX bytes through
        ``decompress_mx_scale`` (bfloat16), then ``forward.dequantize`` in the scale's dtype, as it
        decompresses. Its NVFP4 checkpoint holds the encode factor: ``global_scale = 1 / tensor_scale``."""
        from compressed_tensors.compressors.mx_utils import decompress_mx_scale  # noqa: PLC0415
        from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8  # noqa: PLC0415
        from compressed_tensors.quantization.lifecycle.forward import dequantize  # noqa: PLC0415

        _, args = self._preset(spec)
        rows, k = q.codes.shape
        x_q = (unpack_fp4_from_uint8(pack_fp4(q.codes), rows, k) if get_format(spec.fmt).bits == 4
               else q.codes.view(torch.float8_e4m3fn))
        global_scale = None
        if spec.scaling == "nvfp4":  # NVFP4PackedCompressor.decompress: the scale in the unpacked dtype
            scale = q.block_scales.view(torch.float8_e4m3fn).to(x_q.dtype)
            global_scale = torch.reciprocal(q.tensor_scale).reshape(1)
        elif spec.scaling == "mx":
            scale = decompress_mx_scale(q.scales)
        else:  # NaiveQuantizationCompressor: the float32 scale as stored
            scale = q.scale_inv.reshape(1)
        return dequantize(x_q, scale, args=args, global_scale=global_scale, dtype=scale.dtype)
