"""What every implementation profile shares, whatever its scaling kind (MX, NVFP4, FP8).

A profile kind is a frozen dataclass deriving from :class:`ProfileBase`: the shared fields
(name, element format, element rounding, rotation, zero sign, where it comes from) are
checked here, the kind's own fields by its ``_check``. Class attributes say which
``OperandSpec`` scaling the kind pins, which element formats it takes, and which spec fields
repeat profile fields (they must agree, and ``Recipe.with_profile`` copies them).

Shared element option ``zero_sign`` (what sign a zero code carries; default = the source's,
as the hardware casts, torchao and ``mxcheck.encode`` do):

- ``"source"``: the sign of the value that rounded to zero (-0.0 gives the negative zero code).
- ``"negative_values"``: the sign bit is ``x < 0``: -0.0 gives +0, a negative value that
  rounds to zero gives -0 (TE's ``cast_to_fp4x2`` and ModelOpt's ``_cast_fp4``).
- ``"never"``: every zero code is +0.
- ``"zero_negative"``: the sign bit is ``x <= 0``: an exact zero (either sign) gives -0, a
  negative value that rounds to zero -0, a positive one +0 (ModelOpt 0.46-0.47 MXFP4
  ``cast_fp4``: ``(2 - sign(x)) // 2`` is 1 for ``sign(x) = 0``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from mxcheck.formats import ROUNDINGS, FloatFormat, get_format
from mxcheck.hadamard import get_hadamard

__all__ = ["ZERO_SIGNS", "ProfileBase", "apply_zero_sign"]

ZERO_SIGNS = ("source", "negative_values", "never", "zero_negative")


@dataclass(frozen=True)
class ProfileBase:
    """Fields every profile kind has. ``fmt=None`` makes a family: the element format is
    chosen per use (one of the kind's ``formats``)."""

    name: str
    fmt: str | None = None
    rounding: str = "rne"
    hadamard: str | None = None
    zero_sign: str = "source"
    source: str = ""
    notes: tuple[str, ...] = ()

    scaling: ClassVar[str] = ""  # the OperandSpec scaling this kind pins
    formats: ClassVar[tuple[str, ...]] = ()  # element formats it takes
    roundings: ClassVar[tuple[str, ...]] = tuple(r for r in ROUNDINGS if r != "sr")
    spec_fields: ClassVar[tuple[str, ...]] = ("rounding", "hadamard")  # repeated in an OperandSpec
    spec_defaults: ClassVar[dict[str, object]] = {}  # OperandSpec fields the kind models at one value only

    def __post_init__(self) -> None:
        bad = self._check_common() or self._check()
        if bad:
            raise ValueError(f"profile {self.name!r}: {bad}")

    def __str__(self) -> str:
        return self.name

    def _check_common(self) -> str:
        if self.fmt is not None and self.fmt not in self.formats:
            return f"fmt={self.fmt!r}; expected None (a family) or one of {list(self.formats)}"
        if self.rounding not in self.roundings:
            why = (" (SR bits come from each implementation's own RNG, which a profile does not model)"
                   if self.rounding == "sr" else "")
            return f"rounding={self.rounding!r}; expected one of {sorted(self.roundings)}{why}"
        if self.zero_sign not in ZERO_SIGNS:
            return f"zero_sign={self.zero_sign!r}; expected one of {list(ZERO_SIGNS)}"
        get_hadamard(self.hadamard)
        return ""

    def _check(self) -> str:
        """What is wrong with the kind's own fields, or ""."""
        return ""

    def element_format(self, fmt: str | FloatFormat | None = None) -> FloatFormat:
        """The element format: the profile's own, or ``fmt`` for a family."""
        if fmt is None and self.fmt is None:
            raise ValueError(f"profile {self.name!r} is a family: pass fmt, one of {list(self.formats)}")
        f = get_format(fmt if fmt is not None else self.fmt)
        if self.fmt is not None and f.name != self.fmt:
            raise ValueError(f"profile {self.name!r} is pinned to {self.fmt}, got fmt={f.name!r}")
        if f.name not in self.formats:
            raise ValueError(f"fmt={f.name!r} is not a {self.scaling} element format for profile {self.name!r}; "
                             f"expected one of {list(self.formats)}")
        return f


def apply_zero_sign(policy: str, x: torch.Tensor, codes: torch.Tensor, fmt: FloatFormat,
                    where: torch.Tensor | None = None) -> torch.Tensor:
    """codes with every zero code's sign set by ``policy`` (see ZERO_SIGNS); x is the tensor
    that was encoded (same shape), ``where`` limits the change (e.g. not in NaN-scaled blocks).
    Formats with no negative zero (fnuz, unsigned) are left as they are."""
    if policy == "source" or fmt.nan == "fnuz" or not fmt.signed:
        return codes
    zero = (codes & fmt.magnitude_mask) == 0
    if where is not None:
        zero &= where
    negative = {"never": torch.zeros_like(x, dtype=torch.bool), "negative_values": x < 0, "zero_negative": x <= 0}
    sign = negative[policy].to(torch.uint8) << (fmt.bits - 1)
    return torch.where(zero, sign, codes).to(codes.dtype)
