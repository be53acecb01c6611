"""What a backend is judged on: its claims, the command line's, or every built-in recipe.

A *declared* claim (the backend's ``claims`` attribute or ``--mxcheck-recipe``) is a promise:
if ``supports()`` then rejects it, that is a failure, not a skip. Without claims the suite
runs every recipe in ``DEFAULT_RECIPES`` and a recipe ``supports()`` rejects is counted as
not supported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mxcheck.recipe_files import resolve_recipe
from mxcheck.recipes import Recipe

__all__ = ["Claim", "claims_of"]


@dataclass(frozen=True)
class Claim:
    """A recipe a backend is judged on, and who named it: ``"backend"`` (its ``claims``),
    ``"command line"`` (``--mxcheck-recipe``) or ``"default"`` (every built-in recipe)."""

    recipe: Recipe
    by: str

    @property
    def declared(self) -> bool:
        return self.by != "default"

    def __str__(self) -> str:
        return self.recipe.name


def claims_of(backend: Any, command_line: Sequence[Recipe] = ()) -> list[Claim]:
    """The claims ``backend`` is judged on: ``command_line`` recipes when given, else its
    ``claims`` attribute (names, ``RECIPE@PROFILE``, recipe files or Recipes), else every
    recipe of ``DEFAULT_RECIPES``. ValueError names the backend and a claim that does not
    resolve."""
    from mxcheck.conformance import DEFAULT_RECIPES  # noqa: PLC0415  (the package imports this module)

    if command_line:
        return [Claim(r, "command line") for r in command_line]
    own = getattr(backend, "claims", None)
    if own is None:
        return [Claim(resolve_recipe(n), "default") for n in DEFAULT_RECIPES]
    if isinstance(own, (str, Recipe)) or not isinstance(own, Sequence):
        raise TypeError(f"backend {getattr(backend, 'name', backend)!r}: claims={own!r}; expected a list of "
                        "recipe names, recipe file paths or Recipe objects")
    out = []
    for c in own:
        try:
            out.append(Claim(resolve_recipe(c), "backend"))
        except (TypeError, ValueError) as e:
            raise ValueError(f"backend {getattr(backend, 'name', backend)!r} claims {c!r}: {e}") from None
    if not out:
        raise ValueError(f"backend {getattr(backend, 'name', backend)!r}: claims is empty; claim at least one "
                         "recipe, or leave the attribute out to be judged on every built-in recipe")
    return out
