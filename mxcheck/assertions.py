"""Assertions whose failure message says what differs, where, and how to reproduce it.

Each ``assert_*`` returns what it measured and raises :class:`NumericsError` naming the
comparison (``context``: backend, recipe, layer, direction, M/N/K), the numbers and the
worst elements; each has a ``check_*`` twin that returns the :class:`~mxcheck.outcome.Outcome`
instead, for the report recorder (``mxcheck.report.recorder.Numerics``, the plugin's
``numerics`` fixture). DESIGN.md's traps are refused rather than passed vacuously: an
all-zero SNR comparison fails and ``assert_nonzero_grads`` names every zero or missing
gradient (trap 1). ``count_graph_breaks`` (``mxcheck.graph_breaks``, trap 3) and
``assert_deterministic`` (``mxcheck.determinism``) are re-exported here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mxcheck.determinism import assert_deterministic
from mxcheck.formats import FORMATS, FloatFormat
from mxcheck.graph_breaks import count_graph_breaks
from mxcheck.metrics import ULP_NAN, BitDiff, bit_diff, cosine, max_abs_error, snr_db
from mxcheck.outcome import CONTEXT_KEYS, Context, NumericsError, Outcome, raise_unless, say

__all__ = [
    "CONTEXT_KEYS",
    "NumericsError",
    "RoundingResult",
    "SNRResult",
    "assert_bitwise_equal",
    "assert_deterministic",
    "assert_nonzero_grads",
    "assert_snr",
    "assert_within_rounding",
    "count_graph_breaks",
    "ulp",
]

_ZERO_INIT_HINT = ("a zero-initialised output layer (adaLN-Zero, DESIGN.md trap 1) makes every "
                   "upstream gradient exactly zero: break the zero-init before checking a GEMM")
# torch dtype -> the format with its exact layout (bf16, fp16, the fp8 types, e8m0).
_DTYPE_FORMATS = {f.torch_dtype: f for f in FORMATS.values()
                  if f.torch_dtype is not None and f.bits == 8 * f.torch_dtype.itemsize}


def _check_pair(test: torch.Tensor, ref: torch.Tensor, names: tuple[str, str]) -> None:
    for name, t in zip(names, (test, ref), strict=True):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if test.shape != ref.shape:
        raise ValueError(f"{names[0]}.shape={tuple(test.shape)} and {names[1]}.shape="
                         f"{tuple(ref.shape)} differ; compare tensors of one shape")


def _index(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape)))



@dataclass(frozen=True)
class SNRResult:
    """An SNR comparison; ``worst`` holds the 5 largest |errors| as (index, test, ref)."""

    snr_db: float
    threshold_db: float
    cosine: float
    max_abs_error: float
    worst: list[tuple[tuple[int, ...], float, float]]
    passed: bool
    mismatches: int = 0  # elements whose values differ
    total: int = 0

    def to_record_fields(self) -> dict[str, Any]:
        """snr_db, threshold_db, cosine, max_abs_error, passed, mismatches, total."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "worst"}


def check_snr(test: torch.Tensor, ref: torch.Tensor, threshold_db: float,
               context: Context) -> Outcome:
    _check_pair(test, ref, ("test", "ref"))
    threshold_db = float(threshold_db)
    t, r = test.detach().double(), ref.detach().double()
    snr, cos, mae = snr_db(test, ref), cosine(test, ref), max_abs_error(test, ref)
    err = (t - r).abs().reshape(-1).nan_to_num(nan=math.inf)
    top = err.topk(min(5, err.numel()))
    worst = [(_index(i, t.shape), float(t.reshape(-1)[i]), float(r.reshape(-1)[i]))
             for v, i in zip(top.values.tolist(), top.indices.tolist(), strict=True) if v > 0]
    vacuous = not bool(r.any()) and not bool(t.any())
    passed = not vacuous and not math.isnan(snr) and snr >= threshold_db
    value = SNRResult(snr, threshold_db, cos, mae, worst, passed, int((err > 0).sum()), t.numel())
    nd = 1 if f"{snr:.1f}" != f"{threshold_db:.1f}" else 4  # never print "20.0 < 20.0"
    details = [f"{value.mismatches:,} of {t.numel():,} elements differ",
               f"cosine {cos:.6g}, max abs error {mae:.6g}"]
    if vacuous:
        head = f"SNR comparison is vacuous: test and ref are all zero ({t.numel():,} elements)"
        details = [_ZERO_INIT_HINT]
    elif math.isnan(snr):
        head = (f"SNR is NaN (threshold {threshold_db:.{nd}f} dB): test has "
                f"{int(t.isnan().sum()):,} NaN, ref {int(r.isnan().sum()):,} NaN and "
                f"{int(r.isinf().sum()):,} Inf")
    else:
        head = f"SNR {snr:.{nd}f} dB {'>=' if passed else '<'} {threshold_db:.{nd}f} dB"
    if worst and not passed and not vacuous:
        details.append("largest errors: " + ", ".join(
            f"{list(i)} test {tv:.6g} ref {rv:.6g}" for i, tv, rv in worst))
    return Outcome(value, passed, say(head, context, *details), value.to_record_fields())


def assert_snr(test: torch.Tensor, ref: torch.Tensor, threshold_db: float, *,
               context: Context = None) -> SNRResult:
    """SNR of test against ref (float64, DESIGN.md's definition) must reach threshold_db.

    A NaN SNR fails, and so does an all-zero test against an all-zero ref: that comparison
    has no signal and would pass whatever the backend did (the zero-init trap).
    """
    return raise_unless(check_snr(test, ref, threshold_db, context))


def _float_max_ulp(t: torch.Tensor, r: torch.Tensor) -> int:
    """Max ULP distance of two float tensors of one dtype, on their monotone integer order."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]

    def order(x: torch.Tensor) -> torch.Tensor:
        v = x.contiguous().view(ints).to(torch.int64)
        return torch.where(v < 0, -(v & torch.iinfo(ints).max), v)

    dist = (order(t) - order(r)).abs()
    dist = torch.where(t.isnan() & r.isnan(), 0, torch.where(t.isnan() ^ r.isnan(), ULP_NAN, dist))
    return int(dist.max())


def check_bitwise(test: torch.Tensor, ref: torch.Tensor, fmt: str | FloatFormat | None,
                   context: Context) -> Outcome:
    _check_pair(test, ref, ("test", "ref"))
    if test.dtype != ref.dtype:
        raise TypeError(f"test.dtype={test.dtype} and ref.dtype={ref.dtype}; bitwise equality "
                        "needs one dtype: cast the one you mean to compare")
    test, ref = test.detach(), ref.detach()
    fmt = _DTYPE_FORMATS.get(test.dtype) if fmt is None else fmt
    diff = bit_diff(test, ref, fmt)
    if fmt is None and test.dtype.is_floating_point and not diff.equal:  # float32, float64
        diff = dataclasses.replace(
            diff, fmt=str(test.dtype).removeprefix("torch."), max_ulp=_float_max_ulp(test, ref),
            test_values=tuple(float(test[i]) for i in diff.indices),
            ref_values=tuple(float(ref[i]) for i in diff.indices))
    ulps = diff.max_ulp
    how = ", ".join([diff.fmt or str(test.dtype).removeprefix("torch.")] + (
        [] if ulps is None else ["max ulp NaN vs number" if ulps >= ULP_NAN else f"max {ulps} ulp"]))
    head = (f"bit-identical: {diff.total:,} elements ({how})" if diff.equal else
            f"{diff.n_diff:,} of {diff.total:,} elements differ bitwise ({how})")
    msg = say(head, context, f"shape {list(diff.shape)}")
    if not diff.equal:  # BitDiff's list of the first differences, one per line
        msg += "\n" + "\n".join(str(diff).split("\n")[1:])
    fields = {"bit_equal": diff.equal, "mismatches": diff.n_diff, "total": diff.total,
              "passed": diff.equal, "extra": {"max_ulp": ulps}}
    return Outcome(diff, diff.equal, msg, fields)


def assert_bitwise_equal(test: torch.Tensor, ref: torch.Tensor, *,
                         fmt: str | FloatFormat | None = None, context: Context = None) -> BitDiff:
    """test and ref must hold the same bits (floats through integer views, so NaN payloads
    and signs, and -0 against +0, count). Code tensors with ``fmt``, and float tensors, get
    their first differences decoded and the largest ULP distance in the message.
    """
    return raise_unless(check_bitwise(test, ref, fmt, context))


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at the magnitude of each element of x, in float64.

    For |x| in [2**e, 2**(e+1)) it is 2**(e - mantissa bits); below the smallest normal
    (subnormals and zero) it is the smallest subnormal. NaN for non-finite x.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype={dtype!r}; expected a torch floating dtype such as torch.bfloat16")
    fi = torch.finfo(dtype)
    mbits = 1 - math.frexp(fi.eps)[1]  # eps = 2**-mbits = 0.5 * 2**(1 - mbits)
    emin = math.frexp(fi.smallest_normal)[1] - 1
    a = x.detach().to(torch.float64).abs()
    exponent = torch.frexp(a).exponent.to(torch.float64) - 1  # a = m * 2**e, m in [0.5, 1)
    exponent = torch.where(a >= fi.smallest_normal, exponent, float(emin))
    return torch.where(a.isfinite(), torch.ldexp(torch.ones_like(a), exponent - mbits), math.nan)


@dataclass(frozen=True)
class RoundingResult:
    """How far result is from exact in ulps of ``dtype``; the worst element by ulps."""

    dtype: torch.dtype
    k: int
    max_ulps: float
    worst_index: tuple[int, ...]
    worst_result: float
    worst_exact: float
    max_abs_error: float
    exceed: int  # elements more than k ulps away
    total: int
    passed: bool


def check_rounding(result: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype, k: int,
                    context: Context) -> Outcome:
    _check_pair(result, exact, ("result", "exact"))
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k={k!r}; expected an int >= 0 (how many ulps, one per rounding)")
    r, e = result.detach().double(), exact.detach().double()
    u = ulp(e, dtype).reshape(-1)
    same = ((r == e) | (r.isnan() & e.isnan())).reshape(-1)
    diff = torch.where(same, 0.0, (r - e).abs().reshape(-1))
    ulps = torch.where(same, 0.0, (diff / u).nan_to_num(nan=math.inf))
    exceed, i, name = int((ulps > k).sum()), int(ulps.argmax()), str(dtype).removeprefix("torch.")
    value = RoundingResult(dtype, k, float(ulps[i]), _index(i, r.shape), float(r.reshape(-1)[i]),
                           float(e.reshape(-1)[i]), float(diff.max()), exceed, r.numel(), not exceed)
    head = (f"{exceed:,} of {r.numel():,} elements more than {k} {name} ulp from exact" if exceed
            else f"all {r.numel():,} elements within {k} {name} ulp of exact")
    worst = (f"worst {list(value.worst_index)}: result {value.worst_result!r} exact "
             f"{value.worst_exact!r} is {value.max_ulps:.3g} ulp (ulp there {float(u[i])!r})")
    fields = {"max_abs_error": value.max_abs_error, "mismatches": exceed, "total": r.numel(),
              "passed": value.passed, "extra": {"max_ulps": value.max_ulps, "k": k, "dtype": name}}
    return Outcome(value, value.passed, say(head, context, worst), fields)


def assert_within_rounding(result: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype, *,
                           k: int = 1, context: Context = None) -> RoundingResult:
    """|result - exact| <= k * ulp(exact, dtype) elementwise (equal NaNs and Infs pass).

    One correct rounding errs by at most half an ulp and a double rounding (say float32,
    then bf16) by just over half, so k=1 holds a result rounded once or twice; allow one
    more ulp per further rounding the computation performs.
    """
    return raise_unless(check_rounding(result, exact, dtype, k, context))


def _named(params: Any, names: Sequence[str] | None) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, torch.nn.Module):
        pairs = [(n, p) for n, p in params.named_parameters() if p.requires_grad]
    else:
        pairs = list(params)
        if not all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], torch.Tensor)
                   for p in pairs):
            raise TypeError("params must be an nn.Module or (name, tensor) pairs")
    if names is not None:
        known = dict(pairs)
        missing = [n for n in names if n not in known]
        if missing:
            raise ValueError(f"names {missing} are not among the parameters {sorted(known)}")
        pairs = [(n, known[n]) for n in names]
    if not pairs:
        raise ValueError("no parameters to check: an empty list passes vacuously; pass the "
                         "module or the (name, tensor) pairs whose gradients must be non-zero")
    return [(str(n), p) for n, p in pairs]


def check_grads(params: Any, names: Sequence[str] | None, context: Context) -> Outcome:
    pairs = _named(params, names)
    measured: dict[str, float | None] = {}
    bad: dict[str, list[str]] = {"none": [], "zero": [], "nonfinite": []}
    for name, p in pairs:
        g = None if p.grad is None else p.grad.detach()
        measured[name] = None if g is None else float(g.double().abs().max()) if g.numel() else 0.0
        why = ("none" if g is None else "nonfinite" if not bool(g.isfinite().all())
               else "zero" if not bool(g.any()) else None)
        if why:
            bad[why].append(name)
    says = {"none": "grad is None", "zero": "grad is all zeros", "nonfinite": "grad has NaN/Inf"}
    listed = [f"{n}: {says[why]}" for why, ns in bad.items() for n in ns]
    head = (f"{len(listed)} of {len(pairs)} parameters have no usable gradient" if listed
            else f"all {len(pairs)} parameters have non-zero gradients")
    hint = _ZERO_INIT_HINT if bad["zero"] else ""
    fields = {"mismatches": len(listed), "total": len(pairs), "passed": not listed,
              "extra": {k: v for k, v in bad.items() if v}}
    return Outcome(measured, not listed, say(head, context, *listed, hint), fields)


def assert_nonzero_grads(params: torch.nn.Module | Iterable[tuple[str, torch.Tensor]], *,
                         names: Sequence[str] | None = None,
                         context: Context = None) -> dict[str, float | None]:
    """Every listed parameter has a finite gradient that is not all zeros.

    ``params``: a module (its trainable parameters) or (name, tensor) pairs; ``names``
    picks some of them. Returns name -> max |grad| (None for a missing grad). The failure
    lists every offender and says whether its grad is None, all zeros or non-finite. An
    empty list is refused (ValueError).
    """
    return raise_unless(check_grads(params, names, context))

