"""Fit a backend's quantizer: the profile that reproduces it on the quantize check's inputs.

``fit_backend`` runs the backend and the oracle on every input family and tensor dtype of
``check_quantize`` (``QUANTIZE_INPUTS``, each family in its dtypes) for each operand copy of a
recipe, and fits one profile per operand spec (``mxcheck.diagnose.fit``): x_row and w_row
share a fit where their specs are one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mxcheck.conformance._common import fresh_state
from mxcheck.conformance.basic import (
    DEFAULT_INPUT_DTYPES,
    QUANTIZE_INPUTS,
    _input_label,
)
from mxcheck.diagnose.fit import Fit, FitCase, fit
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import OperandSpec, Recipe

__all__ = ["OperandFit", "fit_backend", "fit_cases"]

OPERANDS = ("x_row", "w_row")


def fit_cases(backend: Any, recipe: Recipe, gen: torch.Generator, rows: int = 256, cols: int = 512,
              operands: tuple[str, ...] = OPERANDS, inputs: tuple[str, ...] | None = None,
              ) -> dict[OperandSpec, list[FitCase]]:
    """The comparisons of the quantize check (smaller with ``rows``, ``cols``: multiples of
    32; ``inputs``: some of its input families), grouped by operand spec."""
    accepted = tuple(getattr(backend, "input_dtypes", DEFAULT_INPUT_DTYPES))
    out: dict[OperandSpec, list[FitCase]] = {}
    for what, family in QUANTIZE_INPUTS.items():
        if inputs is not None and what not in inputs:
            continue
        for name in operands:
            spec = recipe.spec(name)
            for dtype, amax, t in family.tensors(gen, spec, rows, cols):
                if dtype not in accepted:
                    continue
                ours = quantize_operand(t, spec, **fresh_state(recipe, name))
                theirs = backend.quantize(t, spec, **fresh_state(recipe, name))
                label = _input_label(what, dtype, None if family.tiles is not None and family.scale == 1.0 else amax)
                out.setdefault(spec, []).append(FitCase(t, spec, ours, theirs, f"{name}, {label}"))
    return out


@dataclass(frozen=True)
class OperandFit:
    """The fit of the operand copies that share one spec (None: profiles cannot model it)."""

    operands: tuple[str, ...]
    spec: OperandSpec
    fit: Fit | None


def fit_backend(backend: Any, recipe: Recipe, seed: int = 0, rows: int = 256, cols: int = 512,
                operands: tuple[str, ...] = OPERANDS, inputs: tuple[str, ...] | None = None) -> list[OperandFit]:
    """One fit per distinct operand spec of the recipe's ``operands`` (x_row and w_row), on
    the quantize check's input families (``inputs``: some of them)."""
    cases = fit_cases(backend, recipe, torch.Generator().manual_seed(seed), rows, cols, operands, inputs)
    names = {spec: tuple(n for n in operands if recipe.spec(n) == spec) for spec in cases}
    return [OperandFit(names[spec], spec, fit(group)) for spec, group in cases.items()]
