"""Hopper's FP8 tensor-core accumulation, as measured bit for bit on an H100.

Fitted on torch._scaled_mm (torch 2.11.0+cu130, CUDA 13.0, NVIDIA H100 80GB HBM3, sm90):
888 GEMMs, K from 16 to 4,096, e4m3 x e4m3 and e5m2 x e4m3, tensorwise and rowwise
scales, four input families (``tools/h200/capture_fast_accum.py``; ``tools/fit_accumulation.py``
gives the table of candidate models). The rule reproduces all 3,009,024 outputs of each
mode exactly:

1. Products are taken 32 at a time (one wgmma k-step for FP8) together with the running sum.
2. Each product's exponent is ``ea + eb``, the exponents of its two fp8 elements (a
   subnormal element counts as the format's emin); the running sum's is its own. Every term
   is truncated toward zero to a multiple of ``2^(emax - 13)``, emax the largest exponent
   of the step, and the terms are added exactly.
3. The step's sum is truncated toward zero to 13 fraction bits: the new running sum.
4. ``use_fast_accum=True`` keeps that running sum to the end. Without it, every 128
   products (four k-steps) the running sum is added to a float32 accumulator (round to
   nearest) and restarts from zero.
5. The scales multiply the float32 sum in the epilogue. The capture's scales are powers of
   two, so it does not tell the order of the two float32 multiplies: ``EPILOGUES`` holds the
   three, :meth:`TensorCoreAccumulation.reproduces` accepts any of them
   (``tools/h200/verify_fast_accum.py`` measures which one the device uses).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mxcheck.gemm import QTensor
from mxcheck.scaling import FP8Tensor

__all__ = ["EPILOGUES", "HOPPER_FAST_ACCUMULATION", "HOPPER_SPLIT_ACCUMULATION", "TensorCoreAccumulation"]

# The float32 epilogue: the sum times a's scale column and b's scale row, in each order.
EPILOGUES = {"a-then-b": lambda t, sa, sb: t * sa * sb, "scales-first": lambda t, sa, sb: t * (sa * sb),
             "b-then-a": lambda t, sa, sb: t * sb * sa}

# Output elements held at once by one k-step: M * N * group float32 terms (about 64 MB).
_STEP_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class TensorCoreAccumulation:
    """An FP8 GEMM accumulated as Hopper's tensor cores do (the module's docstring has the
    rule). ``group``: products per k-step; ``fraction_bits``: bits kept below the step's
    largest exponent and in the running sum; ``promote_every``: products between additions
    to a float32 accumulator (None: never, the running sum is the result)."""

    group: int = 32
    fraction_bits: int = 13
    promote_every: int | None = None

    def __post_init__(self) -> None:
        if self.group < 1:
            raise ValueError(f"group={self.group}; expected a positive number of products per k-step")
        if not 1 <= self.fraction_bits <= 20:  # the terms and their sum stay exact in float32
            raise ValueError(f"fraction_bits={self.fraction_bits}; expected 1 to 20")
        if self.promote_every is not None and (self.promote_every < 1 or self.promote_every % self.group):
            raise ValueError(f"promote_every={self.promote_every}; expected None or a positive multiple of "
                             f"group={self.group}")

    def __call__(self, a: QTensor, b: QTensor, out_dtype: torch.dtype = torch.float32,
                 epilogue: str = "a-then-b") -> torch.Tensor | None:
        """The output the tensor cores give for a @ b^T, the scales applied in the order
        ``epilogue`` (a key of EPILOGUES), cast to out_dtype; None unless both operands are
        fp8 with tensorwise or rowwise scales (the scales a wgmma leaves to the epilogue)."""
        total = self._total(a, b)
        if total is None:
            return None
        if epilogue not in EPILOGUES:
            raise ValueError(f"epilogue={epilogue!r}; expected one of {sorted(EPILOGUES)}")
        return EPILOGUES[epilogue](total, _scale_column(a), _scale_column(b).T).to(out_dtype)

    def reproduces(self, got: torch.Tensor, a: QTensor, b: QTensor) -> torch.Tensor:
        """True where got has the bits of this accumulation with one of the EPILOGUES; all
        False where the model does not apply (other operands, another shape)."""
        total = self._total(a, b)
        same = torch.zeros(got.shape, dtype=torch.bool, device=got.device)
        if total is None or tuple(total.shape) != tuple(got.shape):
            return same
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
        sa, sb = _scale_column(a), _scale_column(b).T
        for order in EPILOGUES.values():
            same |= order(total, sa, sb).to(got.dtype).to(got.device).view(ints) == got.view(ints)
        return same

    def _total(self, a: QTensor, b: QTensor) -> torch.Tensor | None:
        if not all(isinstance(q, FP8Tensor) and q.granularity in ("tensor", "row") for q in (a, b)):
            return None
        return self.sum_of_values(_values(a), _exponents(a), _values(b), _exponents(b))

    def sum_of_values(self, va: torch.Tensor, ea: torch.Tensor, vb: torch.Tensor, eb: torch.Tensor) -> torch.Tensor:
        """float32 [M, N]: the accumulation of va[M, K] @ vb[N, K]^T (fp8 values in float32)
        with element exponents ea, eb (int32, any value where the element is zero)."""
        rows = max(1, _STEP_ELEMENTS // max(1, vb.shape[0] * self.group))
        return torch.cat([self._rows(va[i:i + rows], ea[i:i + rows], vb, eb) for i in range(0, va.shape[0], rows)])

    def _rows(self, va: torch.Tensor, ea: torch.Tensor, vb: torch.Tensor, eb: torch.Tensor) -> torch.Tensor:
        m, k = va.shape
        running = torch.zeros(m, vb.shape[0], dtype=torch.float32, device=va.device)
        promoted = torch.zeros_like(running)
        for k0 in range(0, k, self.group):
            step = slice(k0, k0 + self.group)
            products = va[:, None, step] * vb[None, :, step]  # exact: fp8 x fp8 has at most 8 bits
            exps = torch.where(products == 0, _NO_EXPONENT, ea[:, None, step] + eb[None, :, step])
            top = torch.maximum(exps.amax(-1), _exponent_of(running))
            # a step of zero products on a zero running sum (a zero block of either operand at
            # the start of a promotion interval) has no exponent: any quantum keeps it 0
            top = torch.where(top == _NO_EXPONENT, 0, top)
            # Every term over the quantum is an integer under 2^(fraction_bits + 2), and the
            # group + 1 of them sum exactly in float32.
            quantum = torch.ldexp(torch.ones_like(running), top - self.fraction_bits)
            units = (products / quantum[..., None]).trunc_().sum(-1) + (running / quantum).trunc_()
            running = _truncate(units * quantum, self.fraction_bits)
            if self.promote_every and (k0 + self.group) % self.promote_every == 0:
                promoted += running  # float32, round to nearest
                running = torch.zeros_like(running)
        return running if not self.promote_every else (promoted + running if k % self.promote_every else promoted)


_NO_EXPONENT = -(1 << 20)  # a zero term's exponent: below every quantum


def _exponent_of(x: torch.Tensor) -> torch.Tensor:
    """floor(log2 |x|) as int32, read by frexp (exact); _NO_EXPONENT where x is 0."""
    _, e = torch.frexp(x)
    return torch.where(x == 0, _NO_EXPONENT, e.to(torch.int32) - 1)


def _truncate(x: torch.Tensor, fraction_bits: int) -> torch.Tensor:
    """x truncated toward zero to ``fraction_bits`` bits after its leading one."""
    mantissa, e = torch.frexp(x)
    scale = 2.0 ** (fraction_bits + 1)
    return torch.ldexp((mantissa * scale).trunc_() / scale, e)


def _values(q: FP8Tensor) -> torch.Tensor:
    return q.values(torch.float32)


def _exponents(q: FP8Tensor) -> torch.Tensor:
    """The exponent a tensor core reads for each fp8 element: floor(log2 |v|), at least the
    format's emin (a subnormal's exponent field reads as emin)."""
    return _exponent_of(_values(q)).clamp_min(q.fmt.emin)


def _scale_column(q: FP8Tensor) -> torch.Tensor:
    """scale_inv as a float32 column: one per row, or one for all."""
    return q.scale_inv.float().reshape(-1, 1)


HOPPER_FAST_ACCUMULATION = TensorCoreAccumulation()
HOPPER_SPLIT_ACCUMULATION = TensorCoreAccumulation(promote_every=128)
