"""Swap a model's linears for quantized linears, as a Primus local spec does.

``quantize_model(model, recipe, backend)`` replaces, in place, the linears of
``DEFAULT_INCLUDE`` (qkv, proj, fc1 and fc2 of both double-block streams; single-block
linear1 and linear2) by :class:`QuantLinear` modules holding the *same* parameter objects,
so optimizers, state dicts and checkpoint names are unchanged. Modulation linears, the
embedders and the final layer stay in the model's precision unless ``include`` names them.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from mxcheck import backends
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.functions import make_delayed_states, quant_linear
from mxcheck.recipes import Recipe, get_recipe

__all__ = ["DEFAULT_INCLUDE", "QuantLinear", "quantize_model", "quantized_linears"]

DEFAULT_INCLUDE = (
    "double_blocks.*.img_attn.qkv", "double_blocks.*.img_attn.proj",
    "double_blocks.*.img_mlp.0", "double_blocks.*.img_mlp.2",
    "double_blocks.*.txt_attn.qkv", "double_blocks.*.txt_attn.proj",
    "double_blocks.*.txt_mlp.0", "double_blocks.*.txt_mlp.2",
    "single_blocks.*.linear1", "single_blocks.*.linear2",
)


class QuantLinear(nn.Module):
    """``y = x W^T + b`` through a recipe's quantized GEMMs on a backend.

    A backend with its own ``linear`` (TransformerEngine's module, a seeded-bug backend)
    runs the whole layer; a GEMM-only backend (Triton, ``torch._scaled_mm``) runs its GEMMs
    inside the reference Function on the oracle's quantized operands; the emulated backend
    is the reference Function itself (with the layer's name in its errors).
    """

    def __init__(self, linear: nn.Linear, recipe: Recipe, backend: Any, layer: str,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.recipe, self.backend, self.layer, self.generator = recipe, backend, layer, generator
        self.states = make_delayed_states(recipe) or None  # amax histories live on the layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        backend = self.backend
        oracle = type(backend) is EmulatedBackend
        if oracle or not hasattr(backend, "linear"):
            return quant_linear(x, self.weight, self.bias, self.recipe, layer=self.layer,
                                generator=self.generator, states=self.states,
                                gemm=None if oracle else backend.gemm)
        return backend.linear(x, self.weight, self.bias, self.recipe)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, recipe={self.recipe.name}, backend={self.backend.name}")


def patterns(value: Iterable[str], name: str) -> tuple[str, ...]:
    """fnmatch patterns as a tuple; a bare string is refused (tuple("a*") would be ("a", "*"),
    and "*" matches every layer)."""
    if isinstance(value, str):
        raise TypeError(f"{name}={value!r}: expected an iterable of fnmatch patterns, e.g. ({value!r},)")
    return tuple(value)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def quantize_model(model: nn.Module, recipe: str | Recipe, backend: Any = "emulated", *,
                   include: Iterable[str] = DEFAULT_INCLUDE, exclude: Iterable[str] = (),
                   generator: torch.Generator | None = None) -> list[str]:
    """Replace every ``nn.Linear`` whose name matches ``include`` (fnmatch) and not ``exclude``.

    Returns the replaced names. Raises ValueError, naming the layer, for a weight shape the
    recipe cannot take (e.g. MXFP6 needs N and K multiples of 256), for a backend that does
    not support the recipe, and when nothing matched (a silent no-op would train in bf16).
    """
    recipe = get_recipe(recipe)
    backend = backends.get(backend) if isinstance(backend, str) else backend
    if not (hasattr(backend, "linear") or hasattr(backend, "gemm")):
        raise TypeError(f"backend={backend!r} ({type(backend).__name__}) has neither linear nor gemm; expected "
                        f"a backend name (one of {sorted(backends.registered())}) or a Backend object")
    ok, why = backend.supports(recipe)
    if not ok:
        raise ValueError(f"backend {backend.name} does not support recipe {recipe.name}: {why}")
    include, exclude = patterns(include, "include"), patterns(exclude, "exclude")
    targets = [(name, mod) for name, mod in model.named_modules()
               if isinstance(mod, nn.Linear) and _matches(name, include) and not _matches(name, exclude)]
    if not targets:
        raise ValueError(f"include={include!r} matched no nn.Linear in {type(model).__name__} "
                         f"(exclude={exclude!r}); nothing would be quantized")
    for name, mod in targets:
        # M (tokens) is checked per call by the Function; N and K are fixed here.
        recipe.check_shape(recipe.shape_multiple, mod.out_features, mod.in_features, name)
    modules = dict(model.named_modules())
    for name, mod in targets:
        parent_name, _, child = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        setattr(parent, child, QuantLinear(mod, recipe, backend, name, generator))
    return [name for name, _ in targets]


def quantized_linears(model: nn.Module) -> dict[str, QuantLinear]:
    """name -> QuantLinear for every quantized linear in ``model``."""
    return {name: mod for name, mod in model.named_modules() if isinstance(mod, QuantLinear)}
