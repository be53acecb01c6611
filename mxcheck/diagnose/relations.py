"""Field relations: what exactly differs when no known behaviour reproduces a comparison.

For each field of a quantized tensor that differs (codes, scales, block_scales,
tensor_scale, scale_inv), the kernel's entries are tested against the oracle's under a
small closed algebra (``KINDS``): rounded to bf16 or fp16 (RNE or truncation), one step up
or down in magnitude, times 2^k, a constant, the sign flipped, NaN, Inf. A relation is
stated only for the blocks where it reproduces every differing entry of its field, with
that coverage, and with the condition that picks out exactly those blocks where one exists
(every block; all-zero blocks; blocks holding NaN or Inf; an amax threshold), as the input
dtype the comparison ran in. Everything here is data-driven and never raises on any byte or
float bit pattern a kernel may write.

A relation's ``name`` is ``"FIELD: KIND"`` ("tensor_scale: bf16_rne", "codes: nan",
"scales: constant 127", "scale_inv: times 2^-48"); a benchmark matches on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import torch

from mxcheck.diagnose.catalogue import element_format
from mxcheck.diagnose.compare import _bits, _element_diffs, _expand, _per_block
from mxcheck.formats import FloatFormat, decode_table, get_format

__all__ = [
    "KINDS",
    "Condition",
    "FieldEntries",
    "Relation",
    "block_facts",
    "combine",
    "float32_text",
    "ratio_text",
    "relate",
    "relate_fields",
    "relation_name",
]

# Every kind of relation (what the kernel's entry is, given the oracle's), in the order one
# is preferred where two cover the same blocks: a constant before a step or a power of two
# (the kernel writes that value, whatever the oracle's was). Readings of a values kernel
# put every constant first (relate_fields' alternatives): a float32 value flushed to 0 is
# also "the oracle's rounded to float16", which says less. "times 2^K" stands for one kind
# per integer K ("times 2^-48"); the constants of a byte field compare decoded values, but
# "constant 127" is the byte itself (E8M0 2^0, the byte a missing scale falls back to).
KINDS: dict[str, str] = {
    "bf16_rne": "the oracle's float rounded to bfloat16, ties to even",
    "bf16_trunc": "the oracle's float truncated (toward zero) to bfloat16",
    "fp16_rne": "the oracle's float rounded to float16, ties to even",
    "fp16_trunc": "the oracle's float truncated (toward zero) to float16",
    "nan": "NaN (for a byte: a NaN code, or a byte outside the format's codes)",
    "inf": "+Inf or -Inf",
    "sign_flipped": "the oracle's with its sign bit flipped",
    "constant 127": "the byte 127",
    "constant 0": "the value 0 (either sign)",
    "constant 1": "the value 1",
    "constant 0.125": "the value 0.125",
    "constant max": "the field's largest finite value",
    "constant -max": "the field's most negative finite value",
    "ulp_up": "one step (one ulp, or the next code) above the oracle's in magnitude, same sign",
    "ulp_down": "one step (one ulp, or the next code) below the oracle's in magnitude, same sign",
    "times 2^K": "the oracle's times the power of two 2^K, exactly (K an integer, not 0)",
    # kinds of a free float field (a block scale read from a values kernel's values): the
    # value it holds is any constant, or any ratio to the oracle's ("constant 1e-10",
    # "times 4/3", printed as the shortest text that is that float32)
    "constant C": "the constant C, one float32 value in every block it covers",
    "times R": "the oracle's times R, one ratio that is not a power of two",
    "not a power of two": "a value that is not a power of two where the oracle's is one",
}

_TEXT = {
    "bf16_rne": "the oracle's rounded to bfloat16 (RNE)",
    "bf16_trunc": "the oracle's truncated to bfloat16",
    "fp16_rne": "the oracle's rounded to float16 (RNE)",
    "fp16_trunc": "the oracle's truncated to float16",
    "ulp_up": "one step above the oracle's in magnitude",
    "ulp_down": "one step below the oracle's in magnitude",
    "sign_flipped": "the oracle's with the sign flipped",
    "nan": "NaN",
    "inf": "Inf",
}
_ROUNDED = {"bf16_rne": (torch.bfloat16, False), "bf16_trunc": (torch.bfloat16, True),
            "fp16_rne": (torch.float16, False), "fp16_trunc": (torch.float16, True)}
_VALUE_CONSTANTS = {"constant 0": 0.0, "constant 1": 1.0, "constant 0.125": 0.125}
_BYTE_FIELDS = {"scales": "e8m0", "block_scales": "ue4m3"}  # codes: the element format


def relation_name(field: str, kind: str) -> str:
    """The stable name of a relation: ``"FIELD: KIND"``."""
    return f"{field}: {kind}"


def _kind_text(kind: str, fmt: FloatFormat | None) -> str:
    if kind in _TEXT:
        return _TEXT[kind]
    if kind.startswith("times "):
        return f"the oracle's {kind}"
    if fmt is not None and kind == "constant 127":
        table = decode_table(fmt)
        return f"byte 0x7f ({float(table[127]) if len(table) > 127 else 'not a code'})"
    value = kind.removeprefix("constant ")
    # the text reads back as the float32 it names (float32_text): test that float32
    if kind not in KINDS and not bool(_is_power_of_two(torch.tensor(float(value), dtype=torch.float32))):
        return f"{value}, not a power of two"  # a free constant (constant C)
    return value


# ---- where a relation holds ---------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    """The blocks a relation covers, where one test picks out exactly those: ``kind`` is
    "every" (every block), "zero" (all-zero blocks), "special" (blocks holding NaN or Inf),
    "amax_below" / "nonzero_amax_below" / "amax_at_least" (finite blocks, or finite nonzero
    ones, on one side of a threshold in ``(low, high]``, the threshold's possible range), or
    "" (no such test: the relation is stated with its count only). ``matching``: blocks the test picks (all covered).
    ``dtypes``: the input dtypes of the comparisons it holds in."""

    kind: str = ""
    low: float = 0.0
    high: float = 0.0
    matching: int = 0
    dtypes: tuple[str, ...] = ()

    @property
    def threshold(self) -> float:
        """A power of two in (low, high] where one lies there, else ``high``."""
        if not (0 < self.high < math.inf):
            return self.high
        p = 2.0 ** math.floor(math.log2(self.high))
        return p if p > self.low else self.high

    def text(self) -> str:
        dtype = f"{'/'.join(self.dtypes)} " if self.dtypes else ""
        t = self.threshold
        shown = f"2^{int(math.log2(t))}" if t > 0 and math.isfinite(t) and math.log2(t).is_integer() else f"{t:.3g}"
        if self.kind.startswith(("amax", "nonzero")) and not math.isfinite(t):  # every finite block of its kind
            return {"amax_below": f"every finite {dtype}block",
                    "nonzero_amax_below": f"every nonzero finite {dtype}block"}.get(self.kind, "")
        return {"every": f"every {dtype}block", "zero": f"every all-zero {dtype}block",
                "special": f"every {dtype}block holding NaN or Inf",
                "amax_below": f"every {dtype}block whose amax is below {shown}",
                "nonzero_amax_below": f"every nonzero {dtype}block whose amax is below {shown}",
                "amax_at_least": f"every finite {dtype}block whose amax is at least {shown}"}.get(self.kind, "")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "matching": self.matching, "dtypes": list(self.dtypes)}
        if self.kind.startswith(("amax", "nonzero")):
            out["threshold"] = self.threshold
        return out


@dataclass(frozen=True)
class Relation:
    """One relation of one field: the kernel's entries are ``kind`` of the oracle's in
    ``covered`` of the ``total`` units (blocks; comparisons for a per-tensor field) where the
    field differs, and in those the condition holds. ``also``: the other fields that differ
    in the blocks it covers (each stated by its own relations). ``comparisons``: how many
    comparisons it was found in."""

    field: str
    kind: str
    covered: int
    total: int
    unit: str
    condition: Condition
    also: tuple[str, ...] = ()
    comparisons: int = 1
    kind_text: str = ""

    @property
    def name(self) -> str:
        return relation_name(self.field, self.kind)

    @property
    def exact(self) -> bool:
        """It covers every unit where its field differs."""
        return self.covered == self.total

    def line(self) -> str:
        what = f"{self.field}: {self.kind_text or self.kind}"
        rest = f"with {' and '.join(self.also)} also differing there" if self.also else "nothing else differs"
        if self.unit == "comparisons":
            if self.total == 1:
                return f"{what}, and {rest}"
            return f"{what}, in {self.covered:,} of {self.total:,} differing comparisons, and {rest}"
        c = self.condition
        if c.kind:
            where = f" in {c.text()} ({self.covered:,} of {c.matching:,} such {self.unit}"
            where += f", in {self.comparisons:,} comparison{'s' if self.comparisons != 1 else ''})"
            where += ", and nowhere else" if self.exact else f"; {self.total - self.covered:,} more differ otherwise"
        else:
            where = f" in {self.covered:,} of the {self.total:,} {self.unit} where the field differs"
        return f"{what}{where}; {rest}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "field": self.field, "kind": self.kind, "covered": self.covered,
                "total": self.total, "unit": self.unit, "also": list(self.also), "comparisons": self.comparisons,
                "condition": self.condition.to_json(), "text": self.line()}


# ---- the algebra, on one field ------------------------------------------------------------------


def _values(raw: torch.Tensor, fmt: FloatFormat | None) -> torch.Tensor:
    """A field's entries as float64: a byte decoded in its format (a byte outside the
    format's codes is NaN, as the verdict counts it), a float field as it is."""
    if fmt is None:
        return raw.double()
    table = decode_table(fmt)
    idx = raw.to(torch.int64)
    inside = (idx >= 0) & (idx < len(table))
    return torch.where(inside, table[idx.clamp(0, len(table) - 1)], math.nan)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Equal as stored (signs and -0 count; any NaN equals any NaN)."""
    a, b = a.float(), b.float()
    return (a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())


def _rounded(o: torch.Tensor, dtype: torch.dtype, truncate: bool) -> torch.Tensor:
    """o rounded to dtype (RNE, or toward zero: one step back where RNE went up in
    magnitude, an overflow to Inf included), returned in o's dtype."""
    r = o.to(dtype)
    if truncate:
        up = r.double().abs() > o.double().abs()
        r = torch.where(up, (r.view(torch.int16) - 1).view(dtype), r)
    return r.to(o.dtype)


def _byte_step(k: torch.Tensor, o: torch.Tensor, kv: torch.Tensor, ov: torch.Tensor, fmt: FloatFormat,
               step: int) -> torch.Tensor:
    """k is the code next to o in magnitude (step +1 up, -1 down), same sign, both numbers."""
    k, o = k.to(torch.int64), o.to(torch.int64)
    same_sign = (k & fmt.sign_mask) == (o & fmt.sign_mask)
    return same_sign & (k - o == step) & ~kv.isnan() & ~ov.isnan()


def _holds(k: torch.Tensor, o: torch.Tensor, fmt: FloatFormat | None) -> dict[str, torch.Tensor]:
    """Per entry of a field, whether the kernel's entry ``k`` is each kind of the oracle's
    ``o`` (``fmt``: the byte field's format; None for a float field)."""
    kv, ov = _values(k, fmt), _values(o, fmt)
    out: dict[str, torch.Tensor] = {}
    if fmt is None:
        for kind, (dtype, truncate) in _ROUNDED.items():
            out[kind] = _same_bits(k, _rounded(o, dtype, truncate))
        # one ulp of the field's own dtype (a values field may be bfloat16 or float16)
        o_own = o if o.dtype.is_floating_point else o.float()
        away = torch.where(o_own < 0, -math.inf, math.inf).to(o_own.dtype)
        out["ulp_up"] = _same_bits(k, torch.nextafter(o_own, away)) & o_own.isfinite()
        out["ulp_down"] = (_same_bits(k, torch.nextafter(o_own, torch.zeros_like(o_own))) & o_own.isfinite()
                           & (o_own != 0))
    else:
        out["ulp_up"] = _byte_step(k, o, kv, ov, fmt, 1)
        out["ulp_down"] = _byte_step(k, o, kv, ov, fmt, -1)
    ratio = kv / ov
    usable = kv.isfinite() & ov.isfinite() & (ov != 0) & (kv != 0) & (ratio > 0)
    exponent = torch.where(usable, torch.log2(torch.where(usable, ratio, 1.0)).round(), 0.0)
    power = usable & (exponent != 0) & (kv == ov * torch.exp2(exponent))
    for j in torch.unique(exponent[power]).tolist()[:_POWERS]:
        out[f"times 2^{int(j)}"] = power & (exponent == j)
    if fmt is None:
        out["sign_flipped"] = _same_bits(k, -o.float())
    elif fmt.sign_mask:
        out["sign_flipped"] = k.to(torch.int64) == (o.to(torch.int64) ^ fmt.sign_mask)
    out["nan"] = kv.isnan()
    out["inf"] = kv.isinf()
    if fmt is not None:
        out["constant 127"] = k.to(torch.int64) == 127
    top = fmt.max if fmt is not None else float(torch.finfo(o.dtype).max)
    for kind, value in (*_VALUE_CONSTANTS.items(), ("constant max", top), ("constant -max", -top)):
        out[kind] = kv == value
    return out


def _is_power_of_two(t: torch.Tensor) -> torch.Tensor:
    return t.isfinite() & (t != 0) & (torch.frexp(t).mantissa.abs() == 0.5)


def float32_text(v: float) -> str:
    """The shortest decimal that reads back as the float32 ``v`` ("1e-10" for float32(1e-10))."""
    want = torch.tensor(v, dtype=torch.float32)
    for digits in range(1, 10):
        text = f"{v:.{digits}g}"
        if torch.equal(torch.tensor(float(text), dtype=torch.float32), want):
            return text
    return repr(v)


def ratio_text(r: float) -> str:
    """A ratio as a small fraction where one is that float32 ("4/3"), else as a decimal."""
    small = Fraction(r).limit_denominator(64)
    same = torch.tensor(float(small), dtype=torch.float32) == torch.tensor(r, dtype=torch.float32)
    return str(small) if bool(same) else float32_text(r)


def _most_common(v: torch.Tensor, at_least: int = 2) -> list[float]:
    """The values of v that occur at least ``at_least`` times, most frequent first (at most _POWERS)."""
    if not v.numel():
        return []
    values, counts = torch.unique(v, return_counts=True)
    keep = counts >= at_least
    order = counts[keep].argsort(descending=True, stable=True)
    return values[keep][order][:_POWERS].tolist()


def _free_holds(k: torch.Tensor, o: torch.Tensor) -> dict[str, torch.Tensor]:
    """The kinds of a free float field (a scale read from a values kernel's values): one
    constant shared by several entries, one ratio to the oracle's that is not a power of
    two, or a value that is not a power of two where the oracle's is one."""
    k64, o64 = k.double(), o.double()
    usable = k64.isfinite() & o64.isfinite() & (k64 != 0) & (o64 != 0)
    out: dict[str, torch.Tensor] = {}
    for c in _most_common(k64[usable]):
        out.setdefault(f"constant {float32_text(c)}", usable & (k64 == c))
    ratio = torch.where(usable, k64 / torch.where(usable, o64, 1.0), 0.0)
    uneven = usable & ~_is_power_of_two(ratio)
    for r in _most_common(ratio[uneven]):
        out.setdefault(f"times {ratio_text(r)}", uneven & (ratio == r))
    out["not a power of two"] = usable & ~_is_power_of_two(k64) & _is_power_of_two(o64)
    return out


_POWERS = 8  # distinct 2^K factors tried in one field (each its own kind)
PER_FIELD = 3  # relations stated for one field of one comparison, most blocks first


def _constant_first(kind: str) -> tuple[int, int]:
    """_order with every constant ahead of the roundings (the readings of values)."""
    order, length = _order(kind)
    return (order - len(KINDS) if kind.startswith("constant ") else order), length


def _order(kind: str) -> tuple[int, int]:
    """Where a kind is preferred among those covering the same blocks. A free constant and a
    free ratio rank together, the shorter text first ("times 4/3" before "constant
    1.5894572e-07" where every block has one oracle scale; "constant 1e-10" before "times
    3.4359738"): both are exact there, and the plainer number is the likelier cause."""
    if kind.startswith("times 2^"):
        return list(KINDS).index("times 2^K"), 0
    if kind.startswith("times ") or (kind.startswith("constant ") and kind not in KINDS):
        return list(KINDS).index("constant C"), len(kind.removeprefix("times ").removeprefix("constant "))
    return list(KINDS).index(kind), 0


# ---- the blocks a relation covers, and the test that picks them out ---------------------------


@dataclass(frozen=True)
class _Blocks:
    """Per block of a comparison: its finite amax (of the input as given), whether it holds
    NaN or Inf, and the input dtype; ``amax`` is None where the input does not lie on the
    codes' grid (padding)."""

    amax: torch.Tensor | None
    special: torch.Tensor | None
    dtype: str


def block_facts(x: torch.Tensor, block_ids: torch.Tensor, n: int) -> _Blocks:
    """What a condition reads of each of the ``n`` blocks of input ``x`` (``block_ids``: the
    block of each element, shaped like x where x lies on that grid)."""
    dtype = str(x.dtype).removeprefix("torch.")
    if tuple(x.shape) != tuple(block_ids.shape):
        return _Blocks(None, None, dtype)
    a = x.abs().float()
    is_finite = torch.isfinite(a)
    special = _per_block(~is_finite, block_ids, n)
    finite = torch.where(is_finite, a, 0.0).flatten()
    amax = torch.zeros(n).scatter_reduce_(0, block_ids.flatten(), finite, "amax", include_self=True)
    return _Blocks(amax, special, dtype)


def _threshold_range(amax: torch.Tensor, below: torch.Tensor, above: torch.Tensor) -> tuple[float, float] | None:
    """(low, high]: the thresholds T with every ``below`` block's amax < T <= every ``above``
    block's; None where none exists."""
    low = float(amax[below].max()) if bool(below.any()) else 0.0
    high = float(amax[above].min()) if bool(above.any()) else math.inf
    return (low, high) if low < high else None


def _condition(covered: torch.Tensor, b: _Blocks) -> Condition:
    """The first test (every block, all-zero blocks, blocks with NaN or Inf, an amax
    threshold) that picks out exactly ``covered``; Condition("") where none does."""
    n = int(covered.sum())
    if bool(covered.all()):
        return Condition("every", matching=n, dtypes=(b.dtype,))
    if b.amax is None or b.special is None:
        return Condition("", matching=n)
    finite = ~b.special
    zero = finite & (b.amax == 0)
    if torch.equal(covered, zero):
        return Condition("zero", matching=n, dtypes=(b.dtype,))
    if torch.equal(covered, b.special):
        return Condition("special", matching=n, dtypes=(b.dtype,))
    if not bool((covered & b.special).any()):
        tests = (("amax_below", covered, finite & ~covered), ("nonzero_amax_below", covered, finite & ~zero & ~covered),
                 ("amax_at_least", finite & ~covered, covered))
        for kind, below, above in tests:
            if kind == "nonzero_amax_below" and bool((covered & zero).any()):
                continue
            span = _threshold_range(b.amax, below, above)
            if span is not None:
                return Condition(kind, span[0], span[1], n, (b.dtype,))
    return Condition("", matching=n)


def _format_of(d: Any, name: str) -> FloatFormat | None:
    if name == "codes":
        return element_format(d.oracle)
    return get_format(_BYTE_FIELDS[name]) if name in _BYTE_FIELDS else None


def _differing_entries(d: Any, name: str, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(kernel entries, oracle entries, block of each) for the entries of a field that
    differ: the codes' elements (those under a NaN block scale left out, as compared), a
    per-block field's blocks, a per-tensor field's one value (block -1: every block)."""
    k, o = getattr(d.kernel, name).detach().cpu(), getattr(d.oracle, name).detach().cpu()
    if name == "codes":
        where = _element_diffs(d.kernel, d.oracle, ("codes",))
        if isinstance(where, str):
            where = _bits(k) != _bits(o)
        else:
            where = where["codes"]
        flat = where.flatten().nonzero().flatten()
        return k.flatten()[flat], o.flatten()[flat], d.block_ids.flatten()[flat]
    if o.ndim == 0:
        return k.reshape(1), o.reshape(1), torch.tensor([-1])
    differs = (_bits(k) != _bits(o)).flatten()
    if o.numel() == n:  # the block field: entry i is block i
        flat = differs.nonzero().flatten()
        return k.flatten()[flat], o.flatten()[flat], flat
    spread = _expand(differs.reshape(o.shape), d.oracle.codes.shape).flatten()  # a field on another grid
    flat = spread.nonzero().flatten()
    return (_expand(k, d.oracle.codes.shape).flatten()[flat], _expand(o, d.oracle.codes.shape).flatten()[flat],
            d.block_ids.flatten()[flat])


def _blocks_where(entries_ok: torch.Tensor, block: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks where the field differs, blocks where every differing entry satisfies ok)."""
    if len(block) and int(block[0]) == -1:  # a per-tensor value: it speaks for every block
        differs = torch.ones(n, dtype=torch.bool)
        return differs, differs & bool(entries_ok.all())
    differs = torch.zeros(n, dtype=torch.bool)
    differs[block] = True
    broken = torch.zeros(n, dtype=torch.bool)
    broken[block[~entries_ok]] = True
    return differs, differs & ~broken


@dataclass(frozen=True)
class FieldEntries:
    """The entries of one field of one comparison where the kernel's differ from the
    oracle's, as the algebra reads them: ``block`` is each entry's block (-1: a per-tensor
    value, which speaks for every block); ``fmt`` a byte field's format (None: a float
    field); ``free``: a float field whose kinds include any shared constant and any ratio to
    the oracle's (a block scale read from a kernel's values); ``template``: how a kind reads
    for this field ("{}": as it is)."""

    name: str
    kernel: torch.Tensor
    oracle: torch.Tensor
    block: torch.Tensor
    fmt: FloatFormat | None = None
    per_tensor: bool = False
    free: bool = False
    template: str = "{}"

    def kinds(self) -> dict[str, torch.Tensor]:
        """Per entry, whether it is each kind of the oracle's."""
        holds = _holds(self.kernel, self.oracle, self.fmt)
        return {**holds, **_free_holds(self.kernel, self.oracle)} if self.free else holds


def relate(d: Any) -> tuple[list[Relation], torch.Tensor]:
    """The relations of one comparison (a ``QuantizeDiff`` with counts), per differing field
    at most PER_FIELD, each stated for the blocks where it reproduces every differing entry
    of its field; and per block, whether relations cover every field that differs there."""
    n = d.differing.numel()
    names = tuple(c.field for c in d.counts if c.differ)
    if not names or d.block_ids is None:
        return [], torch.zeros(n, dtype=torch.bool)
    fields = [FieldEntries(name, *_differing_entries(d, name, n), fmt=_format_of(d, name),
                           per_tensor=getattr(d.oracle, name).ndim == 0) for name in names]
    return relate_fields(fields, block_facts(d.x, d.block_ids, n), d.differing)


READINGS = 4  # relations stated for one comparison read in several ways (relate_fields' alternatives)


def _greedy(covered_by: dict[Any, torch.Tensor], left: torch.Tensor, limit: int,
            rank: Any) -> list[tuple[Any, torch.Tensor]]:
    """Up to ``limit`` keys, each covering the most blocks of ``left`` the ones before it
    leave (ties: the lowest ``rank``), with the blocks each covers."""
    left, chosen = left.clone(), []
    for _ in range(limit):
        if not covered_by:
            break
        key = max(covered_by, key=lambda c: (int((covered_by[c] & left).sum()), tuple(-r for r in rank(c))))
        if not bool((covered_by[key] & left).any()):
            break
        chosen.append((key, covered_by[key]))
        left &= ~covered_by[key]
    return chosen


def relate_fields(fields: list[FieldEntries], blocks: _Blocks, differing: torch.Tensor, *,
                  alternatives: bool = False, unit: str = "blocks") -> tuple[list[Relation], torch.Tensor]:
    """The relations of one comparison's differing ``fields`` over its blocks
    (``differing``: bool per block), and per block whether they state it. Fields of a
    quantized tensor each differ on their own: a block is stated where relations cover
    every field that differs there (at most PER_FIELD a field). ``alternatives``: the fields
    are readings of one thing (a values kernel's values as values, as a block scale, as
    codes under the oracle's scale): one choice over every field's kinds, a block stated
    where any reading covers it (at most READINGS)."""
    n = differing.numel()
    covered_by = {f.name: {kind: _blocks_where(holds, f.block, n)[1] for kind, holds in f.kinds().items()}
                  for f in fields}
    by_name = {f.name: f for f in fields}
    if alternatives:
        pairs = {(f.name, kind): mask for f in fields for kind, mask in covered_by[f.name].items()}
        order = list(by_name)
        chosen = _greedy(pairs, differing, READINGS, lambda key: (order.index(key[0]), *_constant_first(key[1])))
        stated = torch.zeros(n, dtype=torch.bool)
        for _, mask in chosen:
            stated |= mask
        found = [_relation(by_name[name], kind, mask, differing, blocks, (), unit) for (name, kind), mask in chosen]
        return found, stated & differing
    one = {f.name: torch.ones(len(f.block), dtype=torch.bool) for f in fields}
    differs = {f.name: _blocks_where(one[f.name], f.block, n)[0] for f in fields}
    stated = torch.ones(n, dtype=torch.bool)
    found: list[Relation] = []
    for f in fields:
        covered_any = torch.zeros(n, dtype=torch.bool)
        for kind, mine in _greedy(covered_by[f.name], differs[f.name], PER_FIELD, _order):
            covered_any |= mine
            also = tuple(g.name for g in fields if g.name != f.name and bool((differs[g.name] & mine).any()))
            found.append(_relation(f, kind, mine, differs[f.name], blocks, also, unit))
        stated &= ~differs[f.name] | covered_any
    return found, stated & differing


def _relation(f: FieldEntries, kind: str, covered: torch.Tensor, differs: torch.Tensor, blocks: _Blocks,
              also: tuple[str, ...], unit: str) -> Relation:
    text = f.template.format(_kind_text(kind, f.fmt))
    if f.per_tensor:  # one value for the tensor: the comparison is the unit
        return Relation(f.name, kind, 1, 1, "comparisons", Condition("every", matching=1, dtypes=(blocks.dtype,)),
                        also, kind_text=text)
    return Relation(f.name, kind, int(covered.sum()), int(differs.sum()), unit, _condition(covered, blocks), also,
                    kind_text=text)


# ---- over several comparisons -----------------------------------------------------------------


def _merge(a: Relation, b: Relation) -> Relation:
    ca, cb = a.condition, b.condition
    low, high = max(ca.low, cb.low), min(ca.high, cb.high)
    kind = ca.kind if not ca.kind.startswith(("amax", "nonzero")) or low < high else ""
    condition = Condition(kind, low, high, ca.matching + cb.matching, tuple(sorted({*ca.dtypes, *cb.dtypes})))
    return replace(a, covered=a.covered + b.covered, total=a.total + b.total, condition=condition,
                   also=tuple(dict.fromkeys((*a.also, *b.also))), comparisons=a.comparisons + b.comparisons)


def combine(relations: list[Relation], dtypes: tuple[str, ...] = (),
            totals: dict[tuple[str, str], int] | None = None) -> list[Relation]:
    """Relations of several comparisons summed where name and condition kind agree (a
    threshold kept where one threshold serves every comparison), most covered first. A
    dtype qualifier is dropped where the relation holds in every one of ``dtypes``.
    ``totals``: (field, unit) -> the units where that field differs over every comparison
    (a relation's own total counts only the comparisons it was found in)."""
    merged: dict[tuple[str, str], Relation] = {}
    for r in relations:
        key = (r.name, r.condition.kind)
        merged[key] = _merge(merged[key], r) if key in merged else r
    out = []
    for r in _whole(list(merged.values()), totals or {}):
        if set(dtypes) <= set(r.condition.dtypes):
            r = replace(r, condition=replace(r.condition, dtypes=()))
        if totals and (r.field, r.unit) in totals:
            r = replace(r, total=max(r.total, totals[(r.field, r.unit)]))
        out.append(r)
    return sorted(out, key=lambda r: (-r.covered, _order(r.kind), r.name))


def _whole(relations: list[Relation], totals: dict[tuple[str, str], int]) -> list[Relation]:
    """One relation found under several conditions (an amax threshold in one comparison,
    every block in another) that together covers every unit where its field differs, as one
    line with that count: it is the whole of what differs, which several lines hide."""
    names: dict[str, list[Relation]] = {}
    for r in relations:
        names.setdefault(r.name, []).append(r)
    out = []
    for same in names.values():
        covered = sum(r.covered for r in same)
        if len(same) == 1 or covered != totals.get((same[0].field, same[0].unit), -1):
            out += same
            continue
        condition = Condition("", matching=covered, dtypes=tuple(sorted({d for r in same for d in r.condition.dtypes})))
        out.append(replace(same[0], covered=covered, total=covered, condition=condition,
                           also=tuple(dict.fromkeys(a for r in same for a in r.also)),
                           comparisons=sum(r.comparisons for r in same)))
    return out
