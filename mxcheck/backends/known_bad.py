"""Backends with one seeded bug each: the conformance suite must fail every one of them.

Each wraps the emulated backend and breaks one thing the way real kernels have broken.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from mxcheck.backends.emulated import EmulatedBackend

__all__ = ["KNOWN_BAD"]


class NibbleSwap(EmulatedBackend):
    """Reads packed fp4 with the high nibble first (torchao before 2025-10, issue #2939)."""

    name = "bad-nibble-swap"

    def gemm(self, a, b, **kw):
        if getattr(getattr(a, "fmt", None), "name", None) == "e2m1":
            codes = a.codes.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
            a = replace(a, codes=codes)
        return super().gemm(a, b, **kw)


class WrongScaleRule(EmulatedBackend):
    """Quantizes MX operands with OCP floor whatever the recipe says (even, rceil)."""

    name = "bad-scale-rule"

    def quantize(self, x, spec):
        return super().quantize(x, replace(spec, scale_rule="floor") if spec.scaling == "mx" else spec)


class StaleWeight(EmulatedBackend):
    """Caches the first weight it sees, as a quantized-weight cache keyed on the wrong thing."""

    name = "bad-stale-weight"

    def __init__(self) -> None:
        self._cached: torch.Tensor | None = None

    def linear(self, x, weight, bias, recipe):
        if self._cached is None or self._cached.shape != weight.shape:
            self._cached = weight.detach().clone()
        return super().linear(x, self._cached, bias, recipe)


class Bf16Fallback(EmulatedBackend):
    """Silently runs the linear in bf16: trains fine, quantizes nothing (Primus PR #1010)."""

    name = "bad-bf16-fallback"

    def linear(self, x, weight, bias, recipe):
        y = torch.nn.functional.linear(x.bfloat16(), weight.bfloat16(), None if bias is None else bias.bfloat16())
        return y.to(recipe.out_dtype)


class NanToZero(EmulatedBackend):
    """Flushes NaN inputs to zero before quantizing (hides a diverging run)."""

    name = "bad-nan-to-zero"

    def linear(self, x, weight, bias, recipe):
        return super().linear(torch.nan_to_num(x, nan=0.0), weight, bias, recipe)


class DropsBias(EmulatedBackend):
    """Forgets the bias (and so its gradient)."""

    name = "bad-drops-bias"

    def linear(self, x, weight, bias, recipe):
        y = super().linear(x, weight, None, recipe)
        return y + 0 * bias.sum() if bias is not None else y


class GarbageUnlessKMod256(EmulatedBackend):
    """Returns garbage, with no error, when K % 256 != 0 (aiter#4176: gemm_a4w4, relative
    error 1e3 to 1e7); its linear runs the reference Function on that GEMM, as adapters do."""

    name = "bad-k-mod-256"

    def gemm(self, a, b, **kw):
        out = super().gemm(a, b, **kw)
        k = (a.shape if hasattr(a, "shape") else a.codes.shape)[-1]
        return out.flip(-1) * 1e3 if k % 256 else out

    def linear(self, x, weight, bias, recipe):
        from mxcheck.functions import quant_linear  # noqa: PLC0415

        return quant_linear(x, weight, bias, recipe, gemm=self.gemm)


KNOWN_BAD: dict[str, type[Any]] = {c.name: c for c in (NibbleSwap, WrongScaleRule, StaleWeight, Bf16Fallback,
                                                        NanToZero, DropsBias, GarbageUnlessKMod256)}
