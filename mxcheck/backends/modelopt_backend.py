"""NVIDIA ModelOpt (``nvidia-modelopt`` 0.46.1 to 0.47.0, NVIDIA/Model-Optimizer) behind the
Backend protocol: the quantizers its export writes checkpoints with, on CPU, through its own
public classes.

``modelopt/torch/quantization/qtensor/``: each ``*QTensor.quantize`` returns the codes (a
``_quantized_data`` tensor) and the scales its checkpoint export stores, and ``dequantize``
reads them back:

* NVFP4 (``NVFP4_DEFAULT_CFG``): ``nvfp4_tensor.py::NVFP4QTensor.quantize(x, 16)`` -> fp4
  codes two a byte (low nibble the even index), float8_e4m3fn block scales and the float32
  ``weights_scaling_factor_2 = amax / 2688`` (the decode factor, ``NVFP4Tensor.tensor_scale``);
* MXFP8 (``MXFP8_DEFAULT_CFG``): ``mxfp8_tensor.py::MXFP8QTensor.quantize(x)`` -> float8_e4m3fn
  codes and E8M0 bytes, ``ceil(log2(amax / 448))`` (rceil);
* MXFP4 (``MXFP4_DEFAULT_CFG``): ``mxfp4_tensor.py::MXFP4QTensor.quantize(x, 32)`` -> fp4 codes
  two a byte and E8M0 bytes, ``ceil(log2(amax / 6))`` (rceil);
* FP8 per-tensor (``FP8_DEFAULT_CFG``): ``fp8_tensor.py::FP8QTensor.quantize(x)`` -> codes and
  ``amax / 448``.

``fake_quantize`` returns what ModelOpt computes for values on a CPU: for FP8 its QAT
fake-quant ``tensor_quant.py::scaled_e4m3(x, amax, None, 4, 3)`` (``fp8_eager``); for NVFP4 and
MX, whose QAT fake-quant (``dynamic_block_quant``) needs its CUDA extension, the
``dequantize`` of what ``quantize`` exported, in x's dtype.

``import modelopt.torch`` needs ``requests`` and ``huggingface_hub``, which 0.46.1 and 0.47.0
do not declare (a plain ``pip install nvidia-modelopt`` cannot import it);
``available()`` names the missing one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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

__all__ = ["CHECKED", "MODELOPT_CONFIGS", "ModelOptBackend"]

CHECKED = (">=0.46.1", "<0.48")  # the releases this adapter was run on (0.46.1, 0.47.0)
_QTENSOR = "modelopt.torch.quantization.qtensor"


@dataclass(frozen=True)
class _Export:
    """One configuration's quantizer: the QTensor class, the arguments after x, and
    ``(qtensor, scales...) -> what dequantize takes``."""

    qtensor: str
    args: tuple[Any, ...]
    dequantize_kwargs: Callable[..., dict[str, Any]]


_MXFP4 = Recipe("modelopt-mxfp4", **dict.fromkeys(OPERANDS, OperandSpec("e2m1", "mx", scale_rule="rceil")),
                source="NVIDIA/Model-Optimizer 0.47.0 modelopt/torch/quantization/qtensor/mxfp4_tensor.py::"
                       "MXFP4QTensor.quantize (ceil(log2(amax / 6)))")

# Config -> the recipe it claims; NVFP4 pinned to the registered profile of its conventions.
MODELOPT_CONFIGS: tuple[LibraryConfig, ...] = (
    LibraryConfig("NVFP4_DEFAULT_CFG", get_recipe("nvfp4-1x16").with_profile("modelopt.nvfp4")),
    LibraryConfig("MXFP8_DEFAULT_CFG", get_recipe("mxfp8")),
    LibraryConfig("MXFP4_DEFAULT_CFG", _MXFP4),
    LibraryConfig("FP8_DEFAULT_CFG", get_recipe("fp8-tensorwise")),
)
_EXPORTS = {
    "NVFP4_DEFAULT_CFG": _Export("NVFP4QTensor", (16,), lambda s, s2: {"scale": s, "double_scale": s2,
                                                                        "block_sizes": {-1: 16}}),
    "MXFP8_DEFAULT_CFG": _Export("MXFP8QTensor", (), lambda s: {"scale": s, "block_sizes": {-1: 32}}),
    "MXFP4_DEFAULT_CFG": _Export("MXFP4QTensor", (32,), lambda s: {"scale": s, "block_sizes": {-1: 32}}),
    "FP8_DEFAULT_CFG": _Export("FP8QTensor", (), lambda s: {"scale": s}),
}


class ModelOptBackend:
    """ModelOpt's NVFP4, MXFP8, MXFP4 and FP8 per-tensor quantizers (export codes, CPU values)."""

    name = "modelopt"
    device = "cpu"
    claims: tuple[Recipe, ...] = tuple(c.recipe for c in MODELOPT_CONFIGS)
    input_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)

    def available(self) -> tuple[bool, str]:
        return library_available("nvidia-modelopt", (CHECKED[0][2:], CHECKED[1][1:]), _QTENSOR)

    def supports(self, recipe: Recipe | str) -> tuple[bool, str]:
        return supports_every_copy("modelopt", "modelopt", MODELOPT_CONFIGS, recipe)

    def _config(self, x: Any, spec: OperandSpec) -> LibraryConfig:
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError("modelopt takes a 2D [rows, K] operand (K = the contraction axis), got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.dtype not in self.input_dtypes:
            raise TypeError(f"x.dtype={x.dtype}; expected one of {list(self.input_dtypes)}")
        return find_config("modelopt", MODELOPT_CONFIGS, spec)

    def _export(self, x: Any, spec: OperandSpec) -> tuple[str, Any, tuple[torch.Tensor, ...]]:
        """(config name, the QTensor, its scales) as ModelOpt's quantize returns them for x."""
        import importlib  # noqa: PLC0415

        config = self._config(x, spec)
        if spec.scaling != "tensor" and x.shape[1] % spec.block_size:
            raise Refusal(f"modelopt {config.name} views x as blocks of {spec.block_size}; got K={x.shape[1]}")
        export = _EXPORTS[config.name]
        qtensor, *scales = getattr(importlib.import_module(_QTENSOR), export.qtensor).quantize(
            x.contiguous(), *export.args)
        return config.name, qtensor, tuple(scales)

    def fake_quantize(self, x: torch.Tensor, spec: OperandSpec, *, state: object = None) -> torch.Tensor:
        """FP8: ModelOpt's QAT fake-quant (scaled_e4m3); NVFP4 / MX: dequantize of the export."""
        if self._config(x, spec).name == "FP8_DEFAULT_CFG":  # the one QAT fake-quant a CPU runs
            from modelopt.torch.quantization.tensor_quant import scaled_e4m3  # noqa: PLC0415
            from modelopt.torch.quantization.utils import reduce_amax  # noqa: PLC0415

            return scaled_e4m3(x, reduce_amax(x), None, 4, 3)
        name, qtensor, scales = self._export(x, spec)
        return qtensor.dequantize(x.dtype, **_EXPORTS[name].dequantize_kwargs(*scales))

    def quantize(self, x: torch.Tensor, spec: OperandSpec, *, state: object = None) -> Any:
        """The codes and scales ModelOpt's export writes."""
        _, qtensor, scales = self._export(x, spec)
        rows, k = x.shape
        fmt = get_format(spec.fmt)
        raw = qtensor._quantized_data.view(torch.uint8)
        codes = (unpack_fp4(raw) if fmt.bits == 4 else raw).reshape(rows, k)  # low nibble = even index
        amax = x.abs().amax().float()
        if spec.scaling == "nvfp4":
            block_scales, tensor_scale = scales
            return NVFP4Tensor(codes=codes, block_scales=block_scales.view(torch.uint8).reshape(rows, k // 16),
                               tensor_scale=tensor_scale.float().reshape(()), amax=amax)
        if spec.scaling == "mx":
            return MXTensor(codes=codes, scales=scales[0].reshape(rows, k // 32), fmt=fmt, block_size=32, axis=1,
                            shape=(rows, k), scale_rule=spec.scale_rule, rounding=spec.rounding,
                            zero_scale=spec.zero_scale)
        scale_inv = scales[0].float().reshape(())
        return FP8Tensor(codes=codes, scale_inv=scale_inv, fmt=fmt, granularity="tensor",
                         scale=torch.reciprocal(scale_inv), amax=amax)

    def dequantize(self, q: Any, spec: OperandSpec) -> torch.Tensor:
        """What ModelOpt's ``*QTensor.dequantize`` reads from an export in mxcheck's layout
        (``q`` as ``quantize`` returns it, from any library): codes repacked as its
        ``_quantized_data``, the scales as its export stores them; float32 values."""
        import importlib  # noqa: PLC0415

        name = find_config("modelopt", MODELOPT_CONFIGS, spec).name
        export = _EXPORTS[name]
        rows, k = q.codes.shape
        data = pack_fp4(q.codes) if get_format(spec.fmt).bits == 4 else q.codes.view(torch.float8_e4m3fn)
        qtensor = getattr(importlib.import_module(_QTENSOR), export.qtensor)(torch.Size((rows, k)), torch.float32, data)
        if spec.scaling == "nvfp4":
            scales = (q.block_scales.view(torch.float8_e4m3fn), q.tensor_scale)
        elif spec.scaling == "mx":
            scales = (q.scales if name == "MXFP8_DEFAULT_CFG" else q.scales.reshape(-1, 1),)
        else:
            scales = (q.scale_inv,)
        return qtensor.dequantize(torch.float32, **export.dequantize_kwargs(*scales))
