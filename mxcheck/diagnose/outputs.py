"""What a GEMM got wrong: the outputs outside the fp32-accumulation bound, shown with their
operands' scales, and the known GEMM behaviours that reproduce them.

One bound serves the check and the attribution (:func:`exact_and_bound`,
:func:`outside_bound`): a behaviour reproduces an output when the kernel's output lies
inside the same bound around the exact GEMM of the operands as the behaviour reads them.
Everything here but the bound runs only after a check has failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from mxcheck.diagnose.accumulation import HOPPER_FAST_ACCUMULATION, HOPPER_SPLIT_ACCUMULATION
from mxcheck.diagnose.behaviour import Attribution, Behaviour, render_attributions
from mxcheck.formats import decode_table, get_format
from mxcheck.gemm import QTensor, dequantize_operand, emulated_gemm
from mxcheck.scaling import FP8Tensor, MXTensor, NVFP4Tensor
from mxcheck.scaling.fp8 import FP8_GRANULARITIES
from mxcheck.scaling.rules import E8M0_NAN

__all__ = ["GEMM_BEHAVIOURS", "OperandTransform", "exact_and_bound", "explain_gemm", "gemm_mismatch", "outside_bound",
           "reproduced_by_split_accumulation"]

SHOWN_OUTPUTS = 4  # outputs outside the bound shown one by one
SHOWN_SCALES = 8  # scale bytes shown per operand row
# A behaviour is named where it reproduces at least this share of the differing outputs:
# on garbage outputs (the oracle's times 1e3) a behaviour's bound catches at most 0.03% of
# them by coincidence (check_gemm's inputs, every recipe), a whole-operand behaviour all.
MIN_SHARE = 0.01


# ---- the fp32-accumulation bound ----


def exact_and_bound(a: QTensor, b: QTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact (float64) GEMM of a and b, and the bound on any fp32 accumulation of its K
    products in any order: K * 2**-24 * (|a| @ |b|^T)."""
    exact = emulated_gemm(a, b, out_dtype=torch.float64, accumulate=torch.float64)
    da, db = dequantize_operand(a).double().abs(), dequantize_operand(b).double().abs()
    return exact, da.shape[1] * 2.0**-24 * (da @ db.T)


def outside_bound(got: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """True where got lies outside [exact - bound, exact + bound], both ends rounded to got's
    dtype (rounding is monotone: a kernel that accumulates within the bound and rounds once
    lands between them). NaN counts as outside."""
    lo, hi = ((exact + s * bound).to(got.dtype).double() for s in (-1, 1))
    g = got.double()
    return ~((g >= lo) & (g <= hi))


# ---- the display: which outputs, and the scales of their operands' rows ----


def _scale_row(q: QTensor, row: int) -> str:
    """The scales one row of an operand is read with, at most SHOWN_SCALES of them."""
    if isinstance(q, MXTensor):
        got = q.scales[row].tolist()
        cells = [("ff=NaN" if s == E8M0_NAN else f"{s:02x}=2^{s - 127}") for s in got[:SHOWN_SCALES]]
        extra = ""
    elif isinstance(q, NVFP4Tensor):
        got = q.block_scales[row].tolist()
        values = decode_table(get_format("ue4m3")).tolist()
        cells = [f"{s:02x}={values[s]:g}" for s in got[:SHOWN_SCALES]]
        extra = f"; tensor_scale {float(q.tensor_scale):.6g}"
    elif isinstance(q, FP8Tensor):
        inv = q.scale_inv
        if inv.dim() == 0:
            return f"scale_inv {float(inv):.6g} (tensor)"
        g = FP8_GRANULARITIES[q.granularity]
        got = inv[row // (g.rows or 1)].tolist()
        cells, extra = [f"{s:.6g}" for s in got[:SHOWN_SCALES]], ""
    else:
        return "no scales (plain operand)"
    count = f"first {SHOWN_SCALES} of {len(got)} blocks" if len(got) > SHOWN_SCALES else f"{len(got)} blocks"
    return f"{count}: {' '.join(cells)}{extra}"


def _spread(bad: torch.Tensor) -> str:
    """How many rows and columns the bad outputs fall in, and how many of those are bad throughout."""
    rows, cols = bad.any(1), bad.any(0)
    whole_rows, whole_cols = int(bad.all(1).sum()), int(bad.all(0).sum())
    return (f"in {int(rows.sum())} of {bad.shape[0]} rows ({whole_rows} wholly) and {int(cols.sum())} of "
            f"{bad.shape[1]} columns ({whole_cols} wholly)")


def gemm_mismatch(what: str, got: torch.Tensor, a: QTensor, b: QTensor, exact: torch.Tensor,
                  bound: torch.Tensor, bad: torch.Tensor, explain: bool = True) -> str:
    """The failure message: the count and spread of outputs outside the bound, the first
    SHOWN_OUTPUTS of them with the scales of a's row i and b's row j, then (``explain``)
    the known behaviours that reproduce them."""
    n = int(bad.sum())
    lines = [f"{what}: outside the fp32-accumulation bound of the exact GEMM; {n:,} of {bad.numel():,} outputs, "
             f"{_spread(bad)}"]
    for i, j in bad.nonzero()[:SHOWN_OUTPUTS].tolist():
        g, e, bd = float(got[i, j]), float(exact[i, j]), float(bound[i, j])
        ratio = abs(g - e) / bd if bd else float("inf")
        lines += [f"  output (row {i}, col {j}): got {g!r}, exact {e!r}, error {abs(g - e):.3g}, bound {bd:.3g}, "
                  f"error/bound {ratio:.3g}",
                  f"    a row {i} scales, {_scale_row(a, i)}",
                  f"    b row {j} scales, {_scale_row(b, j)}"]
    if explain:
        lines += explain_gemm(got, a, b, exact, bad)
    return "\n".join(lines)


# ---- GEMM behaviours: the operands as a kernel reads them ----

Transform = Callable[[QTensor, QTensor], "tuple[QTensor, QTensor] | None"]


@dataclass(frozen=True)
class OperandTransform:
    """A GEMM behaviour's ``run``: the kernel reads ``transform(a, b)`` instead of a, b (None:
    it does not apply to these operands, or would change nothing). Attribution bounds the
    exact GEMM of the transformed operands, so it reads them through :meth:`operands`."""

    transform: Transform

    def operands(self, a: QTensor, b: QTensor) -> tuple[QTensor, QTensor] | None:
        return self.transform(a, b)

    def __call__(self, a: QTensor, b: QTensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
        ops = self.operands(a, b)
        return None if ops is None else emulated_gemm(*ops, out_dtype=out_dtype)


def _is_fp4(q: QTensor) -> bool:
    return isinstance(q, NVFP4Tensor) or (isinstance(q, MXTensor) and q.fmt.bits == 4)


def _nibble_swapped(q: QTensor) -> QTensor | None:
    """Adjacent codes swapped along K: packed fp4 read with element 0 in the high nibble."""
    if not _is_fp4(q) or q.codes.shape[-1] % 2:
        return None
    return replace(q, codes=q.codes.unflatten(-1, (-1, 2)).flip(-1).flatten(-2))


# Each scaled operand kind: its scale field and the value in it that reads as 1 (E8M0 2^0,
# ue4m3 1.0: exponent field 7 at bias 7, a scale_inv of 1).
_SCALES = {MXTensor: ("scales", 127), NVFP4Tensor: ("block_scales", 0x38), FP8Tensor: ("scale_inv", 1.0)}


def _unit_scales(q: QTensor) -> QTensor | None:
    """Every scale read as 1; None for an unscaled operand or one whose scales already are."""
    if type(q) not in _SCALES:
        return None
    field, one = _SCALES[type(q)]
    scales = getattr(q, field)
    return None if bool((scales == one).all()) else replace(q, **{field: torch.full_like(scales, one)})


def _scales_swapped(a: QTensor, b: QTensor) -> tuple[QTensor, QTensor] | None:
    """a read with b's scales and b with a's: only where both have one layout of one shape,
    and more than one scale each (two tensor scales multiply the sum alike either way)."""
    if type(a) not in _SCALES or type(b) is not type(a):
        return None
    field = _SCALES[type(a)][0]
    sa, sb = getattr(a, field), getattr(b, field)
    if sa.shape != sb.shape or sa.numel() < 2 or torch.equal(sa, sb):
        return None
    return replace(a, **{field: sb}), replace(b, **{field: sa})


def _on(which: str, one: Callable[[QTensor], QTensor | None]) -> Transform:
    """A transform of one operand ("a", "b") or of both, None where it changes neither."""
    def transform(a: QTensor, b: QTensor) -> tuple[QTensor, QTensor] | None:
        na = one(a) if which in ("a", "both") else None
        nb = one(b) if which in ("b", "both") else None
        if (which == "both" and (na is None or nb is None)) or (na is None and nb is None):
            return None
        return (a if na is None else na, b if nb is None else nb)
    return transform


def _scales_ignored(which: str) -> Behaviour:
    operand = {"a": "operand a (the row operand)", "b": "operand b (the column operand)", "both": "both operands"}
    return Behaviour(f"gemm-scales-ignored-{which}",
                     f"block scales of {operand[which]} ignored (every block read at scale 1: E8M0 2^0, "
                     "ue4m3 1.0, scale_inv 1)", "gemm", OperandTransform(_on(which, _unit_scales)))


# Swapping a's pairs gives the output swapping b's would (sum_k a[p(k)] b[k] = sum_k a[k] b[p(k)]
# for the pair swap p, inside one scale block), and swapping both cancels: so at the output
# the swap is one behaviour, on either operand; which one is read from the quantized bytes.
GEMM_BEHAVIOURS: tuple[Behaviour, ...] = (
    Behaviour("gemm-fp4-nibble-swap",
              "fp4 nibble order swapped in one operand (element 0 read from the high nibble: adjacent codes "
              "swapped along K; a or b give the same output, both cancel)", "gemm",
              OperandTransform(_on("a", _nibble_swapped)), cases=(19,),
              seen_in="torchao before 2025-10 (torchao/prototype/mx_formats/kernels.py; pytorch/ao#2939, "
                      "fixed by pytorch/ao#3123)"),
    _scales_ignored("a"),
    _scales_ignored("b"),
    _scales_ignored("both"),
    Behaviour("gemm-reduced-accumulation", "FP8 GEMM accumulated in Hopper's tensor cores without float32 promotion "
              "(fast accumulation: 32 products a k-step, each term truncated to 2^-13 of the step's largest exponent, "
              "the running sum truncated to 13 fraction bits, to the end of K)", "gemm",
              HOPPER_FAST_ACCUMULATION, cases=(31,),
              seen_in="torch._scaled_mm(use_fast_accum=True) on an H100 (torch 2.11.0+cu130, sm90): every one of "
                      "3,009,024 captured outputs, K 16 to 4,096 (tools/h200/capture_fast_accum.py); torchao "
                      "Float8Linear's forward (Float8GemmConfig(use_fast_accum=True)), TransformerEngine's fp8 fprop"),
    Behaviour("gemm-scales-swapped", "scales applied to the wrong operand (a read with b's scales, b with a's)",
              "gemm", OperandTransform(_scales_swapped),
              seen_in="cuBLASLt MXFP8 as first wrapped for torch._scaled_mm (NVIDIA/CUDALibrarySamples#248, "
                      "pytorch/pytorch#146655); hipBLASLt row-wise FP8, whose A/B scale swap torch hard-coded "
                      "(pytorch/pytorch#147548)"),
)


# ---- accumulations that are not float32's ----


def reproduced_by_split_accumulation(got: torch.Tensor, a: QTensor, b: QTensor) -> torch.Tensor:
    """True where got has, bit for bit, the output of Hopper's FP8 tensor cores with a float32
    promotion every 128 products (torch._scaled_mm's default, use_fast_accum=False; cuBLASLt
    and CUTLASS promote so): a correct kernel whose k-steps truncate below 2^-13 of their
    largest term, so its error can exceed the fp32-accumulation bound. All False where the
    operands are not fp8 with tensorwise or rowwise scales."""
    return HOPPER_SPLIT_ACCUMULATION.reproduces(got, a, b)


# ---- attribution ----


def explain_gemm(got: torch.Tensor, a: QTensor, b: QTensor, exact: torch.Tensor, bad: torch.Tensor,
                 behaviours: tuple[Behaviour, ...] = GEMM_BEHAVIOURS) -> list[str]:
    """Report lines: each behaviour that reproduces at least MIN_SHARE of the ``bad``
    outputs, then the bad outputs none of those reproduces.

    A behaviour that reads the operands otherwise (an :class:`OperandTransform`) reproduces
    an output where the kernel's output lies within the fp32-accumulation bound of the exact
    GEMM of the operands as the behaviour reads them and the oracle's exact output does not
    (where a cancelling sum leaves both inside one wide bound, the output cannot tell them
    apart). An accumulation model (``reproduces``) reproduces an output where its output
    has the kernel's bits."""
    found, left, n = [], bad.clone(), int(bad.sum())
    oracle = exact.to(got.dtype)
    for behaviour in behaviours:
        if hasattr(behaviour.run, "reproduces"):
            same = behaviour.run.reproduces(got, a, b)
            if not same.any():
                continue
            misses = ~same
            hits = bad & same
        else:
            ops = behaviour.run.operands(a, b)
            if ops is None:
                continue
            b_exact, b_bound = exact_and_bound(*ops)
            misses = outside_bound(got, b_exact, b_bound)
            hits = bad & ~misses & outside_bound(oracle, b_exact, b_bound)
        if int(hits.sum()) >= MIN_SHARE * n:
            left &= ~hits
            found.append(Attribution(behaviour, int(hits.sum()), n, "outputs", int((~bad & misses).sum())))
    return render_attributions(found, n, int(left.sum()), "outputs")
