"""Checks the fake-quant adapters share: which OperandSpec fields a library's quantizer
fixes, and what a 2D operand must be, each answered in one sentence naming the library."""

from __future__ import annotations

from typing import Any

import torch

from mxcheck.recipes import OperandSpec

__all__ = ["check_operand", "field_refusal"]


def field_refusal(spec: OperandSpec, library: str, **fixed: Any) -> str | None:
    """None when every field named in ``fixed`` has that value in ``spec``, else why the
    library's quantizer cannot compute ``spec`` (each differing field, its value and the
    library's)."""
    bad = [f"{name}={getattr(spec, name)!r} (its quantizer has {want!r})"
           for name, want in fixed.items() if getattr(spec, name) != want]
    return f"{library}: {spec.fmt} {spec.scaling}: {', '.join(bad)}" if bad else None


def check_operand(x: Any, library: str, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    """``x`` when it is a 2D [rows, K] tensor of one of ``dtypes``; ValueError / TypeError
    naming the argument, its value and what is accepted, otherwise."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x={got}: {library} fake_quantize takes a 2D [rows, K] tensor (K the contraction axis)")
    if x.dtype not in dtypes:
        raise TypeError(f"x.dtype={x.dtype}: {library} fake_quantize takes {', '.join(str(d) for d in dtypes)}")
    return x
