"""Witness libraries' pinned answers, by the witness's installed version.

A pinned answer (a "pin") is one value, the same on every version in ``OBSERVED``, or a
dict ``{version specifier: value}`` where the witness changed, e.g. ml_dtypes' e8m0 cast
of a float32 subnormal: ``{"<0.7": 0x01, ">=0.7": 0x00}``. ``Witnesses.expect`` compares
the installed witness with its pin:

- a version inside the observed span (oldest to newest version in ``OBSERVED``) must give
  its range's pinned value: a mismatch fails the test (the pin or the witness is wrong);
- a version outside the span that disagrees is *witness drift*: ``Witnesses.finish``
  xfails the test with a reason starting ``mxcheck.plugin.WITNESS_DRIFT`` that names the
  version, what it gave and what was pinned, and the plugin counts it in the report.

mxcheck's own answer is checked before, hard, against float64 truth or hand-worked hex:
drift in a witness never hides a wrong mxcheck.
"""

from __future__ import annotations

import functools
import importlib.metadata
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from mxcheck.plugin import WITNESS_DRIFT

# The versions the pins in tests/ were observed on: installed and run, not read from docs.
# Add a version here only after running the pinned tests under it.
OBSERVED: dict[str, tuple[str, ...]] = {
    "ml_dtypes": ("0.6.0", "0.7.0"),
    "torch": ("2.13.0",),
    "gfloat": ("0.5.2",),
    "torchao": ("0.18.0",),
    "numpy": ("2.4.6",),  # its own float16 casts
}


@functools.cache
def installed(witness: str) -> Version:
    """The witness's installed version without its local part (torch 2.13.0+cpu is 2.13.0)."""
    if witness not in OBSERVED:
        raise ValueError(f"witness={witness!r}; expected one of {sorted(OBSERVED)}")
    return Version(Version(importlib.metadata.version(witness)).public)


def pin_for(pin: Any, version: Version) -> tuple[Any, str] | None:
    """(value, the range it holds for) of the pin at this version; None if no range has it."""
    if not isinstance(pin, dict):
        return pin, ""
    held = [(value, spec) for spec, value in pin.items() if version in SpecifierSet(spec)]
    if len(held) > 1:
        raise ValueError(f"pin {pin!r}: ranges {[s for _, s in held]} overlap at {version}")
    return held[0] if held else None


def show(value: Any) -> str:
    """Codes in hex, as the tables write them."""
    if isinstance(value, bool) or not isinstance(value, (int, tuple, list)):
        return repr(value)
    if isinstance(value, int):
        return f"0x{value:02X}"
    return "(" + ", ".join(show(v) for v in value) + ")"


def plain(value: Any) -> Any:
    """numpy and torch scalars as Python ints, so a pin compares with ==."""
    if isinstance(value, (tuple, list)):
        return tuple(plain(v) for v in value)
    return value.item() if hasattr(value, "item") else value


class Witnesses:
    """Compares witnesses' answers with their pins; call ``finish`` last in the test."""

    def __init__(self) -> None:
        self.drifts: list[str] = []

    def expect(self, witness: str, got: Any, pin: Any, what: str) -> None:
        got, version = plain(got), installed(witness)
        seen = [Version(v) for v in OBSERVED[witness]]
        for v in seen:  # a pin covers every observed version, whichever one runs here
            assert pin_for(pin, v) is not None, f"pin {pin!r} has no range holding {witness} {v} ({what})"
        held = pin_for(pin, version)
        inside = min(seen) <= version <= max(seen)
        if inside:
            assert held is not None, f"pin {pin!r} has no range holding {witness} {version} ({what})"
        elif held is not None and got == held[0]:
            return  # a newer (or older) version that agrees with its range
        want, spec = held or pin_for(pin, max(seen))
        message = (f"{witness} {version} gives {show(got)} for {what}; pinned {show(want)}"
                   f"{' for ' + witness + spec if spec else ''} (observed on {', '.join(OBSERVED[witness])})")
        if inside:
            assert got == want, message
        else:
            self.drifts.append(message)

    def finish(self) -> None:
        if self.drifts:
            pytest.xfail(f"{WITNESS_DRIFT} " + "; ".join(self.drifts))
