"""The oracle itself behind the Backend protocol, so every harness path runs on a CPU."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["EmulatedBackend"]


class EmulatedBackend:
    """Pure-PyTorch emulation: mxcheck's quantizers, GEMM and reference Function."""

    name = "emulated"
    device = "cpu"
    sr_bits = "oracle"  # its SR draws from torch's default generator, as the reference Function

    def available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, recipe: Any) -> tuple[bool, str]:
        return True, ""

    def quantize(self, x: torch.Tensor, spec: Any, *, state: Any = None) -> Any:
        """``state``: the DelayedScaling of a delayed-scaling spec (its amax history)."""
        from mxcheck.gemm import quantize_operand  # noqa: PLC0415  (backends sit above gemm's users)

        return quantize_operand(x, spec, state=state)

    def gemm(self, a: Any, b: Any, *, out_dtype: torch.dtype = torch.bfloat16,
             bias: torch.Tensor | None = None) -> torch.Tensor:
        from mxcheck.gemm import emulated_gemm  # noqa: PLC0415

        return emulated_gemm(a, b, out_dtype=out_dtype, bias=bias)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, recipe: Any, *,
               states: Any = None) -> torch.Tensor:
        """``states``: the operand -> DelayedScaling map of a delayed-scaling recipe, kept by
        the caller across steps (as a TE module keeps its FP8 meta)."""
        from mxcheck.functions import quant_linear  # noqa: PLC0415

        return quant_linear(x, weight, bias, recipe, states=states)
