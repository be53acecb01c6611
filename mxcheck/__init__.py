"""mxcheck: oracles and a harness for low-precision (MX, NVFP4, FP8) training numerics.

The names here are the public oracle API of DESIGN.md, a stable contract.
"""

from mxcheck.formats import FORMATS, FloatFormat, cast, decode, encode, get_format
from mxcheck.hadamard import Hadamard, apply_hadamard, hadamard_matrix
from mxcheck.metrics import snr_db
from mxcheck.scaling import (
    DelayedScaling,
    FP8Tensor,
    MXTensor,
    NVFP4Tensor,
    fp8_quantize,
    mx_quantize,
    nvfp4_quantize,
)

__version__ = "0.1.0"

__all__ = [
    "FORMATS",
    "DelayedScaling",
    "FP8Tensor",
    "FloatFormat",
    "Hadamard",
    "MXTensor",
    "NVFP4Tensor",
    "__version__",
    "apply_hadamard",
    "cast",
    "decode",
    "encode",
    "fp8_quantize",
    "get_format",
    "hadamard_matrix",
    "mx_quantize",
    "nvfp4_quantize",
    "snr_db",
]
