"""How far a result is from its reference: SNR, cosine, errors, ULP and bit differences.

Every float metric runs in float64 and returns a Python float. ``ref`` is the
high-precision truth. A comparison against an all-zero ``ref`` has no signal: the
metrics say so with NaN (0/0) or Inf rather than a number a threshold could pass by
accident (an exactly-zero gradient is DESIGN.md's first vacuous-test trap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mxcheck.formats import FloatFormat, decode, encode, get_format
from mxcheck.scaling.blocks import CPU_CHUNK_ELEMENTS

__all__ = [
    "ULP_NAN",
    "BitDiff",
    "Comparison",
    "bit_diff",
    "compare",
    "cosine",
    "max_abs_error",
    "relative_error",
    "snr_db",
    "ulp_distance",
]

# ulp_distance between a NaN and a number: larger than any real distance (formats have at
# most 2**16 codes), so a bound such as `<= 1` fails, yet far enough from the int64 limit
# that a sum over many elements does not overflow.
ULP_NAN = 2**40


def _check_pair(test: torch.Tensor, ref: torch.Tensor) -> None:
    """A (test, ref) pair of real tensors of one shape on one device, not empty."""
    for name, t in (("test", test), ("ref", ref)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype.is_complex or t.dtype == torch.bool:
            raise TypeError(f"{name}.dtype={t.dtype}; expected a real floating or integer dtype")
    if test.shape != ref.shape:
        raise ValueError(
            f"test.shape={tuple(test.shape)} and ref.shape={tuple(ref.shape)} differ; "
            "compare tensors of the same shape"
        )
    if test.device != ref.device:
        raise ValueError(f"test is on {test.device} and ref on {ref.device}; move them to one device")
    if test.numel() == 0:
        raise ValueError(f"test and ref are empty (shape {tuple(test.shape)}): nothing to compare")


def _pair_float64(test: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a (test, ref) pair and return both as float64."""
    _check_pair(test, ref)
    # metrics measure values, not graphs: a tensor that requires grad is read detached
    return test.detach().to(torch.float64), ref.detach().to(torch.float64)


def _ratio(num: float, den: float) -> float:
    """num / den for num, den >= 0 (or NaN): 0/0 and NaN -> NaN, x/0 -> Inf, Inf/Inf -> NaN."""
    if math.isnan(num) or math.isnan(den) or (math.isinf(num) and math.isinf(den)):
        return math.nan
    if den == 0.0:
        return math.nan if num == 0.0 else math.inf
    return num / den


def _snr_from_sums(signal: float, noise: float) -> float:
    ratio = _ratio(signal, noise)
    if math.isnan(ratio) or math.isinf(ratio):
        return ratio
    return -math.inf if ratio == 0.0 else 10.0 * math.log10(ratio)


def _cosine_from_sums(test_sq: float, ref_sq: float, dot: float) -> float:
    norms = math.sqrt(test_sq) * math.sqrt(ref_sq)
    if norms == 0.0 or math.isinf(norms):
        return math.nan
    value = dot / norms
    # NaN must stay NaN: min/max would turn it into a clamp bound
    return value if math.isnan(value) else max(-1.0, min(1.0, value))


def snr_db(test: torch.Tensor, ref: torch.Tensor) -> float:
    """``10*log10(sum(ref**2) / sum((test - ref)**2))`` in float64.

    Inf when test equals ref and ref is non-zero. For an all-zero ref there is no signal:
    -Inf when test differs, NaN when test is all zero too (0/0; NaN fails every threshold,
    so a vacuous all-zero comparison cannot pass). A NaN in either input, or an Inf in ref,
    gives NaN; an Inf in test against a finite ref gives -Inf.
    """
    t, r = _pair_float64(test, ref)
    return _snr_from_sums(float((r * r).sum()), float(((t - r) ** 2).sum()))


def cosine(test: torch.Tensor, ref: torch.Tensor) -> float:
    """Cosine similarity of the flattened tensors in float64, clamped to [-1, 1].

    NaN when either is all zero (no direction), or holds a NaN or an Inf.
    """
    t, r = _pair_float64(test, ref)
    return _cosine_from_sums(float((t * t).sum()), float((r * r).sum()), float((t * r).sum()))


@dataclass(frozen=True)
class Comparison:
    """``snr_db``, ``cosine`` and ``max_abs_error`` of one (test, ref) pair."""

    snr_db: float
    cosine: float
    max_abs_error: float


def compare(test: torch.Tensor, ref: torch.Tensor) -> Comparison:
    """The three metrics from dot products instead of squared temporaries, for tensors of
    hundreds of millions of elements: on a CPU, over float64 copies of one chunk of
    ``CPU_CHUNK_ELEMENTS`` at a time (a full-size float64 copy of a large wgrad is a
    page-faulting allocation per call, as much system time as arithmetic). Equal to
    ``snr_db``, ``cosine`` and ``max_abs_error`` up to float64 summation order."""
    _check_pair(test, ref)
    flat_t, flat_r = test.detach().reshape(-1), ref.detach().reshape(-1)
    n = flat_t.numel()
    step = n if flat_t.is_cuda else CPU_CHUNK_ELEMENTS
    tt = rr = tr = dd = 0.0
    max_abs = 0.0
    for i in range(0, n, step):
        t, r = flat_t[i:i + step].to(torch.float64), flat_r[i:i + step].to(torch.float64)
        d = t - r
        lo, hi = torch.aminmax(d)
        worst = max(abs(float(lo)), abs(float(hi)))  # a NaN makes both NaN
        max_abs = math.nan if math.isnan(worst) or math.isnan(max_abs) else max(max_abs, worst)
        tt, rr, tr, dd = (tt + float(torch.dot(t, t)), rr + float(torch.dot(r, r)), tr + float(torch.dot(t, r)),
                          dd + float(torch.dot(d, d)))
    return Comparison(snr_db=_snr_from_sums(rr, dd), cosine=_cosine_from_sums(tt, rr, tr), max_abs_error=max_abs)


def relative_error(test: torch.Tensor, ref: torch.Tensor) -> float:
    """``||test - ref|| / ||ref||`` (Frobenius) in float64; all-zero ref: 0/0 NaN, x/0 Inf."""
    t, r = _pair_float64(test, ref)
    return _ratio(float((t - r).norm()), float(r.norm()))


def max_abs_error(test: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |test - ref|`` in float64; NaN if any difference is NaN."""
    t, r = _pair_float64(test, ref)
    return float((t - r).abs().max())


# ---------------------------------------------------------------------------------------
# Codes: ordinals, ULP distances and bit differences.


def _nan_mask(codes: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    return decode(codes, fmt).isnan()


def _ordinal(codes: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """A monotone integer per code: +magnitude code, or -magnitude code when the sign is set.

    Magnitude codes are ordered by value (Inf, where present, one past the largest finite),
    so adjacent values are one apart and +0 / -0 are both 0.
    """
    c = codes.to(torch.int64)
    mag = c & fmt.magnitude_mask
    return torch.where((c & fmt.sign_mask) != 0, -mag, mag)


def _code_distance(a: torch.Tensor, b: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """int64 |ordinal(a) - ordinal(b)|; two NaN codes are 0 apart, NaN and a number ULP_NAN."""
    dist = (_ordinal(a, fmt) - _ordinal(b, fmt)).abs()
    nan_a, nan_b = _nan_mask(a, fmt), _nan_mask(b, fmt)
    dist = torch.where(nan_a & nan_b, 0, dist)
    return torch.where(nan_a ^ nan_b, ULP_NAN, dist)


def ulp_distance(a: torch.Tensor, b: torch.Tensor, fmt: str | FloatFormat) -> torch.Tensor:
    """Per element, how many representable steps of fmt lie between a and b (int64).

    Each value is first rounded to fmt (RNE, no saturation: finite overflow becomes Inf in
    e5m2, NaN in e4m3, +-max in the fp4/fp6 types). The distance is taken on a monotone
    ordinal of the codes, so +0 and -0 are 0 apart and +-max to +-Inf is 1. NaN: two NaNs
    are 0 apart; a NaN against a number is ``ULP_NAN`` (2**40), which fails any real bound.
    A NaN input for a format without NaN (e2m1, e2m3, e3m2) is a ValueError.
    """
    fmt = get_format(fmt)
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if a.shape != b.shape:
        raise ValueError(f"a.shape={tuple(a.shape)} and b.shape={tuple(b.shape)} differ")
    if fmt.nan == "none":
        for name, t in (("a", a), ("b", b)):
            if t.dtype.is_floating_point and bool(t.isnan().any()):
                raise ValueError(f"{name} holds NaN but fmt={fmt.name} has no NaN code to round it to")
    ca = encode(a, fmt, rounding="rne", saturate=False)
    cb = encode(b, fmt, rounding="rne", saturate=False)
    return _code_distance(ca, cb, fmt)


@dataclass(frozen=True)
class BitDiff:
    """Where two code tensors differ, as bits (so -0 vs +0 differs and equal NaN bits match).

    ``indices`` (tuples into the original shape), ``test_codes``/``ref_codes`` and, with a
    format, ``test_values``/``ref_values`` describe the first ``len(indices)`` differences
    in row-major order; ``max_ulp`` is the largest ULP distance over all differences
    (``ULP_NAN`` if a NaN meets a number; None without a format).
    """

    n_diff: int
    total: int
    shape: tuple[int, ...]
    indices: tuple[tuple[int, ...], ...]
    test_codes: tuple[int, ...]
    ref_codes: tuple[int, ...]
    fmt: str | None = None
    test_values: tuple[float, ...] | None = None
    ref_values: tuple[float, ...] | None = None
    max_ulp: int | None = None

    @property
    def equal(self) -> bool:
        return self.n_diff == 0

    def __str__(self) -> str:
        where = f" ({self.fmt})" if self.fmt else ""
        if self.n_diff == 0:
            return f"all {self.total:,} codes{where} equal, shape {list(self.shape)}"
        pct = 100.0 * self.n_diff / self.total
        head = f"{self.n_diff:,} of {self.total:,} codes{where} differ ({pct:.3g}%), shape {list(self.shape)}"
        if self.max_ulp is not None:
            head += "; max ulp: NaN vs number" if self.max_ulp >= ULP_NAN else f"; max {self.max_ulp} ulp"
        width = max(2, (max(self.test_codes + self.ref_codes).bit_length() + 3) // 4)
        lines = [head, f"first {len(self.indices)}:"]
        for k, idx in enumerate(self.indices):
            line = f"  {list(idx)}: test 0x{self.test_codes[k]:0{width}x} ref 0x{self.ref_codes[k]:0{width}x}"
            if self.test_values is not None and self.ref_values is not None:
                line += f" ({self.test_values[k]!r} vs {self.ref_values[k]!r})"
            lines.append(line)
        return "\n".join(lines)


def _as_codes(codes: torch.Tensor, name: str) -> torch.Tensor:
    """int64 bit patterns of an integer tensor, or of a float tensor's integer view."""
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(codes).__name__}")
    if codes.dtype.is_complex or codes.dtype == torch.bool:
        raise TypeError(f"{name}.dtype={codes.dtype}; expected integer codes (or a float tensor, compared as bits)")
    if codes.dtype.is_floating_point:
        bits = codes.element_size() * 8
        ints = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[bits]
        view = codes.contiguous().view(ints).to(torch.int64)
        return view & ((1 << bits) - 1) if bits < 64 else view
    return codes.to(torch.int64)


def _check_code_range(codes: torch.Tensor, fmt: FloatFormat, name: str) -> None:
    bad = (codes < 0) | (codes >= (1 << fmt.bits))
    if bool(bad.any()):
        first = int(codes[bad][0])
        raise ValueError(
            f"{name} holds {int(bad.sum())} values outside [0, {(1 << fmt.bits) - 1}] for "
            f"fmt={fmt.name} (first {first:#x}); codes carry the format's bits in the low bits"
        )


def bit_diff(
    test_codes: torch.Tensor,
    ref_codes: torch.Tensor,
    fmt: str | FloatFormat | None = None,
    *,
    limit: int = 8,
) -> BitDiff:
    """Compare two code tensors bit for bit; with fmt, decode the differences and measure ULPs.

    Float tensors are compared through their integer views (exact for NaN and -0).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit={limit!r}; expected an int >= 0 (how many differences to keep)")
    t, r = _as_codes(test_codes, "test_codes"), _as_codes(ref_codes, "ref_codes")
    if t.shape != r.shape:
        raise ValueError(f"test_codes.shape={tuple(t.shape)} and ref_codes.shape={tuple(r.shape)} differ")
    if t.device != r.device:
        raise ValueError(f"test_codes is on {t.device} and ref_codes on {r.device}; move them to one device")
    differ = t != r
    where = torch.nonzero(differ)[:limit]
    first_t, first_r = t[differ][:limit], r[differ][:limit]
    extra = {}
    if fmt is not None:
        f = get_format(fmt)
        _check_code_range(t, f, "test_codes")
        _check_code_range(r, f, "ref_codes")
        extra = {
            "fmt": f.name,
            "test_values": tuple(decode(first_t, f).tolist()),
            "ref_values": tuple(decode(first_r, f).tolist()),
            "max_ulp": int(_code_distance(t[differ], r[differ], f).max()) if bool(differ.any()) else 0,
        }
    return BitDiff(
        n_diff=int(differ.sum()),
        total=t.numel(),
        shape=tuple(t.shape),
        indices=tuple(tuple(i) for i in where.tolist()),
        test_codes=tuple(first_t.tolist()),
        ref_codes=tuple(first_r.tolist()),
        **extra,
    )
