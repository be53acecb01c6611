"""A fake ``modelopt`` as strict as ``nvidia-modelopt`` 0.47.0 (PyPI wheel, NVIDIA/Model-Optimizer),
for CPU tests of ``mxcheck.backends.modelopt_backend`` without the package.

What it models (``modelopt/torch/quantization/``), each with the real signature and CPU path:

* ``qtensor/nvfp4_tensor.py::NVFP4QTensor.quantize(input, block_size, ...)`` -> (qtensor,
  float8_e4m3fn block scales, float32 ``amax / 2688``): block scale ``block_amax / (6 * sf2)``
  in float32, 0 -> 1.0, clamped to [2^-9, 448] and cast; elements ``x / (s * sf2)`` rounded
  by ``_cast_fp4`` (``searchsorted`` on the bounds, ties to even) and packed with the odd
  index in the high nibble; ``dequantize(dtype, scale=, double_scale=, block_sizes=)``.
* ``qtensor/mxfp8_tensor.py::MXFP8QTensor.quantize(input)``: ``ceil(log2(amax / 448))`` in
  float32 (-127 where amax is not positive), clamped to [-127, 127]; ``x * 2^(127 - e)``
  clamped to +-448, cast to float8_e4m3fn.
* ``qtensor/mxfp4_tensor.py::MXFP4QTensor.quantize(input, block_size)``: ``ceil(max(log2(amax / 6),
  -127))``; each element's code is the number of bounds strictly below it (ties toward zero)
  and the sign bit ``(2 - sign(x)) // 2`` (1 for a zero).
* ``qtensor/fp8_tensor.py::FP8QTensor.quantize(input)``: ``scales = amax / 448`` and
  ``input / scales`` in the input's dtype, cast to float8_e4m3fn.
* ``tensor_quant.py::scaled_e4m3(inputs, amax, bias, E, M)`` on CPU (``fp8_eager``) and
  ``utils/core_utils.py::reduce_amax``.
* ``importlib.metadata.version("nvidia-modelopt")`` answers ``version``.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from tests.fakes.fake_aiter import _DistFinder, module_tree

RELEASED = "0.47.0"
_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5])
_E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])


class _QTensor:
    def __init__(self, shape: torch.Size, dtype: torch.dtype, data: torch.Tensor) -> None:
        self.metadata = {"shape": shape, "dtype": dtype}
        self._quantized_data = data


def _unpack(packed: torch.Tensor) -> torch.Tensor:
    out = torch.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=torch.long)
    out[..., 0::2], out[..., 1::2] = packed & 0x0F, packed >> 4
    return out


class NVFP4QTensor(_QTensor):
    @classmethod
    def _cast_fp4(cls, weight: torch.Tensor) -> torch.Tensor:
        sign_bit = (weight < 0).to(torch.uint8)
        weight_abs = weight.abs_()
        ordinal = torch.searchsorted(_BOUNDS, weight_abs, out_int32=True).to(torch.uint8)
        odd = torch.any(weight_abs.unsqueeze(-1) == _BOUNDS[[1, 3, 5]], dim=-1).to(torch.uint8)
        return (sign_bit << 3) + ordinal + odd

    @classmethod
    def quantize(cls, input: torch.Tensor, block_size: int, weights_scaling_factor=None,
                 weights_scaling_factor_2=None, keep_high_precision: bool = False, try_tensorrt: bool = False):
        assert input.shape[-1] % block_size == 0, "Weight shape is not divisible for block size"
        sf2 = input.abs().amax().float() / (6.0 * 448.0)
        per_block = input.view(*input.shape[:-1], -1, block_size).abs().amax(-1).float() / (6.0 * sf2)
        per_block[per_block == 0] = 1.0
        scale = per_block.clamp(min=2**-9, max=448.0).to(torch.float8_e4m3fn)
        scaled = input.view(*input.shape[:-1], -1, block_size) / (scale.to(torch.float32) * sf2).unsqueeze(-1)
        q = cls._cast_fp4(scaled.view(input.shape))
        return cls(input.shape, input.dtype, (q[..., 1::2] << 4) | q[..., 0::2]), scale, sf2

    def dequantize(self, dtype: torch.dtype | None = None, fast: bool = False, **kwarg) -> torch.Tensor:
        block = kwarg["block_sizes"][-1]
        values = _E2M1[_unpack(self._quantized_data)]
        out = values.view(*values.shape[:-1], -1, block) * (kwarg["scale"].to(torch.float32)
                                                             * kwarg["double_scale"]).unsqueeze(-1)
        return out.reshape(self.metadata["shape"]).to(dtype or self.metadata["dtype"])


def _e8m0_exponent(amax: torch.Tensor, elem_max: float, zero_floor: bool) -> torch.Tensor:
    descale = amax.float() / elem_max
    if zero_floor:  # MXFP8: -127 where the amax is not positive, then ceil and clamp
        return torch.clamp(torch.ceil(torch.where(descale > 0, torch.log2(descale), torch.tensor(-127.0))), -127, 127)
    return torch.ceil(torch.maximum(torch.log2(descale), torch.tensor(-127.0)))  # MXFP4


class MXFP8QTensor(_QTensor):
    @classmethod
    def quantize(cls, input: torch.Tensor, weights_scaling_factor: torch.Tensor | None = None):
        assert input.shape[-1] % 32 == 0, "Weight inner dimension must be divisible by MXFP8 block size (32)"
        blocks = input.view(*input.shape[:-1], -1, 32)
        scale = (_e8m0_exponent(blocks.abs().amax(-1), 448.0, True) + 127).to(torch.uint8)
        scaled = torch.clamp(blocks * torch.exp2(127 - scale.float()).unsqueeze(-1), -448.0, 448.0)
        return cls(input.shape, input.dtype, scaled.to(torch.float8_e4m3fn).view(input.shape)), scale

    def dequantize(self, dtype: torch.dtype | None = None, **kwarg) -> torch.Tensor:
        data = self._quantized_data.float()
        out = data.view(*data.shape[:-1], -1, 32) * torch.exp2(kwarg["scale"].float() - 127).unsqueeze(-1)
        return out.view(data.shape).to(dtype or self.metadata["dtype"])


class MXFP4QTensor(_QTensor):
    @classmethod
    def quantize(cls, input: torch.Tensor, block_size: int | None):
        block_size = block_size or 32
        blocks = input.view(-1, block_size)
        e8m0 = _e8m0_exponent(blocks.float().abs().max(dim=-1, keepdim=True).values, 6.0, False)
        scaled = (blocks / torch.exp2(e8m0)).view(input.shape)
        sign_bit = (2 - torch.sign(scaled)) // 2
        ordinal = torch.sum((scaled.abs().unsqueeze(-1) - _BOUNDS) > 0, dim=-1)
        q = (sign_bit * 0b1000 + ordinal).to(torch.uint8)
        packed = q[..., 1::2].clone() << 4
        packed += q[..., 0::2]
        return cls(input.shape, input.dtype, packed), (e8m0 + 127).to(torch.uint8)

    def dequantize(self, dtype: torch.dtype | None = None, **kwarg) -> torch.Tensor:
        block = kwarg["block_sizes"][-1]
        values = _E2M1[_unpack(self._quantized_data)].reshape(-1, block)
        out = values * torch.exp2(kwarg["scale"].float() - 127).reshape(-1, 1)
        return out.reshape(self.metadata["shape"]).to(dtype or self.metadata["dtype"])


class FP8QTensor(_QTensor):
    @classmethod
    def quantize(cls, input: torch.Tensor, scales: torch.Tensor | None = None, axis=None, block_sizes=None):
        if scales is None:
            scales = reduce_amax(input) / 448.0
        return cls(input.shape, input.dtype, (input / scales).to(torch.float8_e4m3fn)), scales

    def dequantize(self, dtype: torch.dtype | None = None, **kwarg) -> torch.Tensor:
        dtype = dtype or self.metadata["dtype"]
        return self._quantized_data.to(dtype) * kwarg["scale"].to(dtype)


def reduce_amax(input: torch.Tensor, axis=None, keepdims: bool = True, squeeze_scalar: bool = True) -> torch.Tensor:
    return torch.maximum(torch.abs(torch.max(input)), torch.abs(torch.min(input)))


def scaled_e4m3(inputs: torch.Tensor, amax: torch.Tensor, bias, E: int, M: int) -> torch.Tensor:
    if (E, M) != (4, 3):
        raise NotImplementedError("Only support E=4 & M=3 for now.")
    dtype, amax = inputs.dtype, amax.to(torch.float32)
    scale = 448.0 / torch.where(amax <= 1.0 / (1 << 24), torch.ones_like(amax), amax)
    x = (inputs.to(torch.float32) * scale).clamp(min=-448.0, max=448.0).to(torch.float8_e4m3fn)
    return (x.to(torch.float32) * (1 / scale)).to(dtype)


def install(mp: pytest.MonkeyPatch, *, version: str = RELEASED) -> SimpleNamespace:
    """Put the fake in sys.modules (undone with ``mp``)."""
    mods = module_tree(mp, "modelopt", "modelopt.torch", "modelopt.torch.quantization",
                       "modelopt.torch.quantization.qtensor", "modelopt.torch.quantization.tensor_quant",
                       "modelopt.torch.quantization.utils")
    mp.setattr(sys, "meta_path", [_DistFinder(version, "nvidia-modelopt"), *sys.meta_path])
    qtensor = mods["modelopt.torch.quantization.qtensor"]
    qtensor.NVFP4QTensor, qtensor.MXFP8QTensor = NVFP4QTensor, MXFP8QTensor
    qtensor.MXFP4QTensor, qtensor.FP8QTensor = MXFP4QTensor, FP8QTensor
    mods["modelopt.torch.quantization.tensor_quant"].scaled_e4m3 = scaled_e4m3
    mods["modelopt.torch.quantization.utils"].reduce_amax = reduce_amax
    return SimpleNamespace(**mods)
