"""The quantize catalogue: every behaviour attribution tries on a quantized operand.

Every entry is a :class:`~mxcheck.diagnose.behaviour.Behaviour` of level "quantize": given
the input, the operand's spec and the oracle's tensor, it returns the tensor a kernel with
that behaviour makes (same type and fields as the oracle's), or None where it does not
apply. This module assembles them; each source is its own module, all data:

- conventions (``mxcheck.diagnose.conventions``): one profile field at another value;
- every registered profile (``mxcheck.profiles.ALL_PROFILES``) of the spec's scaling (here);
- failures no profile models (``mxcheck.diagnose.failures``), and scales held in too narrow
  a type (``mxcheck.diagnose.precision``);
- ``combined``: several conventions at once, failures applied after them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mxcheck.diagnose.behaviour import Behaviour
from mxcheck.diagnose.conventions import (
    CONVENTION_OF,
    CONVENTIONS,
    Convention,
    _convention_run,
    convention_behaviour,
    spec_profile,
)
from mxcheck.diagnose.failures import (
    FAILURES,
    NOT_BLOCK_BEHAVIOURS,
    ZERO_BLOCK_BYTES,
    element_format,
)
from mxcheck.diagnose.precision import PRECISION_FAILURES
from mxcheck.profiles import ALL_PROFILES
from mxcheck.recipes import OperandSpec

__all__ = ["CONVENTIONS", "CONVENTION_OF", "FAILURES", "NOT_BLOCK_BEHAVIOURS", "PRECISION_FAILURES",
           "QUANTIZE_BEHAVIOURS", "ZERO_BLOCK_BYTES", "Convention", "combined", "element_format",
           "spec_profile"]

_convention_behaviour = convention_behaviour  # the name mxcheck.diagnose.fit imports


# ---- registered profiles -------------------------------------------------------------------


def _profile_run(name: str) -> Callable[..., Any]:
    def run(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
        p = ALL_PROFILES[name]
        base = spec_profile(spec, x)
        if base is None or type(base) is not type(p) or spec.profile == name:
            return None
        if p.fmt not in (None, spec.fmt) or getattr(p, "block_size", spec.block_size) != spec.block_size:
            return None
        return p.quantized(x, spec.fmt)
    return run


def _profile_behaviour(name: str) -> Behaviour:
    p = ALL_PROFILES[name]
    return Behaviour(f"profile={name}", f"quantizes as profile {name}", "quantize", _profile_run(name),
                     seen_in=p.source.split(" @")[0] if p.source else "")


def combined(*behaviours: Behaviour) -> Behaviour | None:
    """Several conventions at once (one kernel may do three: the even rule, -0 lost, an Inf
    byte), with failures (``FAILURES``) applied to their tensor after, in the order given;
    None where a behaviour is neither, the conventions are of two kinds, or they set one
    field to two values."""
    convs = [CONVENTION_OF.get(b.key) for b in behaviours]
    failures = [b for b, c in zip(behaviours, convs, strict=True) if c is None]
    convs = [c for c in convs if c is not None]
    if len(behaviours) < 2 or any(b not in FAILURES for b in failures) or len({c.kind for c in convs}) > 1:
        return None
    fields: dict[str, Any] = {}
    for c in convs:
        for f, v in ((c.field, c.value), *c.also):
            if fields.setdefault(f, v) != v:
                return None
    title = ", together with ".join(b.title for b in behaviours)
    cases = tuple(sorted({n for b in behaviours for n in b.cases}))
    seen = "; ".join(filter(None, (b.seen_in for b in behaviours)))
    key = " & ".join(b.key for b in behaviours)
    if convs:
        a = convs[0]
        first = _convention_run(Convention(a.kind, a.field, a.value, title, cases, seen,
                                           tuple((f, v) for f, v in fields.items() if f != a.field)))
    else:
        def first(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
            return oracle

    def run(x: torch.Tensor, spec: OperandSpec, oracle: Any) -> Any:
        q = first(x, spec, oracle) if convs else oracle
        if q is None:  # the conventions change nothing on this input (no all-zero block): failures still apply
            if not failures:
                return None
            q = oracle
        for b in failures:
            moved = b.run(x, spec, q)
            q = q if moved is None else moved
        return q
    return Behaviour(key, title, "quantize", run, cases, seen)


QUANTIZE_BEHAVIOURS: tuple[Behaviour, ...] = (
    *(_convention_behaviour(c) for c in CONVENTIONS),
    *FAILURES,
    *PRECISION_FAILURES,
    *ZERO_BLOCK_BYTES,
    *(_profile_behaviour(name) for name in ALL_PROFILES),
)
