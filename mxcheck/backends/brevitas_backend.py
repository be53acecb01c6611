"""brevitas (0.13.3 to 0.13.4, checked) behind the Backend protocol: its OCP MX and OCP FP8
fake-quantizers, judged on the values they return (``fake_quantize``).

brevitas is a QAT library: a quantizer is an injector class that a ``brevitas.nn`` layer
turns into a proxy, and what the layer returns is a QuantTensor whose ``value`` is the
fake-quantized tensor (codes times scales, in the input's dtype). This adapter calls:

* MX: ``brevitas.nn.QuantIdentity(act_quant=MXFloat8e4m3Act.let(bit_width, exponent_bit_width,
  mantissa_bit_width), group_dim=-1)`` (``brevitas/quant/mx_quant_ocp.py``): 1x32 groups
  along the last axis, E8M0 (power-of-two) scales from the group's absmax, dynamic at run
  time. brevitas names only e4m3 (``MXFloat8e4m3Act``); the other OCP element formats are
  the same class with the widths changed by ``.let``, as brevitas' own LLM example builds
  them (``float_ocp_e2m1`` and so on); ``FpOCPMixin`` then gives e2m1/e2m3/e3m2 no NaN or Inf
  codes, e4m3 one NaN mantissa and e5m2 Inf and NaN, as OCP states.
* FP8 per tensor: ``Fp8e4m3OCPWeightPerTensorFloat`` / ``Fp8e5m2OCPWeightPerTensorFloat``
  (``brevitas/quant/float_quant_ocp.py``) on a ``brevitas.nn.QuantLinear`` whose weight is
  the operand: the scale is absmax / fp8 max, recomputed on every call (the activation
  classes calibrate a static scale over 300 steps instead, which is not a per-call cast).

brevitas has no NVFP4 quantizer and no packed-code export for MX on CPU, so ``quantize``,
``gemm`` and ``linear`` are absent: linears run through the reference Function with these
values. ``BREVITAS_CONFIGS`` pins each quantizer to the recipe it claims.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from mxcheck.backends.library_configs import (
    LibraryConfig,
    find_config,
    library_available,
    supports_every_copy,
)
from mxcheck.backends.spec_check import check_operand
from mxcheck.recipes import OCP_MX_RECIPES, OperandSpec, Recipe, get_recipe

__all__ = ["BREVITAS_CHECKED", "BREVITAS_CONFIGS", "BrevitasBackend"]

# The releases the adapter was run against (references/conventions/brevitas.json).
BREVITAS_CHECKED = ("0.13.3", "0.14")  # minimum, first release not checked
_INPUTS = (torch.float32, torch.bfloat16, torch.float16)
# (bit_width, exponent_bit_width, mantissa_bit_width) of each OCP element format.
_WIDTHS = {"e4m3": (8, 4, 3), "e5m2": (8, 5, 2), "e2m3": (6, 2, 3), "e3m2": (6, 3, 2), "e2m1": (4, 2, 1)}


def _mx_config(recipe: Recipe) -> LibraryConfig:
    bits, ebits, mbits = _WIDTHS[recipe.x_row.fmt]
    return LibraryConfig(f"MXFloat8e4m3Act.let(bit_width={bits}, exponent_bit_width={ebits}, "
                         f"mantissa_bit_width={mbits})", recipe)


# brevitas' quantizer -> the recipe it claims: the MX quantizer (group_dim=-1) as OCP MX on
# each element format, and the OCP e4m3 per-tensor weight quantizer as plain FP8 tensorwise.
BREVITAS_CONFIGS: tuple[LibraryConfig, ...] = (
    *(_mx_config(r) for r in OCP_MX_RECIPES.values()),
    LibraryConfig("Fp8e4m3OCPWeightPerTensorFloat", get_recipe("fp8-tensorwise")),
)


@functools.cache
def _mx_quantizer(fmt: str) -> Any:
    """A QuantIdentity running brevitas' MX activation quantizer for ``fmt`` (stateless)."""
    from brevitas.nn import QuantIdentity  # noqa: PLC0415
    from brevitas.quant.mx_quant_ocp import MXFloat8e4m3Act  # noqa: PLC0415

    bits, ebits, mbits = _WIDTHS[fmt]
    quant = MXFloat8e4m3Act.let(bit_width=bits, exponent_bit_width=ebits, mantissa_bit_width=mbits)
    return QuantIdentity(act_quant=quant, group_dim=-1, return_quant_tensor=True).eval()


def _per_tensor(x: torch.Tensor, quantizer: str) -> torch.Tensor:
    """brevitas' per-tensor weight quantizer on a QuantLinear whose weight is x."""
    from brevitas import quant  # noqa: PLC0415
    from brevitas.nn import QuantLinear  # noqa: PLC0415

    rows, k = x.shape
    layer = QuantLinear(k, rows, bias=False, weight_quant=getattr(quant, quantizer), dtype=x.dtype)
    layer.weight.copy_(x)
    return layer.quant_weight().value


class BrevitasBackend:
    """brevitas' OCP MX (1x32) and OCP FP8 per-tensor fake-quantizers."""

    name = "brevitas"
    device = "cpu"
    claims: tuple[Recipe, ...] = tuple(c.recipe for c in BREVITAS_CONFIGS)
    input_dtypes: tuple[torch.dtype, ...] = _INPUTS

    def available(self) -> tuple[bool, str]:
        """Usable where brevitas is installed at a checked release and imports."""
        return library_available("brevitas", BREVITAS_CHECKED, "brevitas.nn")

    def supports(self, recipe: Recipe | str) -> tuple[bool, str]:
        """Recipes whose six operand copies brevitas' quantizers all compute."""
        return supports_every_copy("brevitas", "brevitas", BREVITAS_CONFIGS, recipe)

    def fake_quantize(self, x: torch.Tensor, spec: OperandSpec, *, state: object = None) -> torch.Tensor:
        """brevitas' fake-quantized values of the 2D operand x [rows, K], in x's dtype."""
        x = check_operand(x, "brevitas", _INPUTS)
        config = find_config("brevitas", BREVITAS_CONFIGS, spec)
        # brevitas warns about deprecated paths inside its own modules; they are not the caller's
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            if spec.scaling == "mx":
                return _mx_quantizer(spec.fmt)(x.contiguous()).value
            return _per_tensor(x, config.name)
