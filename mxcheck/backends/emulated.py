"""The oracle itself behind the Backend protocol, so every harness path runs on a CPU."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from mxcheck.backends.contract import Refusal

__all__ = ["EmulatedBackend"]


@contextlib.contextmanager
def _oracle_refuses() -> Iterator[None]:
    """The oracle's ValueError is its argument check (a shape that does not tile, a spec it
    cannot quantize): for this backend that is a declared refusal."""
    try:
        yield
    except Refusal:
        raise
    except ValueError as e:
        raise Refusal(str(e)) from e


@functools.lru_cache(maxsize=256)
def _shape_refusal(recipe: Any, m: int, n: int, k: int, dgrad: bool, wgrad: bool) -> str | None:
    """Why the reference Function cannot run ``recipe`` at M, N, K, or None. The backward's
    copies are quantized in the backward, where no caller could tell a refusal from a bug,
    so every copy the call will need (dgrad's if x needs a gradient, wgrad's if the weight
    does) is tried here first, on zeros of its shape; cached per shape."""
    from mxcheck.gemm import quantize_operand  # noqa: PLC0415
    from mxcheck.recipes import OPERANDS  # noqa: PLC0415

    shapes = dict(zip(OPERANDS, ((m, k), (n, k), (m, n), (k, n), (n, m), (k, m)), strict=True))
    needed = {"x_row", "w_row"} | ({"g_row", "w_col"} if dgrad else set()) | ({"g_col", "x_col"} if wgrad else set())
    try:
        recipe.check_shape(m, n, k)
        for op, shape in shapes.items():
            spec = recipe.spec(op)
            if op not in needed:
                continue
            if spec.quantized and spec.scaling != "delayed":  # delayed: tensorwise, any shape
                rand = torch.zeros(shape, dtype=torch.uint8) if spec.rounding == "sr" else None
                quantize_operand(torch.zeros(shape), spec, rand=rand)
    except ValueError as e:
        return f"recipe {recipe.name} at M={m} N={n} K={k}: {e}"
    return None


class EmulatedBackend:
    """Pure-PyTorch emulation: mxcheck's quantizers, GEMM and reference Function."""

    name = "emulated"
    device = "cpu"
    sr_bits = "oracle"  # SR bits from torch's default generator, as the reference Function draws them

    def available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, recipe: Any) -> tuple[bool, str]:
        return True, ""

    def quantize(self, x: torch.Tensor, spec: Any, *, state: Any = None) -> Any:
        """``state``: the DelayedScaling of a delayed-scaling spec (its amax history)."""
        from mxcheck.gemm import quantize_operand  # noqa: PLC0415  (backends sit above gemm's users)

        with _oracle_refuses():
            return quantize_operand(x, spec, state=state)

    def gemm(self, a: Any, b: Any, *, out_dtype: torch.dtype = torch.bfloat16,
             bias: torch.Tensor | None = None) -> torch.Tensor:
        from mxcheck.gemm import emulated_gemm  # noqa: PLC0415

        with _oracle_refuses():
            return emulated_gemm(a, b, out_dtype=out_dtype, bias=bias)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, recipe: Any, *,
               states: Any = None) -> torch.Tensor:
        """``states``: the operand -> DelayedScaling map of a delayed-scaling recipe, kept by
        the caller across steps (as a TE module keeps its FP8 meta)."""
        from mxcheck.functions import quant_linear  # noqa: PLC0415

        if isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and x.ndim >= 1 and weight.ndim == 2:
            m = x.numel() // max(x.shape[-1], 1)
            why = _shape_refusal(recipe, m, weight.shape[0], weight.shape[1], x.requires_grad, weight.requires_grad)
            if why is not None:
                raise Refusal(why)
        with _oracle_refuses():
            return quant_linear(x, weight, bias, recipe, states=states)
