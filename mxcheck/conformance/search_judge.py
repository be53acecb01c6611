"""The search's properties: the oracle's judgement of one input, and the cause of a finding.

Three properties, each the oracle's own judgement of one entry point of the Backend
protocol, on one input (``conformance.search_inputs``):

- ``quantize``: the backend's quantization of x_row or w_row equals the oracle's bit for bit,
  every field of the contract (``diagnose.quantize.compare_quantized``, as check_quantize),
  or for a backend with ``fake_quantize`` only, its values equal the oracle's as the values
  check judges them (``conformance.values``);
- ``gemm``: the backend's GEMM of the oracle's quantized operands lies inside the
  fp32-accumulation bound of their exact GEMM (``diagnose.outputs``, as check_gemm);
- ``linear``: the backend's forward (after one call with another weight, as
  check_weight_change) lies inside the same bound around the exact GEMM of the oracle's
  quantized x_row and w_row plus the bias; NaN where the exact output is NaN (check_nan).

The backend runs on its ``device`` (inputs go there, results come back); the oracle runs on
the CPU. An output is judged only where the oracle's own float32 GEMM lies inside the bound:
where float32 overflows on the way (a partial sum past 2^128), no float32 kernel is held to it.

*Known* behaviours (catalogue behaviours, ``--known`` or found earlier in the same search)
move the quantize property's oracle: the oracle's tensor with them applied is what the
kernel must equal, so a search goes past what is already known.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from mxcheck.backends.contract import Refusal
from mxcheck.conformance._common import (
    _device,
    _Reference,
    fresh_state,
    gemm_out_dtype,
    linear_of,
    values_problem,
)
from mxcheck.conformance.fitting import kernel_result, values_differ, values_failure
from mxcheck.conformance.search_inputs import Case
from mxcheck.diagnose import CATALOGUE
from mxcheck.diagnose import quantize as diagnose_quantize
from mxcheck.diagnose.behaviour import Behaviour
from mxcheck.diagnose.catalogue import QUANTIZE_BEHAVIOURS, combined
from mxcheck.diagnose.linear import LinearCase, explain_linear
from mxcheck.diagnose.outputs import (
    exact_and_bound,
    gemm_mismatch,
    outside_bound,
    reproduced_by_split_accumulation,
)
from mxcheck.gemm import emulated_gemm, quantize_operand
from mxcheck.recipe_files import resolve_recipe
from mxcheck.recipes import Recipe
from mxcheck.rng import seeded_default_rng

__all__ = ["PROPERTIES", "Refused", "cause_of", "judge", "known_behaviours", "name_of"]

PROPERTIES = ("quantize", "gemm", "linear")


class _Invalid(Exception):
    """The oracle cannot take the input: no verdict."""


class Refused(Exception):
    """The backend refused the input (a declared ``Refusal``): no verdict, counted."""


def _oracle(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ValueError as e:  # the oracle's argument check: an input it cannot quantize
        raise _Invalid(str(e)) from e


def _call(fn: Callable[[], Any]) -> Any:
    """The backend's call; a Refusal is no verdict, any other exception is the finding."""
    try:
        return fn()
    except Refusal as e:
        raise Refused(str(e)) from e


def _to(q: Any, device: str) -> Any:
    """A tensor, or a quantized tensor's tensor fields, on ``device``."""
    if isinstance(q, torch.Tensor):
        return q.to(device)
    moved = {f: getattr(q, f).to(device) for f in q.__dataclass_fields__ if isinstance(getattr(q, f), torch.Tensor)}
    return replace(q, **moved) if moved else q


def known_behaviours(keys: Sequence[str | Behaviour]) -> tuple[Behaviour, ...]:
    """Catalogue behaviours by key (``a & b``: a combination, as a fit names one); ValueError
    names an unknown key and the nearest known one."""
    from mxcheck.text import did_you_mean  # noqa: PLC0415

    out = []
    for key in keys:
        if isinstance(key, Behaviour):
            out.append(key)
            continue
        parts = [p.strip() for p in str(key).split(" & ")]
        bad = [p for p in parts if p not in CATALOGUE or CATALOGUE[p].level != "quantize"]
        if bad:
            quantize = [k for k, b in CATALOGUE.items() if b.level == "quantize"]
            raise ValueError(f"known={bad[0]!r} is not a quantize behaviour of the catalogue"
                             f"{did_you_mean(bad[0], quantize)} (the keys of mxcheck.diagnose.CATALOGUE at level quantize)")
        both = CATALOGUE[parts[0]] if len(parts) == 1 else combined(*(CATALOGUE[p] for p in parts))
        if both is None:
            raise ValueError(f"known={key!r}: these behaviours do not combine (two kinds, or one field at two values)")
        out.append(both)
    return tuple(out)


def _apply(known: Sequence[Behaviour], x: torch.Tensor, spec: Any, q: Any) -> Any:
    """The oracle's tensor with the known behaviours applied (each where it applies; several
    conventions as one profile, since each quantizes afresh)."""
    together = combined(*known) if len(known) > 1 else None
    for b in (together,) if together is not None else known:
        try:
            moved = b.run(x, spec, q)
        except (ValueError, TypeError, RuntimeError):  # an input or layout the behaviour cannot take
            moved = None
        q = q if moved is None else moved
    return q


@dataclass(frozen=True)
class _Quantized:
    """One quantize input judged: the oracle's tensor (known behaviours applied) and the
    kernel's result (a quantized tensor, or values)."""

    x: torch.Tensor
    spec: Any
    oracle: Any
    kernel: Any
    plain: Any  # the oracle's tensor, no behaviour applied

    @property
    def values(self) -> bool:
        return isinstance(self.kernel, torch.Tensor)


def _quantized(backend: Any, recipe: Recipe, case: Case, known: Sequence[Behaviour]) -> _Quantized:
    x, spec = case.tensors["x"], recipe.spec(case.operand)
    ours = _oracle(lambda: quantize_operand(x, spec, **fresh_state(recipe, case.operand)))
    theirs = _call(lambda: kernel_result(backend, x, spec, **fresh_state(recipe, case.operand)))
    return _Quantized(x, spec, _apply(known, x, spec, ours), theirs, ours)


def _judge_quantize(backend: Any, recipe: Recipe, case: Case, explain: bool, known: Sequence[Behaviour]) -> str | None:
    j = _quantized(backend, recipe, case, known)
    head = f"quantize of recipe {recipe.name}, backend {name_of(backend)}"
    # A difference counts where the kernel differs from the oracle with the known behaviours
    # and from the oracle's own bits: where it equals the latter it follows the contract, and
    # a known behaviour that reaches further than the kernel's must not make a finding.
    if j.values:
        if problem := values_problem(j.kernel, j.x):
            return f"{head}: {problem}"
        if not bool((values_differ(j.oracle, j.kernel) & values_differ(j.plain, j.kernel)).any()):
            return None
        return values_failure(backend, recipe, case.operand, j.x.to(_device(backend)), case.label) if explain \
            else "differs"
    d = diagnose_quantize.compare_quantized(j.x, j.spec, j.oracle, j.kernel, operand=case.operand, label=case.label)
    if not d.problem and not d.n_differing:
        return None
    if known and not d.problem:
        own = diagnose_quantize.compare_quantized(j.x, j.spec, j.plain, j.kernel)
        if own.differing is not None and not bool((own.differing & d.differing).any()):
            return None
    if not explain:
        return "differs"
    diagnose_quantize.attribute(d, QUANTIZE_BEHAVIOURS)
    return diagnose_quantize.report([d], 1, head)


def _outside(got: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """outside_bound, where a NaN exact output wants NaN and an infinite one the same Inf."""
    finite = torch.isfinite(exact)
    same_special = (exact.isnan() & got.double().isnan()) | (got.double() == exact)
    return torch.where(finite, outside_bound(got, exact, bound), ~same_special)


def _judged_outside(got: torch.Tensor, oracle: torch.Tensor, exact: torch.Tensor,
                    bound: torch.Tensor) -> torch.Tensor:
    """Outputs of ``got`` outside the bound, among those where the oracle's own float32 path
    lies inside it. Where it does not, float32 itself overflows or underflows on the way (a
    scale product past 2^127, an all-zero NVFP4 tensor's 0/0 tensor scale): the bound does
    not hold for any float32 kernel there, so those outputs are not judged."""
    return _outside(got, exact, bound) & ~_outside(oracle, exact, bound)


def _operands(recipe: Recipe, x: torch.Tensor, w: torch.Tensor) -> tuple[Any, Any]:
    return _oracle(lambda: (quantize_operand(x, recipe.x_row, **fresh_state(recipe, "x_row")),
                            quantize_operand(w, recipe.w_row, **fresh_state(recipe, "w_row"))))


def _judge_gemm(backend: Any, recipe: Recipe, case: Case, explain: bool, known: Sequence[Behaviour]) -> str | None:
    a, b = _operands(recipe, case.tensors["a"], case.tensors["b"])
    out_dtype, device = gemm_out_dtype(backend), _device(backend)
    got = _call(lambda: backend.gemm(_to(a, device), _to(b, device), out_dtype=out_dtype)).cpu()
    what = f"gemm of recipe {recipe.name} at {case.label}"
    exact, bound = exact_and_bound(a, b)
    if tuple(got.shape) != tuple(exact.shape):
        return f"{what}: result shape {tuple(got.shape)}, expected {tuple(exact.shape)}"
    bad = _judged_outside(got, emulated_gemm(a, b, out_dtype=out_dtype), exact, bound)
    if bool(bad.any()):  # as the GEMM check: Hopper's FP8 split accumulation is a correct kernel
        bad &= ~reproduced_by_split_accumulation(got, a, b)
    if not bool(bad.any()):
        return None
    return gemm_mismatch(what, got, a, b, exact, bound, bad, explain=True) if explain else "differs"


def _judge_linear(backend: Any, recipe: Recipe, case: Case, explain: bool, known: Sequence[Behaviour]) -> str | None:
    x, w, bias = case.tensors["x"], case.tensors["w"], case.tensors["b"]
    a, b = _operands(recipe, x, w)
    linear, reference, device = linear_of(backend), linear_of(_Reference()), _device(backend)
    on = [t.to(device) for t in (x, w, bias)]
    with torch.no_grad(), seeded_default_rng(0, on[0].device):
        _call(lambda: linear(on[0], on[1] * 2, on[2], recipe))  # a call before, with another weight
        y = _call(lambda: linear(*on, recipe)).cpu()
    with torch.no_grad(), seeded_default_rng(0):
        oracle = _oracle(lambda: reference(x, w, bias, recipe))
    what = f"linear forward of recipe {recipe.name} at {case.label} (after a call with twice the weight)"
    exact, bound = exact_and_bound(a, b)
    exact = exact + bias.double()
    bound = bound + exact.abs() * 2.0**-24  # the bias is added to the float32 accumulator
    if tuple(y.shape) != tuple(exact.shape):
        return f"{what}: output shape {tuple(y.shape)}, expected {tuple(exact.shape)}"
    bad = _judged_outside(y, oracle, exact, bound)
    if not bool(bad.any()):
        return None
    if not explain:
        return "differs"
    lines = explain_linear(y, LinearCase(recipe, x, w, bias, previous_w=w * 2))
    return "\n".join([gemm_mismatch(what, y, a, b, exact, bound, bad, explain=False), *lines])


_JUDGES = {"quantize": _judge_quantize, "gemm": _judge_gemm, "linear": _judge_linear}


def name_of(backend: Any) -> str:
    return str(getattr(backend, "name", type(backend).__name__))


def judge(prop: str, backend: Any, recipe: Recipe | str, tensors: dict[str, torch.Tensor], *,
          operand: str = "x_row", explain: bool = True, known: Sequence[str | Behaviour] = (),
          refused: Callable[[str], None] | None = None) -> str | None:
    """The property ``prop`` on one input: None when the backend agrees with the oracle (or
    declares the input refused: ``refused`` is called with the reason), else the failure
    text (``explain``: counts, blocks and causes as the conformance checks write them). A
    backend exception other than a Refusal is a failure. ``recipe``: a Recipe, a built-in
    name, a recipe file or FILE@PROFILE; ``known``: catalogue behaviours (keys) the
    quantize property takes as the oracle's own."""
    if prop not in _JUDGES:
        raise ValueError(f"prop={prop!r}; expected one of {list(_JUDGES)}")
    recipe = resolve_recipe(recipe)
    case = Case(prop, operand, tensors)
    try:
        return _JUDGES[prop](backend, recipe, case, explain, known_behaviours(known))
    except _Invalid:
        return None
    except Refused as e:
        if refused is not None:
            refused(str(e))
        return None
    except Exception as e:  # no silent green: the backend raised on a valid input
        return f"{prop} of recipe {recipe.name} at {case.label}: the backend raised {type(e).__name__}: {e}"


def cause_of(backend: Any, recipe: Recipe, case: Case, known: Sequence[Behaviour] = ()) -> Behaviour | None:
    """The one catalogue behaviour that reproduces a quantize finding exactly (with the known
    ones: the kernel's every field, or every value, equals the oracle's moved by it), or None:
    what a search takes as known to go on past this finding. Where several do on the
    finding's few values (ties toward zero and truncation agree on a tie), the one that
    reproduces the kernel best on a broader input (``_broader``) is the cause, then the
    simplest (a convention before a failure, before a whole profile). Other properties have
    none (their finding ends their search)."""
    if case.prop != "quantize":
        return None
    try:
        j = _quantized(backend, recipe, case, known)
    except (_Invalid, Refused):
        return None
    candidates = [c for c in (_with_known(known, b) for b in QUANTIZE_BEHAVIOURS if b.level == "quantize")
                  if c is not None]
    exact = [c for c in candidates if _wrong(j, c) == 0]
    if len(exact) <= 1:
        return exact[0][0] if exact else None
    wider = []
    for x in _broader(case.tensors["x"]):
        try:
            wider.append(_quantized(backend, recipe, replace(case, tensors={"x": x}), known))
        except (_Invalid, Refused):
            continue
    return min(exact, key=lambda c: sum(_wrong(w, c) for w in wider))[0]  # min keeps the first (simplest) of a tie


def _with_known(known: Sequence[Behaviour], b: Behaviour) -> tuple[Behaviour, Behaviour] | None:
    """(b, b together with the known behaviours: what the kernel would give with both), or
    None where b is known already or does not combine with them."""
    if any(k.key == b.key for k in known):
        return None
    if not known:
        return b, b
    both = combined(*known, b)
    return None if both is None else (b, both)


BROADER_SEED = 20261206
# What the broader inputs hold, each in a tensor of its own (a NaN in a tensor-scaled one
# would make every block NaN): Gaussian values, then one special among them, then an
# all-zero tensor and magnitudes near the ends of float32's range.
BROADER = ("normal", "nan", "inf", "-inf", "zeros", "tiny", "huge")


def _broader(x: torch.Tensor) -> list[torch.Tensor]:
    """Inputs shaped like the finding's (twice its rows, its dtype, seeded) where behaviours
    that agree on its few values part: one per entry of BROADER."""
    gen = torch.Generator().manual_seed(BROADER_SEED)
    out = []
    for what in BROADER:
        t = torch.randn(2 * x.shape[0], x.shape[1], generator=gen) * 3.0
        if what in ("nan", "inf", "-inf"):
            t[0, 1] = float(what)
        t = t * {"zeros": 0.0, "tiny": 2.0**-130, "huge": 2.0**120}.get(what, 1.0)
        out.append(t.to(x.dtype))
    return out


def _wrong(j: _Quantized, candidate: tuple[Behaviour, Behaviour]) -> int:
    """Where a candidate (b, b with the known behaviours) applied to the oracle's own tensor
    does not give the kernel's: elements of values, blocks of codes (every element where b
    cannot take the input)."""
    try:
        q = candidate[1].run(j.x, j.spec, j.plain)
    except (ValueError, TypeError, RuntimeError):  # an input or layout it cannot take: it reproduces nothing
        return j.x.numel()
    if q is None:  # it changes nothing on this input
        q = j.oracle
    if j.values:
        return int(values_differ(q, j.kernel).sum())
    d = diagnose_quantize.compare_quantized(j.x, j.spec, q, j.kernel)
    return d.n_differing if not d.problem else j.x.numel()
