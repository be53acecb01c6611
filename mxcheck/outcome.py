"""What every numeric check returns and how it fails: :class:`NumericsError`, the
:class:`Outcome` of a check (its value, pass/fail, message and the report fields it fills)
and the context line that names the comparison (backend, recipe, layer, direction, M/N/K).

The assertions (``mxcheck.assertions``), the determinism check (``mxcheck.determinism``),
the precision-manifest check (``mxcheck.manifest``) and the report recorder
(``mxcheck.report.recorder``) all build on these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CONTEXT_KEYS", "Context", "NumericsError", "Outcome", "raise_unless", "say"]

Context = Mapping[str, object] | None
CONTEXT_KEYS = ("backend", "recipe", "layer", "direction", "m", "n", "k")


class NumericsError(AssertionError):
    """A numeric check failed; the message names the comparison and what differs."""


# The name users import and catch, and that pytest prints (committed baseline reports carry
# "mxcheck.assertions.NumericsError: ..."), as numpy's set_module does for its public names.
NumericsError.__module__ = "mxcheck.assertions"


@dataclass(frozen=True)
class Outcome:
    value: Any  # what the public assert returns
    passed: bool
    message: str
    fields: dict[str, Any] = field(default_factory=dict)  # the Record fields it fills


def raise_unless(out: Outcome) -> Any:
    if not out.passed:
        raise NumericsError(out.message)
    return out.value


def say(head: str, context: Context, *details: str) -> str:
    """``head: backend=b recipe=r layer=l wgrad M=.. N=.. K=.. other=..; detail; ...``"""
    ctx = {k: v for k, v in (context or {}).items() if v is not None and v != ""}
    where = [f"{k}={ctx[k]}" for k in ("backend", "recipe", "layer") if k in ctx]
    where += [str(ctx["direction"])] if "direction" in ctx else []
    where += [f"{k.upper()}={ctx[k]}" for k in ("m", "n", "k") if k in ctx]
    where += [f"{k}={v}" for k, v in ctx.items() if k not in CONTEXT_KEYS]
    return "; ".join([f"{head}: {' '.join(where)}" if where else head, *filter(None, details)])
