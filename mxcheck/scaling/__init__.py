"""The scaling layer: MX block scaling, NVFP4, and FP8 tensorwise/rowwise/blockwise/delayed."""

from mxcheck.scaling.fp8 import DelayedScaling, FP8Tensor, fp8_quantize
from mxcheck.scaling.mx import MXTensor, mx_quantize
from mxcheck.scaling.nvfp4 import NVFP4Tensor, nvfp4_quantize
from mxcheck.scaling.rules import SCALE_RULES

__all__ = [
    "SCALE_RULES",
    "DelayedScaling",
    "FP8Tensor",
    "MXTensor",
    "NVFP4Tensor",
    "fp8_quantize",
    "mx_quantize",
    "nvfp4_quantize",
]
