"""Fit a backend's quantizer: the profile that reproduces it on the quantize check's inputs.

``fit_backend`` runs the backend and the oracle on every input family and tensor dtype of
``check_quantize`` (``QUANTIZE_INPUTS``, each family in its dtypes) for each operand copy of a
recipe, and fits one profile per operand spec (``mxcheck.diagnose.fit``): x_row and w_row
share a fit where their specs are one.

The backend runs where it runs: its inputs go to its ``device`` (as the conformance checks
put them), its result comes back to the CPU, and the oracle quantizes the CPU input. A
backend with ``quantize`` is fitted on its codes; one with ``fake_quantize`` only, on its
values (judged as ``conformance.values`` judges them: ``values_differ``). A ``Refusal`` the
backend raises for an operand spec is a declared skip of that spec, with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mxcheck.backends.contract import Refusal
from mxcheck.conformance._common import _device, fresh_state
from mxcheck.conformance.basic import (
    DEFAULT_INPUT_DTYPES,
    QUANTIZE_INPUTS,
    _input_label,
)
from mxcheck.diagnose.fit import Fit, FitCase, fit
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import OperandSpec, Recipe

__all__ = ["OperandFit", "fit_backend", "fit_cases", "kernel_result", "values_differ",
           "values_failure"]

OPERANDS = ("x_row", "w_row")


# ---- values: the one place fit and search read the values contract (conformance.values) ----------


def values_differ(candidate: Any, got: torch.Tensor) -> torch.Tensor:
    """Per element of a fake-quant kernel's values ``got``: they differ from the quantized
    tensor ``candidate``'s values, as the values check judges them (``values_agree``: bits in
    got's dtype, any NaN equal to any NaN, an NVFP4 value within the released orders' spread)."""
    from mxcheck.conformance.values import values_agree  # noqa: PLC0415

    return ~values_agree(got, candidate)


def values_failure(backend: Any, recipe: Recipe, operand: str, x: torch.Tensor, label: str) -> str | None:
    """The values check's failure text for one input of ``operand`` (None: it passes)."""
    from mxcheck.assertions import NumericsError  # noqa: PLC0415
    from mxcheck.conformance.values import check_fake_quantize  # noqa: PLC0415

    try:
        check_fake_quantize(backend, recipe, inputs=[(label.split(" ")[0], operand, label, x)])
    except NumericsError as e:
        return str(e)
    return None


# ---- the backend's result, where it runs ------------------------------------------------------


def kernel_result(backend: Any, x: torch.Tensor, spec: OperandSpec, **state: Any) -> Any:
    """The backend's quantization of the CPU tensor ``x``, run on the backend's ``device``
    and brought back to the CPU: its quantized tensor (``quantize``), else its values
    (``fake_quantize``). A Refusal passes unchanged."""
    from mxcheck.diagnose.compare import _cpu  # noqa: PLC0415

    on_device = x.to(_device(backend))
    if hasattr(backend, "quantize"):
        return _cpu(backend.quantize(on_device, spec, **state))
    got = backend.fake_quantize(on_device, spec, **state)
    return got.detach().cpu() if isinstance(got, torch.Tensor) else got


def fit_cases(backend: Any, recipe: Recipe, gen: torch.Generator, rows: int = 256, cols: int = 512,
              operands: tuple[str, ...] = OPERANDS, inputs: tuple[str, ...] | None = None,
              refused: dict[OperandSpec, str] | None = None) -> dict[OperandSpec, list[FitCase]]:
    """The comparisons of the quantize check (smaller with ``rows``, ``cols``: multiples of
    32; ``inputs``: some of its input families), grouped by operand spec. A spec the backend
    refuses (``Refusal`` on any of its inputs) has no cases; its reason goes to ``refused``."""
    accepted = tuple(getattr(backend, "input_dtypes", DEFAULT_INPUT_DTYPES))
    values = None if hasattr(backend, "quantize") else values_differ
    refused = {} if refused is None else refused
    out: dict[OperandSpec, list[FitCase]] = {}
    for what, family in QUANTIZE_INPUTS.items():
        if inputs is not None and what not in inputs:
            continue
        for name in operands:
            spec = recipe.spec(name)
            if spec in refused:
                continue
            for dtype, amax, t in family.tensors(gen, spec, rows, cols):
                if dtype not in accepted:
                    continue
                label = _input_label(what, dtype, None if family.tiles is not None and family.scale == 1.0 else amax)
                ours = quantize_operand(t, spec, **fresh_state(recipe, name))  # on the CPU: exact
                try:
                    theirs = kernel_result(backend, t, spec, **fresh_state(recipe, name))
                except Refusal as e:
                    refused[spec] = f"{name}, {label}: {e}"
                    out.pop(spec, None)
                    break
                out.setdefault(spec, []).append(FitCase(t, spec, ours, theirs, f"{name}, {label}", values))
    return out


@dataclass(frozen=True)
class OperandFit:
    """The fit of the operand copies that share one spec (None: profiles cannot model it, or
    the backend refused the spec: ``refused`` says why)."""

    operands: tuple[str, ...]
    spec: OperandSpec
    fit: Fit | None
    refused: str = ""


def fit_backend(backend: Any, recipe: Recipe, seed: int = 0, rows: int = 256, cols: int = 512,
                operands: tuple[str, ...] = OPERANDS, inputs: tuple[str, ...] | None = None) -> list[OperandFit]:
    """One fit per distinct operand spec of the recipe's ``operands`` (x_row and w_row), on
    the quantize check's input families (``inputs``: some of them); a spec the backend
    refuses is an OperandFit with no fit and the refusal's reason."""
    refused: dict[OperandSpec, str] = {}
    cases = fit_cases(backend, recipe, torch.Generator().manual_seed(seed), rows, cols, operands, inputs, refused)
    specs = list(dict.fromkeys(recipe.spec(n) for n in operands))
    names = {spec: tuple(n for n in operands if recipe.spec(n) == spec) for spec in specs}
    return [OperandFit(names[spec], spec, None, refused[spec]) if spec in refused
            else OperandFit(names[spec], spec, fit(cases[spec])) for spec in specs if spec in refused or spec in cases]
