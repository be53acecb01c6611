"""Conformance checks a backend must pass, as plain functions that raise NumericsError.

``tests/conformance/`` runs each check on every selected backend; the known-bad backends
(``mxcheck.backends.known_bad``) are run through the same checks to prove each check can
fail. A check takes the backend, a recipe and a torch.Generator, and skips (returns a
reason) when the backend does not offer what it checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.contract import Refusal
from mxcheck.conformance._common import LINEAR_SNR_FLOORS, SAME_OPERANDS_FLOOR_DB, linear_of
from mxcheck.conformance.basic import (
    check_gemm,
    check_linear,
    check_nan_propagates,
    check_quantize,
    check_repeatable,
    check_shapes,
    check_weight_change,
)
from mxcheck.conformance.edges import EDGE_SHAPES, check_edge_shapes, edge_shape_outcome
from mxcheck.conformance.poison import (
    check_poison_guard_tiles,
    check_poison_output,
    check_poison_padding,
)
from mxcheck.conformance.sr import (
    SR_DRAWS,
    SR_FALSE_FAILURE,
    check_sr_seeded,
    check_sr_unbiased,
    sr_deviation_bound,
)
from mxcheck.recipes import DERIVED_RECIPES, OCP_MX_RECIPES, PLAIN_RECIPES, RECIPES, Recipe

__all__ = ["CHECKS", "DEFAULT_RECIPES", "EDGE_SHAPES", "LINEAR_SNR_FLOORS", "SAME_OPERANDS_FLOOR_DB", "SR_DRAWS", "SR_FALSE_FAILURE",
           "check_gemm", "check_quantize", "edge_shape_outcome", "linear_of", "run_checks",
           "sr_deviation_bound"]

# What conformance runs on a backend that states no claims (and --mxcheck-recipe is not given):
# every built-in recipe, the plain ones, the derived SR variants and the OCP MX v1.0 recipes; supports() filters.
DEFAULT_RECIPES: tuple[str, ...] = (*sorted(RECIPES), *sorted(PLAIN_RECIPES), *sorted(DERIVED_RECIPES),
                                   *sorted(OCP_MX_RECIPES))

CHECKS: dict[str, Callable[..., str | None]] = {
    "quantize": check_quantize,
    "gemm": check_gemm,
    "linear": check_linear,
    "weight_change": check_weight_change,
    "repeatable": check_repeatable,
    "nan": check_nan_propagates,
    "shapes": check_shapes,
    "poison_padding": check_poison_padding,
    "poison_output": check_poison_output,
    "poison_guard_tiles": check_poison_guard_tiles,
    "edge_shapes": check_edge_shapes,
    "sr_unbiased": check_sr_unbiased,
    "sr_seeded": check_sr_seeded,
}


def run_checks(backend: Any, recipe: Recipe, seed: int = 0, names: Iterable[str] | None = None) -> dict[str, str]:
    """name -> "ok", "skipped: ...", "refused: ..." or "FAILED: ..." for every check, or for those in
    ``names`` (for the known-bad tests); each check draws from a generator seeded with ``seed``."""
    names = list(CHECKS) if names is None else list(names)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ValueError(f"run_checks: names={names!r} has {unknown!r}; expected names from {sorted(CHECKS)}")
    out = {}
    for name in names:
        check, gen = CHECKS[name], torch.Generator().manual_seed(seed)
        try:
            skipped = check(backend, recipe, gen)
        except NumericsError as e:
            out[name] = f"FAILED: {str(e).splitlines()[0]}"
        except Refusal as e:
            out[name] = f"refused: {e}"
        else:
            out[name] = f"skipped: {skipped}" if skipped else "ok"
    return out
