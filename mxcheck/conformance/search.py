"""A search for the smallest inputs on which a backend differs from the oracle (Hypothesis).

The properties (``quantize``, ``gemm``, ``linear``) are the oracle's own judgement of one
input, in ``conformance.search_judge``. Hypothesis drives them on inputs built so that
shrinking simplifies them (``conformance.search_inputs``) and shrinks a failure toward one
block, the fewest nonzero values and the simplest magnitudes; :func:`judge` then explains it
as the checks do (counts, blocks, causes), and ``conformance.search_repro`` writes it as a
script that runs alone.

A search goes past its first finding. A quantize finding shrunk to one block whose cause
one catalogue behaviour reproduces exactly is taken as *known* (the oracle with it applied
is what the kernel must equal from then on), and the property searches on for the next
one; a finding with no such cause, or of the gemm or linear property, ends its property.
So one run reports every distinct finding it reaches in its time, each once. What is known
already can be given: ``known`` (catalogue behaviours), or a recipe file whose profile
states the kernel's conventions (``mxcheck fit --write``).
Hypothesis is imported only when a search runs (the ``search`` extra).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from mxcheck.conformance.search_inputs import Case, Geometry, cases, geometry_of, size_of
from mxcheck.conformance.search_judge import PROPERTIES, cause_of, judge, known_behaviours, name_of
from mxcheck.diagnose.behaviour import Behaviour
from mxcheck.recipe_files import resolve_recipe
from mxcheck.recipes import Recipe

__all__ = ["PROPERTIES", "Finding", "SearchResult", "judge", "require_hypothesis", "search"]

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


def _why_not(prop: str, backend: Any, recipe: Recipe) -> str | None:
    """Why ``prop`` cannot run on this backend and recipe, or None."""
    from mxcheck.conformance._common import linear_of  # noqa: PLC0415

    if prop == "quantize" and not hasattr(backend, "quantize") and not hasattr(backend, "fake_quantize"):
        return "backend has neither quantize nor fake_quantize"
    if prop == "gemm" and not hasattr(backend, "gemm"):
        return "backend has no gemm"
    if prop == "linear" and linear_of(backend) is None:
        return "backend has neither linear, gemm nor fake_quantize"
    if prop in ("gemm", "linear") and "sr" in (recipe.x_row.rounding, recipe.w_row.rounding):
        return f"recipe {recipe.name} rounds a forward operand stochastically (the search compares exact bits)"
    if prop == "quantize" and all(recipe.spec(op).rounding == "sr" for op in ("x_row", "w_row")):
        return f"recipe {recipe.name} rounds x_row and w_row stochastically"
    return None


# ---- the search ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """The smallest failing input Hypothesis found for one property, and what differs on it.
    ``cause``: the one catalogue behaviour that reproduces it exactly (None: none does);
    ``known``: the behaviours taken as the oracle's own when it was found (the reproducer
    passes them to ``judge``)."""

    prop: str
    case: Case
    message: str
    seconds: float  # from the start of this property's search to the shrunk input
    examples: int  # examples tried up to the find (shrinking included)
    cause: Behaviour | None = None
    known: tuple[str, ...] = ()

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
    refused: dict[str, int] = field(default_factory=dict)  # property -> examples the backend refused
    refusal: dict[str, str] = field(default_factory=dict)  # property -> the first refusal's reason
    known: tuple[str, ...] = ()  # behaviours given as known

    @property
    def failed(self) -> bool:
        return bool(self.findings)

    def judged(self, prop: str) -> int:
        """Examples of ``prop`` the backend took (not refused)."""
        return self.examples.get(prop, 0) - self.refused.get(prop, 0)

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
           max_examples: int | None = None, known: Sequence[str | Behaviour] = (),
           stop_after: int | None = None) -> SearchResult:
    """Search each property for ``seconds`` in all (they take turns, ``chunk`` examples at a
    time, a fresh Hypothesis run with its own seed each turn, until the time or
    ``max_examples`` per property is spent, or every property has ended at a finding it
    cannot go past). ``factory`` makes the backend; every example gets a fresh one, so a
    backend that keeps state between calls is judged on each input alone. ``recipe``: a
    Recipe, a built-in name, a recipe file or FILE@PROFILE; ``known``: catalogue behaviours
    (keys) the quantize property takes as the oracle's own; ``stop_after``: findings after
    which a property ends (None: it goes on while it can). Deterministic under ``seed`` (the
    examples tried; how many turns fit in ``seconds`` depends on the machine)."""
    hypothesis = require_hypothesis()
    unknown = [p for p in properties if p not in PROPERTIES]
    if unknown or not properties:
        raise ValueError(f"properties={list(properties)!r}; expected a non-empty list of {list(PROPERTIES)}")
    if not seconds > 0:
        raise ValueError(f"seconds={seconds!r}; expected a number of seconds > 0")
    recipe = resolve_recipe(recipe)
    given = known_behaviours(known)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the inputs are a few blocks: a thread pool costs more than it gives
    try:
        return _search(hypothesis, factory, recipe, seconds, seed, properties, chunk, max_examples, given, stop_after)
    finally:
        torch.set_num_threads(threads)


def _live(probe: Any, recipe: Recipe, properties: Sequence[str], result: SearchResult) -> dict[str, Geometry]:
    """The properties that can run on this backend and recipe, with their geometry; the
    others go to ``result.skipped`` with the reason."""
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
            result.examples[prop], result.seconds[prop], result.refused[prop] = 0, 0.0, 0
    return live


def _search(hypothesis: Any, factory: Callable[[], Any], recipe: Recipe, seconds: float, seed: int,
            properties: Sequence[str], chunk: int, max_examples: int | None,
            given: tuple[Behaviour, ...], stop_after: int | None = None) -> SearchResult:
    result = SearchResult(name_of(factory()), recipe.name, seed, known=tuple(b.key for b in given))
    live = _live(factory(), recipe, properties, result)
    deadline = time.monotonic() + seconds
    order, turns = list(live), dict.fromkeys(live, 0)
    known = {p: given if p == "quantize" else () for p in live}
    best: dict[str, Finding] = {}  # a finding over more than one block: searched on for a smaller one

    def settle(prop: str) -> None:
        """Report ``best[prop]``, named by its cause; take the cause as known and search on, or
        end the property where there is none (a finding cannot be moved past without one)."""
        f = best.pop(prop)
        cause = cause_of(factory(), recipe, f.case, known[prop])  # never one known already
        result.findings.append(replace(f, cause=cause, known=tuple(b.key for b in known[prop])))
        if cause is None or (stop_after is not None and sum(g.prop == prop for g in result.findings) >= stop_after):
            live.pop(prop, None)
        else:
            known[prop] = (*known[prop], cause)

    while live and time.monotonic() < deadline:
        prop = order[sum(turns.values()) % len(order)]
        if prop not in live:  # ended already: its turn passes
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
        found = _turn(hypothesis, factory, recipe, prop, live[prop], result, seed, turns[prop], n, fewer, known[prop])
        if found is not None:
            best[prop] = found
            if found.size["blocks"] <= 1:
                settle(prop)
    for prop in [p for p in order if p in best]:  # over several blocks when the time ran out
        settle(prop)
    result.findings.sort(key=lambda f: order.index(f.prop))
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
          fewer_blocks: int | None = None, known: tuple[Behaviour, ...] = ()) -> Finding | None:
    """One Hypothesis run of ``chunk`` examples of ``prop``; the shrunk failure, or None.
    ``fewer_blocks``: only a failure spanning fewer blocks than that counts (a shrunk
    failure can be a local minimum: a NaN in a 2D tile that only a second tile shows);
    ``known``: behaviours the oracle takes as its own."""
    counted = [0]

    def refused(reason: str) -> None:
        result.refused[prop] += 1
        result.refusal.setdefault(prop, reason)

    def fails(case: Case) -> bool:
        counted[0] += 1
        if fewer_blocks is not None and max(case.blocks.values()) >= fewer_blocks:
            return False
        return judge(prop, factory(), recipe, case.tensors, operand=case.operand, explain=False, known=known,
                     refused=refused) is not None

    start = time.monotonic()
    rnd = random.Random(f"{seed}:{prop}:{turn}")
    # after a failure over several blocks, only one-block inputs are drawn
    case = _find(hypothesis, cases(prop, geometry, one_block=fewer_blocks is not None), fails, chunk, rnd)
    result.examples[prop] += counted[0]
    result.seconds[prop] += time.monotonic() - start
    if case is None:
        return None
    case = _zero_out(case, fails, SPARSIFY_BUDGET)
    message = judge(prop, factory(), recipe, case.tensors, operand=case.operand, known=known) \
        or "differs (not on a rerun)"
    return Finding(prop, case, message, result.seconds[prop], result.examples[prop])
