"""A fake ``brevitas`` package as strict as the released one, for CPU tests of the brevitas
adapter (``mxcheck.backends.brevitas_backend``).

What it models: brevitas 0.13.4 (the wheel on PyPI; 0.13.3 is identical in every file
below: the two releases differ only in export/manager.py, export/inference/manager.py and
nn/quant_mha.py). Files, in the wheel:

* ``brevitas/nn/quant_activation.py::QuantIdentity(act_quant=..., return_quant_tensor=False,
  **kwargs)``: a groupwise quantizer without ``group_dim`` raises ``RuntimeError("Cannot
  determine automatically group_dim for <class ...QuantIdentity>. Please specify")``
  (``quant/solver/act.py``); returns a ``GroupwiseFloatQuantTensor`` (``.value``, the
  dequantized tensor in the input's dtype) or, without ``return_quant_tensor``, a Tensor.
* ``brevitas/nn/quant_linear.py::QuantLinear(in_features, out_features, bias=True,
  weight_quant=..., ..., device=None, dtype=None, **kwargs)``; ``quant_weight()`` returns a
  ``FloatQuantTensor``.
* ``brevitas/quant/mx_quant_ocp.py::MXFloat8e4m3Act`` (group_size 32, power-of-two scale
  with ``FloorSte``, ``RuntimeDynamicGroupStatsScaling``), and ``Injector.let``.
* ``brevitas/quant/float_quant_ocp.py::Fp8e4m3OCPWeightPerTensorFloat``,
  ``Fp8e5m2OCPWeightPerTensorFloat`` (absmax / max, float scale).

Numerics, step by step as the released code computes them, every step in the input's dtype:
``dynamic_over_sub_channel_block_view`` pads K with zeros to a multiple of 32; the group
absmax is clamped to ``scaling_min_val = 1e-10`` (``quant/float_base.py``; 0 in float16);
MX scale = max(2^floor(log2 amax), 1e-10) / 2^floor(log2 max) (``core/scaling/runtime.py::
RuntimeDynamicGroupStatsScaling``: ``PowerOfTwoRestrictValue``, a ``torch.log2`` in the
input's dtype, then ``_RestrictClampValue`` clamps to 1e-10 again, so a block with amax
below 2^-33 gets a scale that is no power of two); FP8 per tensor scale = amax / max; then
``FloatQuant.quantize`` (``core/quant/float.py``): x / scale, internal scale
2^max(floor(log2(|x| + tiny)) - mbits, 1 - bias - mbits) (``utils/torch_utils.py::
float_internal_scale``, tiny = float32's), round half to even, saturate to the largest
value ``get_max_available_float`` leaves (``utils/float_quant_utils.py``), times scale.
``tests/test_fake_quant_adapters.py`` holds this fake to the released library where that is
installed.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.fakes.fake_aiter import _DistFinder

RELEASED = "0.13.4"
SCALING_MIN_VAL = 1e-10  # quant/float_base.py ScaledFloatActBase / FloatWeightBase
# (bit_width, exponent_bit_width, mantissa_bit_width) -> get_max_available_float under FpOCPMixin:
# e4m3 keeps mantissa 111 for NaN, e5m2 its top exponent for Inf/NaN, the others no specials.
MAX_AVAILABLE = {(4, 2, 1): 6.0, (6, 2, 3): 7.5, (6, 3, 2): 28.0, (8, 4, 3): 448.0, (8, 5, 2): 57344.0}


class Injector:
    """``dependencies.Injector``: a class of attributes; ``let`` a subclass with some replaced."""

    @classmethod
    def let(cls, **kwargs: Any) -> type:
        return type(cls.__name__, (cls,), kwargs)


class MXFloat8e4m3Act(Injector):
    bit_width, exponent_bit_width, mantissa_bit_width = 8, 4, 3
    group_size = 32
    groupwise = True


class _PerTensorWeight(Injector):
    groupwise = False


class Fp8e4m3OCPWeightPerTensorFloat(_PerTensorWeight):
    bit_width, exponent_bit_width, mantissa_bit_width = 8, 4, 3


class Fp8e5m2OCPWeightPerTensorFloat(_PerTensorWeight):
    bit_width, exponent_bit_width, mantissa_bit_width = 8, 5, 2


def _float_quant(x: torch.Tensor, scale: torch.Tensor, quant: type) -> torch.Tensor:
    """FloatQuant.forward after the scale: quantize, clamp, dequantize (core/quant/float.py)."""
    ebits, mbits = quant.exponent_bit_width, quant.mantissa_bit_width
    bias = 2 ** (ebits - 1) - 1
    top = MAX_AVAILABLE[quant.bit_width, ebits, mbits]
    scaled = x / scale
    internal = torch.exp2(torch.clamp_min(torch.floor(torch.log2(torch.abs(scaled) + torch.finfo(torch.float32).tiny))
                                          - mbits, 1.0 - bias - mbits))
    y = internal * torch.round(scaled / internal)
    return torch.clamp(y, -top, top) * scale


def _mx(x: torch.Tensor, quant: type) -> torch.Tensor:
    k, group = x.shape[-1], quant.group_size
    g = torch.nn.functional.pad(x, (0, -k % group)).unflatten(-1, (-1, group))
    amax = torch.clamp_min(g.abs().amax(-1, keepdim=True), SCALING_MIN_VAL)
    top = MAX_AVAILABLE[quant.bit_width, quant.exponent_bit_width, quant.mantissa_bit_width]
    threshold = torch.exp2(torch.floor(torch.log2(torch.tensor(top, dtype=x.dtype))))
    # _RestrictClampValue clamps again after the power of two: below 2^-33 the scale is 1e-10
    scale = torch.clamp_min(torch.exp2(torch.floor(torch.log2(amax))), SCALING_MIN_VAL) / threshold
    return _float_quant(g, scale, quant).flatten(-2)[..., :k]


class QuantTensor:
    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class QuantIdentity(torch.nn.Module):
    def __init__(self, act_quant: type | None = None, return_quant_tensor: bool = False, **kwargs: Any) -> None:
        super().__init__()
        if getattr(act_quant, "groupwise", False) and "group_dim" not in kwargs:
            raise RuntimeError(f"Cannot determine automatically group_dim for {type(self)}. Please specify")
        if kwargs.get("group_dim", -1) != -1:
            raise NotImplementedError("fake models group_dim=-1 only")
        self.act_quant, self.return_quant_tensor = act_quant, return_quant_tensor

    def forward(self, x: torch.Tensor) -> Any:
        value = _mx(x, self.act_quant)
        return QuantTensor(value) if self.return_quant_tensor else value


class QuantLinear(torch.nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool | None = True, weight_quant: type | None = None,
                 bias_quant: Any = None, input_quant: Any = None, output_quant: Any = None,
                 return_quant_tensor: bool = False, device: Any = None, dtype: torch.dtype | None = None,
                 **kwargs: Any) -> None:
        super().__init__(in_features, out_features, bias=bool(bias), device=device, dtype=dtype)
        self.weight_quant = weight_quant

    def quant_weight(self) -> QuantTensor:
        w = self.weight
        scale = torch.clamp_min(w.abs().amax(), SCALING_MIN_VAL) / MAX_AVAILABLE[
            self.weight_quant.bit_width, self.weight_quant.exponent_bit_width, self.weight_quant.mantissa_bit_width]
        return QuantTensor(_float_quant(w, scale, self.weight_quant))


def install(monkeypatch: pytest.MonkeyPatch, version: str = RELEASED) -> ModuleType:
    """Put the fake brevitas in sys.modules (and its version in importlib.metadata)."""
    quant = ModuleType("brevitas.quant")
    mx_quant_ocp = ModuleType("brevitas.quant.mx_quant_ocp")
    for cls in (MXFloat8e4m3Act, Fp8e4m3OCPWeightPerTensorFloat, Fp8e5m2OCPWeightPerTensorFloat):
        setattr(quant, cls.__name__, cls)
    mx_quant_ocp.MXFloat8e4m3Act = MXFloat8e4m3Act
    nn = ModuleType("brevitas.nn")
    nn.QuantIdentity, nn.QuantLinear = QuantIdentity, QuantLinear
    brevitas = ModuleType("brevitas")
    brevitas.__version__, brevitas.__path__ = version, []
    brevitas.nn, brevitas.quant = nn, quant
    for name, mod in {"brevitas": brevitas, "brevitas.nn": nn, "brevitas.quant": quant,
                      "brevitas.quant.mx_quant_ocp": mx_quant_ocp}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(sys, "meta_path", [_DistFinder(version, "brevitas"), *sys.meta_path])
    return brevitas

