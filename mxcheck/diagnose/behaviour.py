"""A known behaviour: one thing a kernel may do differently from the oracle, executable.

Each :class:`Behaviour` computes what a kernel with that behaviour would give on the same
input (a quantized tensor, a GEMM output, a linear's output). Attribution runs it on a
failing comparison and names it only where its result reproduces the kernel's bits (for
outputs: where the kernel's output lies within the check's own tolerance of it), so a
named cause is never a guess.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["LEVELS", "Attribution", "Behaviour", "render_attributions", "split_fits"]

# Where a behaviour acts: on a quantized operand (its fields, block by block), on a GEMM's
# output (given the oracle's operands), or on a whole linear's output.
LEVELS = ("quantize", "gemm", "linear")


@dataclass(frozen=True)
class Behaviour:
    """``run``'s signature depends on ``level``: quantize ``(x, spec, oracle) -> tensor of
    the oracle's type``, gemm ``(a, b, out_dtype) -> output``, linear ``(case) -> output``
    (see each level's module); it returns None where the behaviour does not apply (another
    scaling, a layout it cannot model) or would change nothing.

    ``cases``: rows of ``mxcheck.divergence.DIVERGENCE_TABLE`` that describe it; ``seen_in``:
    implementations known to do it (with the file that does)."""

    key: str
    title: str
    level: str
    run: Callable[..., Any]
    cases: tuple[int, ...] = ()
    seen_in: str = ""

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"behaviour {self.key!r}: level={self.level!r}; expected one of {list(LEVELS)}")

    def describe(self) -> str:
        """The title with its divergence cases and where it was seen, for a report line."""
        notes = []
        if self.cases:
            notes.append(f"divergence case{'s' if len(self.cases) > 1 else ''} {', '.join(map(str, self.cases))}")
        if self.seen_in:
            notes.append(f"seen in {self.seen_in}")
        return f"{self.title} ({'; '.join(notes)})" if notes else self.title


@dataclass(frozen=True)
class Attribution:
    """What one behaviour reproduces of a failing comparison's differing units (blocks for
    quantize, outputs for a GEMM or linear). ``also_changes``: units the kernel gets right
    that the behaviour would change (a cause that fits the differences but not the rest)."""

    behaviour: Behaviour
    reproduced: int
    differing: int
    unit: str = "blocks"
    also_changes: int = 0

    def line(self) -> str:
        extra = f"; it would also change {self.also_changes:,} {self.unit} the kernel gets right" \
            if self.also_changes else ""
        return (f"{self.reproduced:,} of {self.differing:,} differing {self.unit} are reproduced by: "
                f"{self.behaviour.describe()}{extra}")


WEAKER_SHOWN = 3  # weaker fits listed by name when exact ones exist


def split_fits(attributions: list[Attribution], differing: int) -> tuple[list[Attribution], list[Attribution]]:
    """(exact fits, weaker fits), each best first. Exact: changes no unit the kernel gets
    right; where some reproduce every differing unit, those alone. The rest are weaker."""
    order = sorted(attributions, key=lambda a: (-a.reproduced, a.also_changes, a.behaviour.key))
    complete = [a for a in order if not a.also_changes and a.reproduced == differing]
    exact = complete or [a for a in order if not a.also_changes]
    return exact, [a for a in order if a not in exact]


def render_attributions(attributions: list[Attribution], differing: int, unexplained: int,
                        unit: str = "blocks") -> list[str]:
    """Report lines. Only exact fits head the list: a behaviour that reproduces every unit
    it is named for and changes none the kernel gets right; every one, best first (two
    behaviours that reproduce the same units are both listed; where some reproduce every
    differing unit, those alone). A weaker fit (it changes units the kernel gets right, or
    explains fewer than a complete one) never heads the list: it follows on one line, named
    as weaker. Then the unexplained remainder."""
    exact, weaker = split_fits(attributions, differing)
    lines = [a.line() for a in exact]
    if not exact and weaker:
        lines.append(f"no known behaviour reproduces any of the {differing:,} differing {unit} without changing "
                     f"{unit} the kernel gets right")
    if weaker:
        named = "; ".join(f"{a.behaviour.title} ({a.reproduced:,} reproduced, {a.also_changes:,} right ones changed)"
                          if a.also_changes else f"{a.behaviour.title} ({a.reproduced:,} reproduced)"
                          for a in weaker[:WEAKER_SHOWN])
        more = f"; and {len(weaker) - WEAKER_SHOWN} more" if len(weaker) > WEAKER_SHOWN else ""
        lines.append(f"weaker fits, not a cause (they explain fewer {unit} or change {unit} the kernel gets right): "
                     f"{named}{more}")
    if unexplained:
        lines.append(f"{unexplained:,} of {differing:,} differing {unit} are reproduced by no known behaviour "
                     "(mxcheck.diagnose.CATALOGUE)")
    elif not lines:
        lines.append(f"no known behaviour reproduces the {differing:,} differing {unit}")
    return lines
