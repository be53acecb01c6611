"""AMD Quark (``amd-quark`` 0.12 to 0.13, checked) behind the Backend protocol: its OCP MX,
FP8 per-tensor and NVFP4 fake-quantizers, judged on the values they return (``fake_quantize``).

Quark quantizes a model through config specs (``quark/torch/quantization/config/config.py``)
that ``FakeQuantizeBase.get_fake_quantize(spec.to_quantization_spec())``
(``quark/torch/quantization/tensor_quantize.py``) turns into the module a quantized layer
calls on its tensor. This adapter builds the same modules:

* MX: ``OCP_MXFP8E4M3Spec``, ``OCP_MXFP8E5M2Spec``, ``OCP_MXFP6E2M3Spec``, ``OCP_MXFP6E3M2Spec``
  and ``OCP_MXFP4Spec`` with ``ch_axis=-1`` (1x32 groups along K, E8M0 scales, dynamic);
  ``scale_calculation_mode`` "even" (Quark's default) or "floor" (OCP's rule), mxcheck's
  scale rules of those names. One module per (format, rule), reused from call to call as a
  layer reuses its quantizer.
* FP8 per tensor: ``FP8E4M3PerTensorSpec`` (min-max observer,
  ``is_dynamic=True``): scale = amax / fp8 max, recomputed on every call; reused likewise. The
  reuse shows a Quark defect a fresh module hides: its observer copies the amax into buffers
  that hold the previous call's dtype (observer.py:361-365), so a float32 tensor after a
  float16 one is quantized with its amax rounded to float16
  (references/conventions/quark/fp8-amax-previous-call-dtype.py). No catalogue behaviour can
  reproduce it (it depends on the call before), so the fit leaves those blocks as residual.
* NVFP4: the ``nvfp4`` scheme's activation spec (``config/template.py``,
  ``FP4Block16ScaleE4M3Scheme``): ``ScaleQuantSpec`` of ``FP4PerGroupSpec(group_size=16)``
  and a static min-max ``FP8E4M3PerTensorSpec`` that quantizes the block scales. The second
  stage calibrates on what it sees, so each call gets a fresh module: the tensor scale is
  the operand's own.

Quark runs ``torch.compile`` on its fake-quantize op unless ``QUARK_DISABLE_COMPILE=1``; the
conformance inputs (many shapes and dtypes) recompile it past Dynamo's limit, after which
Quark itself falls back to the eager op for good. The adapter sets that variable (unless
the caller did) before Quark is imported, so every call takes the eager op from the start.
Quark's MXFP4 "even" path sends float16 and bfloat16 to a GPU-only kernel
(``quark/torch/kernel/__init__.py::MXFP4DynamicFakeQuantizeFunction`` -> ``mx.qdq_mxfp4``,
"qdq_mxfp4 is only implemented in CUDA devices!"), which the adapter refuses on a CPU.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from mxcheck.backends.contract import Refusal
from mxcheck.backends.library_configs import (
    LibraryConfig,
    find_config,
    library_available,
    supports_every_copy,
)
from mxcheck.backends.spec_check import check_operand
from mxcheck.recipes import OCP_MX_RECIPES, OPERANDS, OperandSpec, Recipe, get_recipe

__all__ = ["QUARK_CHECKED", "QUARK_CONFIGS", "QuarkBackend"]

QUARK_CHECKED = ("0.12", "0.14")  # minimum, first release not checked (references/conventions/quark.json)
_INPUTS = (torch.float32, torch.bfloat16, torch.float16)
_MX_SPECS = {"e4m3": "OCP_MXFP8E4M3Spec", "e5m2": "OCP_MXFP8E5M2Spec", "e2m3": "OCP_MXFP6E2M3Spec",
             "e3m2": "OCP_MXFP6E3M2Spec", "e2m1": "OCP_MXFP4Spec"}
_SOURCE = "amd-quark 0.13 quark/torch/quantization/config/config.py"
_NAMED = {("e2m1", "even"): "mxfp4-1x32"}  # a built-in recipe that already is this configuration


def _mx_config(fmt: str, rule: str) -> LibraryConfig:
    """An OCP MX spec with ``scale_calculation_mode=rule`` (observer.py get_scale: "even",
    "floor", "ceil", mxcheck's scale rules of those names) and the recipe it claims: OCP's
    for floor, a named one, else the format and rule on every operand copy."""
    name = f"{_MX_SPECS[fmt]}(ch_axis=-1, scale_calculation_mode={rule!r})"
    if rule == "floor":
        recipe = next(r for r in OCP_MX_RECIPES.values() if r.x_row.fmt == fmt)
    elif (fmt, rule) in _NAMED:
        recipe = get_recipe(_NAMED[fmt, rule])
    else:
        recipe = Recipe(f"quark-mx-{fmt}-{rule}", **dict.fromkeys(OPERANDS, OperandSpec(fmt, "mx", scale_rule=rule)),
                        source=f"{_SOURCE}::{name}")
    return LibraryConfig(name, recipe)


# Quark's configuration -> the recipe it claims: its default MX rule ("even") and OCP's
# ("floor") on every MX format, FP8 per tensor, and the nvfp4 scheme's activation spec.
QUARK_CONFIGS: tuple[LibraryConfig, ...] = (
    *(_mx_config(fmt, rule) for fmt in _MX_SPECS for rule in ("even", "floor")),
    LibraryConfig("FP8E4M3PerTensorSpec(observer_method='min_max', is_dynamic=True)", get_recipe("fp8-tensorwise")),
    LibraryConfig("nvfp4 (FP4Block16ScaleE4M3Scheme input_tensors)", get_recipe("nvfp4-1x16")),
)


def _eager() -> None:
    """Quark reads QUARK_DISABLE_COMPILE once, at import (quark/torch/utils/constants.py)."""
    os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")


@functools.cache
def _quark() -> Any:
    """Quark's config module and FakeQuantizeBase, with its fake-quantize op eager (module doc)."""
    _eager()
    from quark.torch.quantization.config import config  # noqa: PLC0415
    from quark.torch.quantization.tensor_quantize import FakeQuantizeBase  # noqa: PLC0415

    return config, FakeQuantizeBase


def _module(spec: OperandSpec) -> Any:
    """The fake-quantize module Quark builds for ``spec`` (a configuration find_config found)."""
    config, fake_quantize_base = _quark()
    if spec.scaling == "nvfp4":  # template.py FP4Block16ScaleE4M3Scheme, its input_tensors spec
        stages = config.ScaleQuantSpec(
            first_stage=config.FP4PerGroupSpec(ch_axis=-1, group_size=16, is_dynamic=True, scale_type="float32"),
            second_stage=config.FP8E4M3PerTensorSpec(observer_method="min_max", is_dynamic=False,
                                                     scale_type="float32"))
        return fake_quantize_base.get_fake_quantize(stages.to_quantization_spec())
    return _reused_module(spec.scaling, spec.fmt, spec.scale_rule)


@functools.cache
def _reused_module(scaling: str, fmt: str, rule: str) -> Any:
    config, fake_quantize_base = _quark()
    if scaling == "mx":
        quark_spec = getattr(config, _MX_SPECS[fmt])(ch_axis=-1, scale_calculation_mode=rule)
    else:
        quark_spec = config.FP8E4M3PerTensorSpec(observer_method="min_max", is_dynamic=True)
    return fake_quantize_base.get_fake_quantize(quark_spec.to_quantization_spec())


class QuarkBackend:
    """AMD Quark's MX, FP8 per-tensor and NVFP4 fake-quantizers."""

    name = "quark"
    device = "cpu"
    claims: tuple[Recipe, ...] = tuple(c.recipe for c in QUARK_CONFIGS)
    input_dtypes: tuple[torch.dtype, ...] = _INPUTS

    def available(self) -> tuple[bool, str]:
        """Usable where amd-quark is installed at a checked release and ``quark.torch`` imports
        (it JIT-builds its C++ ops with the host compiler on first import, and needs
        ``transformers``)."""
        return library_available("amd-quark", QUARK_CHECKED, "quark.torch", before_import=_eager)

    def supports(self, recipe: Recipe | str) -> tuple[bool, str]:
        """Recipes whose six operand copies Quark's fake-quantizers all compute."""
        return supports_every_copy("quark", "quark", QUARK_CONFIGS, recipe)

    def fake_quantize(self, x: torch.Tensor, spec: OperandSpec, *, state: object = None) -> torch.Tensor:
        """Quark's fake-quantized values of the 2D operand x [rows, K], in x's dtype."""
        x = check_operand(x, "quark", _INPUTS)
        find_config("quark", QUARK_CONFIGS, spec)
        if (spec.scaling, spec.fmt, spec.scale_rule) == ("mx", "e2m1", "even") and x.dtype != torch.float32 \
                and x.device.type == "cpu":
            raise Refusal(f"quark: MXFP4 'even' on a {x.dtype} tensor runs mx.qdq_mxfp4, a GPU-only kernel")
        with torch.no_grad():
            return _module(spec)(x.contiguous())
