"""A fake ``quark`` (AMD Quark, ``amd-quark``) as strict as the released one, for CPU tests of
the Quark adapter (``mxcheck.backends.quark_backend``).

What it models: amd-quark 0.13 (the wheel on PyPI; 0.12.post1 has the same classes and
signatures below). Files, in the wheel:

* ``quark/torch/quantization/config/config.py``: ``OCP_MXFP8E4M3Spec``, ``OCP_MXFP8E5M2Spec``,
  ``OCP_MXFP6E2M3Spec``, ``OCP_MXFP6E3M2Spec``, ``OCP_MXFP4Spec`` (``ch_axis`` required,
  ``is_dynamic=True``, ``scale_calculation_mode="even"``), ``FP8E4M3PerTensorSpec``
  (``observer_method="min_max"``, ``scale_type=None``, ``is_dynamic=False``),
  ``FP4PerGroupSpec(ch_axis, group_size, scale_format="float32", scale_calculation_mode=None,
  is_dynamic=True, scale_type="float")``, ``ScaleQuantSpec(first_stage, second_stage)``:
  dataclasses (a missing or unknown keyword is a TypeError); ``to_quantization_spec()`` a
  config (a list for ScaleQuantSpec).
* ``quark/torch/quantization/tensor_quantize.py::FakeQuantizeBase.get_fake_quantize(spec)``:
  ``SequentialQuantize`` for a list, ``DynamicScaledFakeQuantize`` for a dynamic spec, else
  ``StaticScaledFakeQuantize``; a dynamic MXFP4 "even" module sends float16 and bfloat16 to
  ``mx.qdq_mxfp4``, which raises ``RuntimeError("qdq_mxfp4 is only implemented in CUDA
  devices!")`` on a CPU tensor (``quark/torch/kernel/__init__.py``).

Numerics (``quantization/observer/observer.py::get_scale``, ``quantization/utils.py::
even_round``): MX "even" rounds the group amax's float32 bits up at the element's mantissa
width and takes 2^(floor(log2) - emax) clamped to [2^-127, 2^127]; "floor" is
``torch.pow(2, torch.floor(torch.log2(amax)) - emax)`` in the input's dtype (a zero scale
replaced by float32 eps); FP8 per tensor: amax / 448 in the input's dtype, a zero scale
replaced by eps. Elements (``kernel/hw_emulation/csrc/mx/funcs.cuh::fake_quantize_element``):
x / scale rounded to nearest even and saturated (mxcheck's ``cast``), Inf and NaN passed
through, every e2m1 zero +0; times scale. NVFP4: block scale amax / 6 fake-quantized to e4m3
with the tensor scale amax / (6 * 448), all in float32, a zero scale replaced by float32 eps
where it is divided by (the block scale of 0 still multiplies the values back): bit-exact with
0.13 on every float32 input family. An MX "even" block holding Inf or NaN is not
modelled either (tests/test_fake_quant_adapters.py QUARK_HELD says what is held).
``tests/test_fake_quant_adapters.py`` holds this fake to the released library where that is
installed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from mxcheck.formats import cast
from tests.fakes.fake_aiter import _DistFinder

RELEASED = "0.13"
EPS = torch.finfo(torch.float32).eps
EMAX = {"e4m3": 8, "e5m2": 15, "e2m3": 2, "e3m2": 4, "e2m1": 2}  # utils.py get_dtype_params
MBITS = {"e4m3": 3, "e5m2": 2, "e2m3": 3, "e3m2": 2, "e2m1": 1}


def _mx_spec(fmt: str) -> type:
    @dataclass
    class OCPMXSpec:
        ch_axis: int
        is_dynamic: bool = True
        scale_calculation_mode: str = "even"

        def to_quantization_spec(self) -> SimpleNamespace:
            return SimpleNamespace(kind="mx", fmt=fmt, ch_axis=self.ch_axis, is_dynamic=self.is_dynamic,
                                   scale_calculation_mode=self.scale_calculation_mode, group_size=32)
    return OCPMXSpec


@dataclass
class FP8E4M3PerTensorSpec:
    observer_method: str | None = "min_max"
    scale_type: str | None = None
    is_dynamic: bool | None = False

    def to_quantization_spec(self) -> SimpleNamespace:
        return SimpleNamespace(kind="fp8", fmt="e4m3", is_dynamic=self.is_dynamic, scale_type=self.scale_type)


@dataclass
class FP4PerGroupSpec:
    ch_axis: int
    group_size: int
    scale_format: str | None = "float32"
    scale_calculation_mode: str | None = None
    is_dynamic: bool | None = True
    scale_type: str | None = "float"

    def to_quantization_spec(self) -> SimpleNamespace:
        return SimpleNamespace(kind="fp4-group", fmt="e2m1", group_size=self.group_size, is_dynamic=self.is_dynamic)


@dataclass
class ScaleQuantSpec:
    first_stage: Any
    second_stage: Any

    def to_quantization_spec(self) -> list[SimpleNamespace]:
        return [self.first_stage.to_quantization_spec(), self.second_stage.to_quantization_spec()]


def _even_scale(amax: torch.Tensor, fmt: str) -> torch.Tensor:
    bits = (amax.float().view(torch.int32) + (1 << (23 - MBITS[fmt] - 1))) & (0x1FF << 23)
    rounded = torch.where(amax == 0, 2.0 ** -126, bits.view(torch.float32))
    return torch.exp2(torch.clamp(torch.floor(torch.log2(rounded)) - EMAX[fmt], -127, 127))


def _element(scaled: torch.Tensor, fmt: str) -> torch.Tensor:
    """Round to nearest even and saturate, in the input's dtype; Inf and NaN pass through
    (csrc/mx/funcs.cuh:110). e2m1 returns +0 for every value that rounds to zero (:124),
    as the survey measured MXFP4 and NVFP4 on 0.12.post1 and 0.13; MXFP8 keeps -0."""
    finite = scaled.isfinite()
    q = cast(torch.where(finite, scaled, 0).float(), fmt)
    q = q + 0.0 if fmt == "e2m1" else q
    return torch.where(finite, q.to(scaled.dtype), scaled)


def _nvfp4(x: torch.Tensor) -> torch.Tensor:
    """The nvfp4 scheme's two stages in float32 (scale_type float32): the block scale
    amax / 6, fake-quantized to e4m3 with the per-tensor scale amax / (6 * 448), then the
    elements divided by it, cast and multiplied back."""
    k = x.shape[-1]
    blocks = x.float().unflatten(-1, (-1, 16))
    tensor_scale = x.float().abs().amax() / (6.0 * 448.0)
    tensor_scale = tensor_scale.masked_fill(tensor_scale == 0.0, EPS)
    block_scale = blocks.abs().amax(-1, keepdim=True) / 6.0
    block_scale = _element(block_scale.masked_fill(block_scale == 0.0, EPS) / tensor_scale, "e4m3") * tensor_scale
    # hw_emulation_interface.py:1722-1723: a block scale of 0 divides as eps; the dequantization
    # (:2068) multiplies by the 0 itself, so such a block is +-0
    divisor = block_scale.masked_fill(block_scale == 0.0, EPS)
    return (_element(blocks / divisor, "e2m1") * block_scale).flatten(-2)[..., :k].to(x.dtype)


class _FakeQuantize(torch.nn.Module):
    def __init__(self, spec: SimpleNamespace) -> None:
        super().__init__()
        self.spec = spec

    def _mx(self, x: torch.Tensor) -> torch.Tensor:
        fmt, rule = self.spec.fmt, self.spec.scale_calculation_mode
        if (fmt, rule) == ("e2m1", "even") and x.dtype in (torch.float16, torch.bfloat16) and x.device.type == "cpu":
            raise RuntimeError("qdq_mxfp4 is only implemented in CUDA devices!")
        k = x.shape[-1]
        g = torch.nn.functional.pad(x, (0, -k % 32)).unflatten(-1, (-1, 32))
        amax = g.abs().amax(-1, keepdim=True)
        if rule == "even":
            scale = _even_scale(amax, fmt).to(x.dtype)
        elif rule == "floor":
            scale = torch.pow(2, torch.floor(torch.log2(amax)) - EMAX[fmt])
            scale = scale.masked_fill(scale == 0.0, EPS)
        else:
            raise ValueError(f"Unsupported scale_calculation_mode: {rule}")
        return (_element(g / scale, fmt) * scale).flatten(-2)[..., :k]

    def _fp8(self, x: torch.Tensor) -> torch.Tensor:
        scale = x.abs().amax() / 448.0
        return _element(x / scale.masked_fill(scale == 0.0, EPS), "e4m3") * scale.masked_fill(scale == 0.0, EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._mx(x) if self.spec.kind == "mx" else self._fp8(x)


class _SequentialQuantize(torch.nn.Sequential):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _nvfp4(x)


class FakeQuantizeBase:
    @staticmethod
    def get_fake_quantize(quant_spec: Any, device: Any = None, sequential: bool = False, **kwargs: Any) -> Any:
        if isinstance(quant_spec, list):
            return _SequentialQuantize(*(torch.nn.Identity() for _ in quant_spec))
        if not quant_spec.is_dynamic:
            raise NotImplementedError("fake models the dynamic quantizers (and the nvfp4 scheme's sequence) only")
        return _FakeQuantize(quant_spec)


def install(monkeypatch: pytest.MonkeyPatch, version: str = RELEASED) -> SimpleNamespace:
    """Put the fake quark in sys.modules (and its version in importlib.metadata)."""
    names = ("quark", "quark.torch", "quark.torch.quantization", "quark.torch.quantization.config",
             "quark.torch.quantization.config.config", "quark.torch.quantization.tensor_quantize")
    mods = {n: ModuleType(n) for n in names}
    for n, m in mods.items():
        m.__path__ = []
        parent, _, child = n.rpartition(".")
        if parent:
            setattr(mods[parent], child, m)
        monkeypatch.setitem(sys.modules, n, m)
    config = mods["quark.torch.quantization.config.config"]
    for name, fmt in (("OCP_MXFP8E4M3Spec", "e4m3"), ("OCP_MXFP8E5M2Spec", "e5m2"), ("OCP_MXFP6E2M3Spec", "e2m3"),
                      ("OCP_MXFP6E3M2Spec", "e3m2"), ("OCP_MXFP4Spec", "e2m1")):
        setattr(config, name, _mx_spec(fmt))
    config.FP8E4M3PerTensorSpec, config.FP4PerGroupSpec = FP8E4M3PerTensorSpec, FP4PerGroupSpec
    config.ScaleQuantSpec = ScaleQuantSpec
    mods["quark.torch.quantization.tensor_quantize"].FakeQuantizeBase = FakeQuantizeBase
    monkeypatch.setattr(sys, "meta_path", [_DistFinder(version, "amd-quark"), *sys.meta_path])
    return SimpleNamespace(config=config, FakeQuantizeBase=FakeQuantizeBase)
