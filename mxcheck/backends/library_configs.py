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
from collections.abc import Callable
from dataclasses import dataclass

from mxcheck.backends.contract import Refusal, version_problem
from mxcheck.recipes import OPERANDS, OperandSpec, Recipe, get_recipe

__all__ = ["LibraryConfig", "find_config", "library_available", "supports_every_copy"]

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


def supports_every_copy(backend: str, library: str, configs: tuple[LibraryConfig, ...],
                        recipe: Recipe | str) -> tuple[bool, str]:
    """(True, "") where one of ``configs`` computes each of the recipe's six operand copies;
    else (False, why), naming the first copy's nearest configuration (``find_config``)."""
    r = get_recipe(recipe)
    try:
        for operand in OPERANDS:
            find_config(library, configs, r.spec(operand))
    except Refusal as e:
        return False, f"{backend}: recipe {r.name}: {e}"
    return True, ""


def library_available(distribution: str, checked: tuple[str, str], module: str,
                      before_import: Callable[[], None] | None = None) -> tuple[bool, str]:
    """(True, "") where ``distribution`` is installed at a release in ``checked`` (lowest,
    first one above) and ``module`` imports; else (False, why)."""
    if (why := version_problem(distribution, checked[0], below=checked[1])) is not None:
        return False, why
    from mxcheck.backends import import_vendor  # noqa: PLC0415  (the registry imports the adapters)

    if before_import is not None:
        before_import()
    if (why := import_vendor(module)) is not None:
        return False, why
    return True, ""
