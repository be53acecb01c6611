"""What the fake-quant adapters (brevitas, quark) take as an operand, checked once for both."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check_operand"]


def check_operand(x: Any, library: str, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    """``x`` when it is a 2D [rows, K] tensor of one of ``dtypes``; ValueError / TypeError
    naming the argument, its value and what is accepted, otherwise."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x={got}: {library} fake_quantize takes a 2D [rows, K] tensor (K the contraction axis)")
    if x.dtype not in dtypes:
        raise TypeError(f"x.dtype={x.dtype}: {library} fake_quantize takes {', '.join(str(d) for d in dtypes)}")
    return x
