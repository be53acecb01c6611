"""The toy MX kernel of toy_mx.py as a fake-quant backend: it returns values (quantize, then
dequantize), as QAT toolkits and the fake-quant kernels of a training step do, and mxcheck
judges those values (docs/backends.md, "Fake-quant backends").

    PYTHONPATH=docs/examples mxcheck conform --backend toy_fq:make_backend --recipe ocp-mxfp8-e4m3

It has no ``gemm`` and no ``linear``: the suite runs its linears through the reference
Function with ``fake_quantize`` as every operand copy's quantizer. ``make_buggy_backend()``
is the same kernel with toy_mx's seeded bug (the block exponent from a float32 ``log2``);
the suite fails it and names that behaviour, from the values alone.
"""

from __future__ import annotations

import torch
from toy_mx import ToyMX, _dequantize, exponent_from_log2  # docs/examples is on PYTHONPATH

from mxcheck.recipes import OperandSpec, Recipe


class ToyFakeQuant:
    """fake_quantize only: the toy kernel's codes and scales, dequantized."""

    name = "toy-fq"
    device = "cpu"
    claims = ("ocp-mxfp8-e4m3", "ocp-mxfp4")  # what it promises bit for bit
    input_dtypes = (torch.float32, torch.bfloat16, torch.float16)

    def __init__(self, kernel: ToyMX | None = None) -> None:
        self.kernel = ToyMX() if kernel is None else kernel

    def available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, recipe: Recipe) -> tuple[bool, str]:
        return self.kernel.supports(recipe)

    def fake_quantize(self, x: torch.Tensor, spec: OperandSpec, *, state: object = None) -> torch.Tensor:
        """Values shaped like x, in x's dtype: the float32 values (exact) rounded to nearest even
        by ``Tensor.to``, the cast the contract states. A K the kernel cannot block is refused
        by ``quantize`` (``Refusal``)."""
        return _dequantize(self.kernel.quantize(x, spec)).to(x.dtype)


def make_backend() -> ToyFakeQuant:
    return ToyFakeQuant()


def make_buggy_backend() -> ToyFakeQuant:
    return ToyFakeQuant(ToyMX(block_exponent=exponent_from_log2))
