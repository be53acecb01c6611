"""A quantization library's named configurations and the built-in recipe each one means.

Libraries that quantize for inference or QAT (compressed-tensors' preset schemes, ModelOpt's
quantization configs) name a handful of configurations; each computes one operand spec on
every tensor it is given. ``LibraryConfig`` pins a configuration's name to the recipe it
claims, and ``find_config`` gives the configuration that computes a spec, or a ``Refusal``
naming the nearest one and the first field it does not compute. The adapters
(``compressed_tensors_backend``, ``modelopt_backend``) share it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mxcheck.backends.contract import Refusal
from mxcheck.recipes import OperandSpec, Recipe

__all__ = ["LibraryConfig", "find_config"]

# Fields a library configuration states; ``profile`` pins the oracle, it is not a thing the
# library is asked to compute.
_COMPARED = tuple(f.name for f in dataclasses.fields(OperandSpec) if f.name != "profile")


@dataclass(frozen=True)
class LibraryConfig:
    """``name``: the library's own name for the configuration (a preset scheme, a config
    dict); ``recipe``: the recipe (every operand copy one spec) it claims bit for bit."""

    name: str
    recipe: Recipe

    @property
    def spec(self) -> OperandSpec:
        return self.recipe.spec("x_row")


def _differences(spec: OperandSpec, want: OperandSpec) -> list[str]:
    return [f"{f}={getattr(spec, f)!r} (it computes {getattr(want, f)!r})" for f in _COMPARED
            if getattr(spec, f) != getattr(want, f)]


def find_config(library: str, configs: tuple[LibraryConfig, ...], spec: OperandSpec) -> LibraryConfig:
    """The configuration that computes ``spec`` (every field but ``profile`` equal), else a
    ``Refusal`` naming the configuration with the fewest differing fields and those fields."""
    if not isinstance(spec, OperandSpec):
        raise TypeError(f"spec={spec!r}; expected a mxcheck.recipes.OperandSpec")
    ranked = sorted(configs, key=lambda c: len(_differences(spec, c.spec)))
    nearest = ranked[0]
    if not (diff := _differences(spec, nearest.spec)):
        return nearest
    raise Refusal(f"{library} has no configuration for this spec; the nearest, {nearest.name} "
                  f"({nearest.spec.describe()}), differs in {', '.join(diff)}")
