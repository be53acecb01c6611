"""A search for the smallest input on which a backend differs from the oracle (Hypothesis).

Three properties, each the oracle's own judgement of one entry point of the Backend
protocol, on inputs Hypothesis builds (``conformance.search_inputs``):

- ``quantize``: the backend's quantization of x_row or w_row equals the oracle's bit for bit,
  every field of the contract (``diagnose.quantize.compare_quantized``, as check_quantize);
- ``gemm``: the backend's GEMM of the oracle's quantized operands lies inside the
  fp32-accumulation bound of their exact GEMM (``diagnose.outputs``, as check_gemm);
- ``linear``: the backend's forward (after one call with another weight, as
  check_weight_change) lies inside the same bound around the exact GEMM of the oracle's
  quantized x_row and w_row plus the bias; NaN where the exact output is NaN (check_nan).

An output is judged only where the oracle's own float32 GEMM lies inside the bound: where
float32 overflows on the way (a partial sum past 2^128), no float32 kernel is held to it.

Hypothesis shrinks a failing input toward one block, the fewest nonzero values and the
simplest magnitudes; :func:`judge` then explains it as the checks do (counts, blocks,
causes), and ``conformance.search_repro`` writes it as a script that runs alone.
Hypothesis is imported only when a search runs (the ``search`` extra).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from mxcheck.backends.contract import Refusal
from mxcheck.conformance._common import _Reference, fresh_state, gemm_out_dtype, linear_of
from mxcheck.conformance.search_inputs import Case, Geometry, cases, geometry_of, size_of
from mxcheck.diagnose import quantize as diagnose_quantize
from mxcheck.diagnose.catalogue import QUANTIZE_BEHAVIOURS
from mxcheck.diagnose.linear import LinearCase, explain_linear
from mxcheck.diagnose.outputs import exact_and_bound, gemm_mismatch, outside_bound
from mxcheck.gemm import emulated_gemm, quantize_operand
from mxcheck.recipes import Recipe, get_recipe
from mxcheck.rng import seeded_default_rng

__all__ = ["PROPERTIES", "Finding", "SearchResult", "judge", "require_hypothesis", "search"]

PROPERTIES = ("quantize", "gemm", "linear")
FIRST_TURN = 5  # examples of a property's first turn, before its rate is known
CHUNK = 40  # examples per Hypothesis run; the properties take turns, chunk by chunk, until the time is up
INSTALL_HINT = "pip install hypothesis (or pip install 'mxcheck[search]')"


def require_hypothesis() -> Any:
    """The hypothesis module, or ImportError saying how to install it."""
    try:
        import hypothesis  # noqa: PLC0415  (an optional dependency: only a search needs it)
    except ImportError as e:
        raise ImportError(f"the mxcheck search needs Hypothesis, which is not importable ({e}): {INSTALL_HINT}") \
            from None
    return hypothesis


# ---- the properties: None when the backend agrees, else what differs ----------------------------

_INVALID = "invalid"  # the oracle cannot take the input, or the backend refused it (declared): no verdict


class _Invalid(Exception):
    pass


def _oracle(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ValueError as e:  # the oracle's argument check: an input it cannot quantize
        raise _Invalid(str(e)) from e


def _call(what: str, fn: Callable[[], Any]) -> Any:
    """The backend's call; a Refusal is no verdict, any other exception is the finding."""
    try:
        return fn()
    except Refusal as e:
        raise _Invalid(str(e)) from e


def _judge_quantize(backend: Any, recipe: Recipe, case: Case, explain: bool) -> str | None:
    x, spec = case.tensors["x"], recipe.spec(case.operand)
    ours = _oracle(lambda: quantize_operand(x, spec, **fresh_state(recipe, case.operand)))
    theirs = _call("quantize", lambda: backend.quantize(x, spec, **fresh_state(recipe, case.operand)))
    d = diagnose_quantize.compare_quantized(x, spec, ours, theirs, operand=case.operand, label=case.label)
    if not d.problem and not d.n_differing:
        return None
    if not explain:
        return "differs"
    diagnose_quantize.attribute(d, QUANTIZE_BEHAVIOURS)
    return diagnose_quantize.report([d], 1, f"quantize of recipe {recipe.name}, backend {_name(backend)}")


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


def _judge_gemm(backend: Any, recipe: Recipe, case: Case, explain: bool) -> str | None:
    a, b = _operands(recipe, case.tensors["a"], case.tensors["b"])
    out_dtype = gemm_out_dtype(backend)
    got = _call("gemm", lambda: backend.gemm(a, b, out_dtype=out_dtype))
    what = f"gemm of recipe {recipe.name} at {case.label}"
    exact, bound = exact_and_bound(a, b)
    if tuple(got.shape) != tuple(exact.shape):
        return f"{what}: result shape {tuple(got.shape)}, expected {tuple(exact.shape)}"
    bad = _judged_outside(got, emulated_gemm(a, b, out_dtype=out_dtype), exact, bound)
    if not bool(bad.any()):
        return None
    return gemm_mismatch(what, got, a, b, exact, bound, bad, explain=True) if explain else "differs"


def _judge_linear(backend: Any, recipe: Recipe, case: Case, explain: bool) -> str | None:
    x, w, bias = case.tensors["x"], case.tensors["w"], case.tensors["b"]
    a, b = _operands(recipe, x, w)
    linear, reference = linear_of(backend), linear_of(_Reference())
    with torch.no_grad(), seeded_default_rng(0):
        _call("linear", lambda: linear(x, w * 2, bias, recipe))  # a call before, with another weight
        y = _call("linear", lambda: linear(x, w, bias, recipe))
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


def _name(backend: Any) -> str:
    return str(getattr(backend, "name", type(backend).__name__))


def judge(prop: str, backend: Any, recipe: Recipe | str, tensors: dict[str, torch.Tensor], *,
          operand: str = "x_row", explain: bool = True) -> str | None:
    """The property ``prop`` on one input: None when the backend agrees with the oracle (or
    declares the input refused), else the failure text (``explain``: counts, blocks and
    causes as the conformance checks write them). A backend exception other than a
    Refusal is a failure."""
    if prop not in _JUDGES:
        raise ValueError(f"prop={prop!r}; expected one of {list(_JUDGES)}")
    recipe = get_recipe(recipe)
    case = Case(prop, operand, tensors)
    try:
        return _JUDGES[prop](backend, recipe, case, explain)
    except _Invalid:
        return None
    except Exception as e:  # no silent green: the backend raised on a valid input
        return f"{prop} of recipe {recipe.name} at {case.label}: the backend raised {type(e).__name__}: {e}"


def _why_not(prop: str, backend: Any, recipe: Recipe) -> str | None:
    """Why ``prop`` cannot run on this backend and recipe, or None."""
    if prop == "quantize" and not hasattr(backend, "quantize"):
        return "backend has no quantize"
    if prop == "gemm" and not hasattr(backend, "gemm"):
        return "backend has no gemm"
    if prop == "linear" and linear_of(backend) is None:
        return "backend has neither linear nor gemm"
    if prop in ("gemm", "linear") and "sr" in (recipe.x_row.rounding, recipe.w_row.rounding):
        return f"recipe {recipe.name} rounds a forward operand stochastically (the search compares exact bits)"
    if prop == "quantize" and all(recipe.spec(op).rounding == "sr" for op in ("x_row", "w_row")):
        return f"recipe {recipe.name} rounds x_row and w_row stochastically"
    return None


# ---- the search ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """The smallest failing input Hypothesis found for one property, and what differs on it."""

    prop: str
    case: Case
    message: str
    seconds: float  # from the start of this property's search to the shrunk input
    examples: int  # examples tried up to the find (shrinking included)

    @property
    def size(self) -> dict[str, Any]:
        return size_of(self.case)


@dataclass
class SearchResult:
    backend: str
    recipe: str
    seed: int
    findings: list[Finding] = field(default_factory=list)
    examples: dict[str, int] = field(default_factory=dict)  # property -> examples tried
    seconds: dict[str, float] = field(default_factory=dict)  # property -> time spent
    skipped: dict[str, str] = field(default_factory=dict)  # property -> why it did not run

    @property
    def failed(self) -> bool:
        return bool(self.findings)

    def rate(self, prop: str) -> float:
        """Examples per second of ``prop``."""
        return self.examples.get(prop, 0) / max(self.seconds.get(prop, 0.0), 1e-9)


def _settings(hypothesis: Any, examples: int) -> Any:
    # No explain phase: it reruns the shrunk example many times to say which parts matter,
    # which the diagnosis below says better (and it took most of a short search's time).
    phases = [p for p in hypothesis.Phase if p.name != "explain"]
    return hypothesis.settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                               suppress_health_check=list(hypothesis.HealthCheck), phases=phases)


def _find(hypothesis: Any, strategy: Any, fails: Callable[[Case], bool], examples: int,
          rnd: random.Random) -> Case | None:
    # No example database: Hypothesis keeps none for a seeded run, and the seed is what
    # makes a search repeatable; the reproducer is what a finding leaves behind.
    try:
        return hypothesis.find(strategy, fails, settings=_settings(hypothesis, examples), random=rnd)
    except hypothesis.errors.NoSuchExample:
        return None


def search(factory: Callable[[], Any], recipe: Recipe | str, *, seconds: float, seed: int = 0,
           properties: Sequence[str] = PROPERTIES, chunk: int = CHUNK,
           max_examples: int | None = None) -> SearchResult:
    """Search each property for ``seconds`` in all (they take turns, ``chunk`` examples at a
    time, a fresh Hypothesis run with its own seed each turn, until one fails or the time
    or ``max_examples`` per property is spent). ``factory`` makes the backend; every
    example gets a fresh one, so a backend that keeps state between calls is judged on
    each input alone. Deterministic under ``seed`` (the
    examples tried; how many turns fit in ``seconds`` depends on the machine)."""
    hypothesis = require_hypothesis()
    unknown = [p for p in properties if p not in PROPERTIES]
    if unknown or not properties:
        raise ValueError(f"properties={list(properties)!r}; expected a non-empty list of {list(PROPERTIES)}")
    if not seconds > 0:
        raise ValueError(f"seconds={seconds!r}; expected a number of seconds > 0")
    recipe = get_recipe(recipe)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the inputs are a few blocks: a thread pool costs more than it gives
    try:
        return _search(hypothesis, factory, recipe, seconds, seed, properties, chunk, max_examples)
    finally:
        torch.set_num_threads(threads)


def _search(hypothesis: Any, factory: Callable[[], Any], recipe: Recipe, seconds: float, seed: int,
            properties: Sequence[str], chunk: int, max_examples: int | None) -> SearchResult:
    probe = factory()
    result = SearchResult(_name(probe), recipe.name, seed)
    live: dict[str, Geometry] = {}
    ok, why_not_here = probe.available() if hasattr(probe, "available") else (True, "")
    if ok and hasattr(probe, "supports"):
        ok, why_not_here = probe.supports(recipe)
        why_not_here = f"does not support recipe {recipe.name}: {why_not_here}"
    for prop in properties:
        why = None if ok else why_not_here or "not available here"
        why = why or _why_not(prop, probe, recipe)
        geometry = None if why else geometry_of(prop, recipe, getattr(probe, "input_dtypes", None))
        if why or isinstance(geometry, str):
            result.skipped[prop] = why or str(geometry)
        else:
            live[prop] = geometry
            result.examples[prop], result.seconds[prop] = 0, 0.0
    deadline = time.monotonic() + seconds
    order, turns = list(live), dict.fromkeys(live, 0)
    best: dict[str, Finding] = {}  # a finding over more than one block: searched on for a smaller one
    while live and time.monotonic() < deadline:
        prop = order[sum(turns.values()) % len(order)]
        if prop not in live:  # found already: its turn passes
            turns[prop] += 1
            continue
        left = max_examples - result.examples[prop] if max_examples is not None else chunk
        if left <= 0:
            live.pop(prop)
            continue
        # Turns of FIRST_TURN, twice that, ... up to ``chunk`` examples: a slow property
        # overruns the deadline by one short turn at first, and the examples tried depend
        # on the seed and the turn only (never on the machine's speed), so a seed repeats.
        n = max(1, min(chunk, left, FIRST_TURN << min(turns[prop], 8)))
        turns[prop] += 1
        fewer = best[prop].size["blocks"] if prop in best else None
        found = _turn(hypothesis, factory, recipe, prop, live[prop], result, seed, turns[prop], n, fewer)
        if found is not None:
            best[prop] = found
            if found.size["blocks"] <= 1:
                live.pop(prop)
    result.findings = [best[p] for p in order if p in best]
    return result


SPARSIFY_BUDGET = 400  # property evaluations spent zeroing values Hypothesis's shrinker left


def _zero_out(case: Case, fails: Callable[[Case], bool], budget: int) -> Case:
    """The case with as many values set to zero as keep it failing (delta debugging: runs of
    nonzero values, halving in length). Hypothesis shrinks a dense fill to zeros only when
    nothing else must change at once; a failure that needs one value of the fill (a rounding
    tie) keeps the whole fill there, and this finds the few values that matter."""
    tensors = dict(case.tensors)
    for name in tensors:
        idx = torch.nonzero(tensors[name].reshape(-1)).flatten().tolist()
        size = max(len(idx) // 2, 1)
        while idx and budget > 0:
            i = 0
            while i < len(idx) and budget > 0:
                trial = tensors[name].clone()
                trial.view(-1)[idx[i:i + size]] = 0
                budget -= 1
                candidate = replace(case, tensors={**tensors, name: trial})
                if fails(candidate):
                    tensors[name], idx = trial, idx[:i] + idx[i + size:]
                else:
                    i += size
            if size == 1:
                break
            size //= 2
    return replace(case, tensors=tensors)


def _turn(hypothesis: Any, factory: Callable[[], Any], recipe: Recipe, prop: str, geometry: Geometry,
          result: SearchResult, seed: int, turn: int, chunk: int,
          fewer_blocks: int | None = None) -> Finding | None:
    """One Hypothesis run of ``chunk`` examples of ``prop``; the shrunk failure, or None.
    ``fewer_blocks``: only a failure spanning fewer blocks than that counts (a shrunk
    failure can be a local minimum: a NaN in a 2D tile that only a second tile shows)."""
    counted = [0]

    def fails(case: Case) -> bool:
        counted[0] += 1
        if fewer_blocks is not None and max(case.blocks.values()) >= fewer_blocks:
            return False
        return judge(prop, factory(), recipe, case.tensors, operand=case.operand, explain=False) is not None

    start = time.monotonic()
    rnd = random.Random(f"{seed}:{prop}:{turn}")
    # after a failure over several blocks, only one-block inputs are drawn
    case = _find(hypothesis, cases(prop, geometry, one_block=fewer_blocks is not None), fails, chunk, rnd)
    result.examples[prop] += counted[0]
    result.seconds[prop] += time.monotonic() - start
    if case is None:
        return None
    case = _zero_out(case, fails, SPARSIFY_BUDGET)
    message = judge(prop, factory(), recipe, case.tensors, operand=case.operand) or "differs (not on a rerun)"
    return Finding(prop, case, message, result.seconds[prop], result.examples[prop])
