"""Fit: the profile (every convention, and the failures no profile models) that reproduces a kernel.

A fit starts from the spec's own profile (``catalogue.spec_profile``: the oracle's bits) and
searches the profile space by coordinate descent: each move sets one profile field to one
value of the catalogue's conventions (``catalogue.CONVENTIONS``: every field of every
profile kind, each with the values real implementations use), puts a field back, or adds
or drops one failure (``catalogue.FAILURES``, applied to the candidate's tensor in the
catalogue's order). The score of a candidate is the number of blocks whose every field
equals the kernel's (NaN payloads aside): blocks reproduced, minus blocks the kernel gets
right that the candidate breaks. The best move is taken while it raises the score, so a
fit combines as many conventions as the kernel has, not pairs. Then the fewest are kept
(``_fewest``): a member whose dropping loses no block goes, and one convention alone that
reproduces as many blocks beats a combination; attribution names what the fit keeps.

Moves are screened on a few rows (those the current candidate gets wrong, and the anchor
rows that keep a tensor-wide amax) and the best few confirmed on every row, so a fit costs
a few full quantizations per convention found.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from mxcheck.diagnose.behaviour import Behaviour
from mxcheck.diagnose.catalogue import (
    CONVENTIONS,
    FAILURES,
    Convention,
    _convention_behaviour,
    combined,
    spec_profile,
)
from mxcheck.diagnose.compare import (
    _anchor_rows,
    _block_ids,
    _cpu,
    _element_diffs,
    _per_block,
    _row_separable,
    _take_rows,
    compared_fields,
)
from mxcheck.profiles import AnyProfile
from mxcheck.recipes import OperandSpec

__all__ = ["Fit", "FitCase", "fit", "fit_diffs", "profile_fields"]

SCREEN_ROWS = 8  # rows a move is screened on, per comparison
CONFIRMED = 3  # best screened moves run on every row
MAX_MOVES = 12  # conventions and failures a fit may combine


# Per element: a candidate's dequantized values differ from a values kernel's (the values
# contract's judgement, which the caller supplies: conformance.fitting.values_differ).
ValuesJudge = Callable[[Any, torch.Tensor], torch.Tensor]


@dataclass
class FitCase:
    """One comparison a fit must reproduce: the input, its spec, the oracle's tensor and the
    kernel's: a tensor of the oracle's type (codes), or with ``values_differ`` the kernel's
    dequantized values, shaped like ``x`` (a fake-quant kernel)."""

    x: torch.Tensor
    spec: OperandSpec
    oracle: Any
    kernel: Any
    label: str = ""
    values_differ: ValuesJudge | None = None
    ids: torch.Tensor = field(init=False)
    n_blocks: int = field(init=False)
    oracle_ok: torch.Tensor = field(init=False)  # per block: the oracle equals the kernel

    def __post_init__(self) -> None:
        self.x, self.oracle = self.x.detach().cpu(), _cpu(self.oracle)
        self.kernel = self.kernel.detach().cpu() if isinstance(self.kernel, torch.Tensor) else _cpu(self.kernel)
        if (self.values_differ is None) == isinstance(self.kernel, torch.Tensor):
            raise TypeError(f"kernel of {self.label or 'the comparison'} is a {type(self.kernel).__name__}: "
                            "expected a quantized tensor, or values (a tensor) with values_differ")
        _, self.ids, self.n_blocks = _block_ids(self.oracle)
        ok = _matches(self.oracle, self.kernel, self.ids, self.n_blocks, self.values_differ)
        if ok is None:
            raise ValueError(f"kernel tensor of {self.label or 'the comparison'} has another layout than the oracle's")
        self.oracle_ok = ok


def _matches(q: Any, kernel: Any, ids: torch.Tensor, n: int, values_differ: ValuesJudge | None = None,
             ) -> torch.Tensor | None:
    """Per block: q's bits equal the kernel's in every field, or with ``values_differ`` q's
    values equal the kernel's values (None: another layout)."""
    if values_differ is not None:
        if tuple(kernel.shape) != tuple(ids.shape):
            return None
        return ~_per_block(values_differ(q, kernel), ids, n)
    diffs = _element_diffs(q, kernel, compared_fields(kernel))
    if isinstance(diffs, str):
        return None
    return ~_per_block(torch.stack(list(diffs.values())).any(0), ids, n)


@dataclass(frozen=True)
class _State:
    conventions: tuple[Convention, ...] = ()  # in CONVENTIONS order
    failures: tuple[Behaviour, ...] = ()  # in FAILURES order

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for c in self.conventions:
            out.update({c.field: c.value, **dict(c.also)})
        return out

    def with_convention(self, c: Convention) -> _State | None:
        """c added (replacing a convention on the same field; None where another convention
        needs the field at another value)."""
        sets = {c.field: c.value, **dict(c.also)}
        kept = [o for o in self.conventions if o.field != c.field and not (o.field in sets and sets[o.field] != o.value)]
        for o in kept:
            for f, v in o.also:
                if f in sets and sets[f] != v:
                    return None
        order = {k: i for i, k in enumerate(CONVENTIONS)}
        return _State(tuple(sorted({*kept, c}, key=order.__getitem__)), self.failures)

    def without(self, item: Convention | Behaviour) -> _State:
        return _State(tuple(c for c in self.conventions if c is not item),
                      tuple(b for b in self.failures if b is not item))

    def with_failure(self, b: Behaviour) -> _State:
        return _State(self.conventions, tuple(f for f in FAILURES if f is b or f in self.failures))

    @property
    def size(self) -> int:
        return len(self.conventions) + len(self.failures)


def _candidate(base: AnyProfile, state: _State, x: torch.Tensor, spec: OperandSpec) -> Any:
    fields = state.fields()
    try:
        p = replace(base, **fields) if fields else base
        q = p.quantized(x, spec.fmt)
        for b in state.failures:
            moved = b.run(x, spec, q)
            q = q if moved is None else moved
    except (ValueError, TypeError, RuntimeError):
        return None
    return q


@dataclass
class _View:
    """A case restricted to some rows (or all of it): what a candidate is scored on."""

    x: torch.Tensor
    spec: OperandSpec
    kernel: Any
    ids: torch.Tensor
    n: int
    values_differ: ValuesJudge | None


def _view(case: FitCase, rows: torch.Tensor | None) -> _View:
    if rows is None:
        return _View(case.x, case.spec, case.kernel, case.ids, case.n_blocks, case.values_differ)
    oracle = _take_rows(case.oracle, rows)
    _, ids, n = _block_ids(oracle)
    kernel = case.kernel[rows] if isinstance(case.kernel, torch.Tensor) else _take_rows(case.kernel, rows)
    return _View(case.x[rows], case.spec, kernel, ids, n, case.values_differ)


def _score(base: AnyProfile, state: _State, v: _View) -> torch.Tensor | None:
    """Per block of the view: the candidate equals the kernel."""
    q = _candidate(base, state, v.x, v.spec)
    return None if q is None else _matches(_cpu(q), v.kernel, v.ids, v.n, v.values_differ)


def profile_fields(p: AnyProfile) -> dict[str, Any]:
    """Every field of a profile but its name, source and notes."""
    return {f: getattr(p, f) for f in p.__dataclass_fields__ if f not in ("name", "source", "notes")}


@dataclass(frozen=True)
class Fit:
    """The profile that reproduces the kernel best: ``base`` with ``conventions`` (and the
    ``failures`` on top), block counts over every comparison it was fitted on."""

    base: AnyProfile
    conventions: tuple[Convention, ...]
    failures: tuple[Behaviour, ...]
    blocks: int
    matched: int  # blocks whose every field equals the kernel's
    differing: int  # blocks where the oracle differs from the kernel
    reproduced: int  # of those, blocks the fit reproduces
    broken: int  # blocks the oracle gets right that the fit does not
    residual_by_case: tuple[tuple[str, int], ...] = ()

    @property
    def residual(self) -> int:
        """Blocks the fitted profile does not reproduce."""
        return self.blocks - self.matched

    @property
    def fields(self) -> dict[str, Any]:
        """The profile fields the fit sets otherwise than ``base``."""
        return {f: v for f, v in _State(self.conventions, self.failures).fields().items() if getattr(self.base, f) != v}

    @property
    def size(self) -> int:
        """Conventions and failures the fit combines."""
        return len(self.conventions) + len(self.failures)

    def behaviour(self) -> Behaviour | None:
        """The fit as one catalogue behaviour (its conventions, then its failures; None when
        it changes nothing)."""
        parts = [*(_convention_behaviour(c) for c in self.conventions), *self.failures]
        return None if not parts else parts[0] if len(parts) == 1 else combined(*parts)

    @property
    def exact(self) -> bool:
        return self.residual == 0

    def profile(self, name: str | None = None) -> AnyProfile:
        """The fitted profile (failures are not profile fields: see ``failures``)."""
        fields = self.fields
        notes = tuple(f"not a profile field: {b.key} ({b.title})" for b in self.failures)
        return replace(self.base, name=name or f"{self.base.name}.fitted", **fields,
                       source=f"mxcheck fit from {self.base.name}", notes=notes)

    def text(self, name: str | None = None) -> str:
        """e.g. ``ocp = profile(scale_rule=even, zero_sign=negative_values) + residual 10 blocks (inf-nan input)``."""
        shown = ", ".join(f"{f}={_value(v)}" for f, v in self.fields.items()) or "as declared"
        fails = "".join(f" + failure {b.key}" for b in self.failures)
        where = ", ".join(f"{label}: {n:,}" for label, n in self.residual_by_case if n)
        tail = f" + residual {self.residual:,} blocks" + (f" ({where})" if where else "") if self.residual else \
            " + residual 0 blocks"
        return f"{name or self.base.name} = profile({shown}){fails}{tail}"


def _value(v: Any) -> str:
    if isinstance(v, float) and v > 0 and math.frexp(v)[0] == 0.5:
        return f"2^{math.frexp(v)[1] - 1}"
    return repr(v) if isinstance(v, str) else str(v)


def _moves(base: AnyProfile, state: _State) -> list[_State]:
    out: list[_State] = []
    fields = state.fields()
    for c in CONVENTIONS:
        if c.kind is not type(base) or c in state.conventions:
            continue
        if fields.get(c.field, getattr(base, c.field)) == c.value and not c.also:
            continue
        s = state.with_convention(c)
        if s is not None:
            out.append(s)
    out += [state.without(c) for c in state.conventions]
    out += [state.without(b) if b in state.failures else state.with_failure(b) for b in FAILURES]
    return out


def _screen_rows(case: FitCase, ok: torch.Tensor) -> torch.Tensor | None:
    """Rows holding blocks the current candidate gets wrong (the first few), and the
    anchor rows; None where blocks do not lie within rows."""
    if not _row_separable(case.oracle):
        return None
    per_row = case.n_blocks // case.oracle.codes.shape[0]
    wrong = torch.unique((~ok).nonzero().flatten() // per_row)[:SCREEN_ROWS]
    right = torch.unique(ok.nonzero().flatten() // per_row)[:2]  # a few right rows: a move must not break them
    return torch.unique(torch.cat([wrong, right, _anchor_rows(case.x)]))


def fit(cases: Sequence[FitCase], start: Fit | None = None) -> Fit | None:
    """The fit over ``cases`` (comparisons of one spec: one profile must reproduce them all),
    starting from ``start``'s conventions when given; None where profiles cannot model
    the spec (``spec_profile``)."""
    if not cases:
        return None
    base = spec_profile(cases[0].spec, cases[0].x)
    if base is None or any(spec_profile(c.spec, c.x) != base for c in cases[1:]):
        return None
    state = _State() if start is None or start.base != base else _State(start.conventions, start.failures)
    whole = [_view(c, None) for c in cases]
    oks = [_score(base, state, v) for v in whole]
    if any(ok is None for ok in oks):
        state, oks = _State(), [c.oracle_ok for c in cases]
    while state.size < MAX_MOVES and not all(bool(ok.all()) for ok in oks):
        views = [_view(c, _screen_rows(c, ok)) for c, ok in zip(cases, oks, strict=True)]
        now = [_score(base, state, v) for v in views]
        if any(n is None for n in now):
            break
        gains = []
        for move in _moves(base, state):
            got = [_score(base, move, v) for v in views]
            if all(g is not None for g in got):
                gain = sum(int(g.sum()) - int(n.sum()) for g, n in zip(got, now, strict=True))
                if gain > 0:
                    gains.append((gain, -move.size, move))
        gains.sort(key=lambda t: (-t[0], -t[1]))
        best, best_oks = None, oks
        for _, _, move in gains[:CONFIRMED]:
            full = [_score(base, move, v) for v in whole]
            if any(f is None for f in full):
                continue
            if sum(int(f.sum()) for f in full) > sum(int(o.sum()) for o in best_oks):
                best, best_oks = move, full
        if best is None:
            break
        state, oks = best, best_oks
    state, oks = _fewest(base, state, cases, oks)
    return _result(base, state, cases, oks)


def _matched(oks: list[torch.Tensor]) -> int:
    return sum(int(ok.sum()) for ok in oks)


def _fewest(base: AnyProfile, state: _State, cases: Sequence[FitCase],
            oks: list[torch.Tensor]) -> tuple[_State, list[torch.Tensor]]:
    """The fewest conventions and failures that reproduce as many blocks: a member whose
    dropping loses no block is dropped (a combination is named only where every member is
    needed: a fit that started from another comparison's keeps members this one does not
    need), and one convention or failure alone that reproduces as many blocks beats a
    combination (screened on a few rows first, as moves are)."""
    whole = [_view(c, None) for c in cases]
    dropped = True
    while dropped and state.size > 1:
        dropped = False
        for member in (*state.conventions, *state.failures):
            fewer = state.without(member)
            full = [_score(base, fewer, v) for v in whole]
            if all(f is not None for f in full) and _matched(full) >= _matched(oks):
                state, oks, dropped = fewer, full, True
                break
    if state.size <= 1:
        return state, oks
    views = [_view(c, _screen_rows(c, ok)) for c, ok in zip(cases, oks, strict=True)]
    now = [_score(base, state, v) for v in views]
    if any(n is None for n in now):
        return state, oks
    singles = [m for m in _moves(base, _State()) if m.size == 1]
    for single in singles:  # CONVENTIONS order, then FAILURES: the first of equals wins
        got = [_score(base, single, v) for v in views]
        if any(g is None for g in got) or _matched(got) < _matched(now):
            continue
        full = [_score(base, single, v) for v in whole]
        if all(f is not None for f in full) and _matched(full) >= _matched(oks):
            return single, full
    return state, oks


def _result(base: AnyProfile, state: _State, cases: Sequence[FitCase], oks: list[torch.Tensor]) -> Fit:
    blocks = sum(c.n_blocks for c in cases)
    matched = sum(int(ok.sum()) for ok in oks)
    differing = sum(int((~c.oracle_ok).sum()) for c in cases)
    reproduced = sum(int((ok & ~c.oracle_ok).sum()) for c, ok in zip(cases, oks, strict=True))
    broken = sum(int((~ok & c.oracle_ok).sum()) for c, ok in zip(cases, oks, strict=True))
    residual = tuple((c.label, int((~ok).sum())) for c, ok in zip(cases, oks, strict=True))
    return Fit(base, state.conventions, state.failures, blocks, matched, differing, reproduced, broken, residual)


def fit_diffs(diffs: Sequence[Any], start: Fit | None = None) -> Fit | None:
    """The fit over failing comparisons of one spec (``quantize.compare_quantized``'s results)."""
    cases = [FitCase(d.x, d.spec, d.oracle, d.kernel, d.label) for d in diffs if not d.problem]
    return fit(cases, start)
