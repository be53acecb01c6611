"""The tensor-level verdict of a quantize comparison: does the kernel keep the tensor?

The bitwise comparison says which blocks differ; it cannot say that a kernel returned no
signal at all (every code 0, or NaN everywhere), which reads like any convention
difference in a count of differing codes. So beside it, every quantize input where a field
differs gets the kernel's SNR and the oracle's against float64 truth (each dequantized;
where every field is bit-identical the two SNRs are equal by construction), and a kernel
more than ``LOST_MARGIN_DB`` below the oracle fails with a line that says so first:

    x_row loses the tensor at amax 5.0e-05 (float32): SNR 0.0 dB, oracle 20.4 dB,
    131,072 of 131,072 values 0

What is compared: the elements whose input is finite and whose oracle value is finite
(an Inf or NaN input, and an MX block that holds one, has no meaningful error; the
kernel's values there are judged by the bitwise comparison only). A non-finite kernel
value where the oracle's is finite is an infinite error. Truth is the input in float64
(rotated as the spec rotates it: the codes hold the rotated tensor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from mxcheck.diagnose.catalogue import element_format
from mxcheck.diagnose.quantize import compared_fields, field_problem
from mxcheck.formats import decode_table, get_format
from mxcheck.hadamard import apply_hadamard, get_hadamard
from mxcheck.recipes import OperandSpec
from mxcheck.scaling.nvfp4 import NVFP4Tensor

__all__ = ["LOST_DB", "LOST_MARGIN_DB", "TensorVerdict", "lost_lines", "tensor_verdict", "values_verdict"]

# How far under the oracle's SNR a kernel may fall on one input before it fails as losing
# signal. A convention difference (scale rule, tie rounding, operation order, a clamp)
# moves a tensor's SNR by well under 1 dB on these inputs (it changes some blocks by one
# binade or one code); 6 dB is four times the oracle's error power, which only a kernel
# that loses blocks or the whole tensor reaches. It orders the report, not the pass/fail:
# a kernel this far below the oracle also differs in its bits.
LOST_MARGIN_DB = 6.0
# At or under this SNR nothing of the tensor survives (the error power is at least the
# signal's, 10 * log10(1) = 0 dB): the line says "loses the tensor" rather than "loses N dB".
LOST_DB = 1.0


def _snr_db(test: torch.Tensor, truth: torch.Tensor) -> float:
    signal = float((truth * truth).sum())
    noise = float(((test - truth) ** 2).sum())
    if signal == 0:
        return math.nan  # nothing to keep
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if math.isfinite(noise) else -math.inf


@dataclass(frozen=True)
class TensorVerdict:
    """The kernel's and the oracle's SNR on one input, and what the kernel's values are."""

    operand: str
    dtype: torch.dtype
    amax: float  # the input's finite tensor amax
    kernel_db: float
    oracle_db: float
    compared: int  # elements compared (finite input and finite oracle value)
    zeros: int  # of those, kernel values that are 0
    nonfinite: int  # of those, kernel values that are NaN or Inf

    @property
    def threshold_db(self) -> float:
        return self.oracle_db - LOST_MARGIN_DB

    @property
    def passed(self) -> bool:
        """Fails only where the oracle keeps signal (an SNR above LOST_DB) and the kernel falls
        more than LOST_MARGIN_DB under it. An input with nothing to keep (all zero) passes, and
        so does one the oracle loses too (a tensorwise FP8 scale from an Inf amax: every value
        0): the verdict says a kernel loses what the recipe keeps; the bitwise comparison
        still judges its bits."""
        if math.isnan(self.oracle_db) or self.compared == 0 or self.oracle_db <= LOST_DB:
            return True
        return not (math.isnan(self.kernel_db) or self.kernel_db < self.threshold_db)

    def line(self) -> str:
        """The failure's headline, or a passing summary."""
        dtype = str(self.dtype).removeprefix("torch.")
        values = f"{self.zeros:,} of {self.compared:,} values 0"
        if self.nonfinite:
            values += f", {self.nonfinite:,} NaN or Inf"
        snr = f"SNR {self.kernel_db:.1f} dB, oracle {self.oracle_db:.1f} dB, {values}"
        if self.passed:
            return f"{self.operand} keeps the tensor at amax {self.amax:.1e} ({dtype}): {snr}"
        what = ("loses the tensor" if not self.kernel_db > LOST_DB
                else f"loses {self.oracle_db - self.kernel_db:.1f} dB")
        return f"{self.operand} {what} at amax {self.amax:.1e} ({dtype}): {snr}"

    def record_fields(self) -> dict[str, Any]:
        """Fields of a report Record (kind "snr"): the kernel's SNR against the oracle's less
        the margin, the oracle's SNR and the counts in ``extra``."""
        return {"snr_db": self.kernel_db, "threshold_db": self.threshold_db, "passed": self.passed,
                "total": self.compared,
                "extra": {"oracle_snr_db": self.oracle_db, "margin_db": LOST_MARGIN_DB, "zero_values": self.zeros,
                          "nonfinite_values": self.nonfinite, "tensor_amax": self.amax}}


def _as_oracle_type(oracle: Any, kernel: Any) -> Any | None:
    """The kernel's fields in the oracle's tensor type (so it dequantizes the same way), or
    None where a field is missing or shaped otherwise (the bitwise comparison says so)."""
    fields = compared_fields(oracle)
    if any(field_problem(f, getattr(kernel, f, None), getattr(oracle, f)) for f in fields):
        return None
    return replace(oracle, **{f: getattr(kernel, f).to(getattr(oracle, f).device) for f in fields})


def _readable(q: Any) -> tuple[Any, torch.Tensor | None]:
    """q with every byte outside its format's codes (an NVFP4 block scale of 0x80 or above, a
    4-bit code with high bits set) replaced by 0, and the elements those bytes decode (None
    if none): they have no value, so the verdict counts them as NaN, an infinite error."""
    bad = torch.zeros(q.codes.shape, dtype=torch.bool, device=q.codes.device)
    fixed = {}
    fields = (("codes", element_format(q)),) + ((("block_scales", get_format("ue4m3")),)
                                                  if isinstance(q, NVFP4Tensor) else ())
    for name, fmt in fields:
        field = getattr(q, name, None)
        if not isinstance(field, torch.Tensor) or field.dtype != torch.uint8:
            continue
        out = field.to(torch.int16) >= len(decode_table(fmt))  # 256 does not fit a uint8 compare
        if bool(out.any()):
            fixed[name] = field.masked_fill(out, 0)
            block = q.codes.shape[-1] // field.shape[-1] if name == "block_scales" else 1
            spread = out.repeat_interleave(block, dim=-1)[..., : q.codes.shape[-1]]
            if spread.shape == bad.shape:  # 2D tiles store a scale per tile row: their zeros stand
                bad |= spread
    return (replace(q, **fixed), bad) if fixed else (q, None)


def _truth(x: torch.Tensor, spec: OperandSpec) -> torch.Tensor:
    t = x.detach().to(torch.float64)
    rot = get_hadamard(spec.hadamard)
    return t if rot is None else apply_hadamard(t, rot, axis=-1)


def tensor_verdict(x: torch.Tensor, spec: OperandSpec, oracle: Any, kernel: Any, *,
                   operand: str) -> TensorVerdict | None:
    """Kernel and oracle SNR against float64 truth on the elements both can be judged on, the
    kernel's tensor (codes and scales) dequantized as the oracle's is; None where it cannot be
    read as the oracle's type, or either does not dequantize to x's shape."""
    theirs = _as_oracle_type(oracle, kernel)
    if theirs is None or not hasattr(oracle, "dequantize"):
        return None
    theirs, unreadable = _readable(theirs)
    theirs_v = theirs.dequantize().double().cpu()
    if unreadable is not None and unreadable.shape == theirs_v.shape:
        theirs_v = theirs_v.masked_fill(unreadable.cpu(), math.nan)
    return _verdict(x, spec, oracle.dequantize().double().cpu(), theirs_v, operand)


def values_verdict(x: torch.Tensor, spec: OperandSpec, oracle: Any, values: torch.Tensor, *,
                   operand: str) -> TensorVerdict | None:
    """The verdict of a kernel's values (``fake_quantize``): its values against truth beside
    the oracle's values in the same dtype (a bf16 kernel is held to the oracle rounded to
    bf16); None where the shapes differ."""
    if not isinstance(values, torch.Tensor) or not values.dtype.is_floating_point:
        return None
    ours_v = oracle.dequantize().to(values.dtype).double().cpu()
    return _verdict(x, spec, ours_v, values.detach().double().cpu(), operand)


def _verdict(x: torch.Tensor, spec: OperandSpec, ours_v: torch.Tensor, theirs_v: torch.Tensor,
             operand: str) -> TensorVerdict | None:
    truth = _truth(x, spec).cpu()
    if ours_v.shape != truth.shape or theirs_v.shape != truth.shape:
        return None
    keep = torch.isfinite(truth) & torch.isfinite(ours_v)
    finite_x = x.detach().double().abs()[torch.isfinite(x)]
    t, o, k = truth[keep], ours_v[keep], theirs_v[keep]
    return TensorVerdict(operand=operand, dtype=x.dtype, amax=float(finite_x.max()) if finite_x.numel() else 0.0,
                         kernel_db=_snr_db(k, t), oracle_db=_snr_db(o, t), compared=int(keep.sum()),
                         zeros=int((k == 0).sum()), nonfinite=int((~torch.isfinite(k)).sum()))


def _headline_order(v: TensorVerdict) -> tuple:
    """Which losing input heads the failure: a tensor lost outright first, then one whose
    oracle SNR is finite (an ordinary tensor, not one the oracle keeps exactly), then a
    float32 tensor, then the amax nearest 1 (a typical magnitude over a range end)."""
    amax = abs(math.log10(v.amax)) if v.amax > 0 else math.inf
    return (v.kernel_db > LOST_DB, not math.isfinite(v.oracle_db), v.dtype != torch.float32, amax)


def lost_lines(verdicts: list[tuple[TensorVerdict, str]], ran: int) -> list[str]:
    """The first lines of a quantize failure (codes or values): the losing input that heads
    it (``_headline_order``), then how many inputs lose signal and which; [] where none does."""
    lost = [(v, label) for v, label in verdicts if not v.passed]
    if not lost:
        return []
    worst = min((v for v, _ in lost), key=_headline_order)
    where = "; ".join(f"{v.operand} ({label})" for v, label in lost[:6]) + ("; ..." if len(lost) > 6 else "")
    return [worst.line(), f"{len(lost)} of {ran} quantize inputs lose signal (the kernel's SNR more than "
            f"{LOST_MARGIN_DB:g} dB under the oracle's against float64 truth): {where}"]
