"""A quantized operand against the oracle's: every field counted, blocks shown, causes named.

``compare_quantized`` compares every field of the contract (per-tensor scale, block
scales, codes; scales first), block by block, and keeps going past the first difference.
``diagnose`` then shows the first differing blocks of each kind (the block's inputs, its
amax, both scales and both codes, decoded) and runs the catalogue
(``mxcheck.diagnose.catalogue``) on the same input: a behaviour is named for the blocks
where its bits equal the kernel's, in every field, and for no others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from mxcheck.diagnose.behaviour import (
    WEAKER_SHOWN,
    Attribution,
    Behaviour,
    render_attributions,
    split_fits,
)
from mxcheck.diagnose.catalogue import CONVENTION_OF, combined, element_format
from mxcheck.diagnose.compare import (
    QUANTIZE_FIELDS,
    _anchor_rows,
    _bits,
    _block_ids,
    _cpu,
    _element_diffs,
    _per_block,
    _row_separable,
    _take_rows,
    compared_fields,
    field_problem,
    nan_scale_blocks,
)
from mxcheck.diagnose.fit import FitCase, fit
from mxcheck.diagnose.relations import Relation, combine, relate
from mxcheck.formats import FloatFormat, decode_table, get_format
from mxcheck.recipes import OperandSpec
from mxcheck.scaling.rules import E8M0_NAN

__all__ = ["QUANTIZE_FIELDS", "FieldCount", "QuantizeDiff", "attribute", "cause_lines", "compare_quantized",
           "compared_fields", "count_behaviour", "diagnose", "field_problem", "members", "nan_scale_blocks", "ranked_causes",
           "reconcile", "relations_head", "report", "summary"]

# The fields of the contract (mxcheck.backends.contract.QuantizeBackend), scales first: a
# wrong scale explains the codes after it. ``amax`` and FP8's ``scale`` are left out: the
# GEMM never reads them, and adapters fill them with torch where a kernel returns none.
EXAMPLES_PER_KIND = 2  # blocks shown for each kind of difference (which fields differ)
ELEMENTS_PER_BLOCK = 4  # differing elements shown in a block


@dataclass(frozen=True)
class FieldCount:
    field: str
    differ: int
    total: int
    unit: str


@dataclass
class QuantizeDiff:
    """One comparison (an operand copy on one input): counts per field, the differing blocks."""

    operand: str
    label: str
    spec: OperandSpec
    x: torch.Tensor
    oracle: Any
    kernel: Any
    counts: tuple[FieldCount, ...] = ()
    problem: str = ""  # a field the kernel returned in another shape or dtype
    block_field: str = "tensor"
    block_ids: torch.Tensor | None = None
    differing: torch.Tensor | None = None  # bool per block
    kinds: dict[tuple[str, ...], torch.Tensor] = field(default_factory=dict)  # differing fields -> blocks
    attributions: list[Attribution] = field(default_factory=list)
    unexplained: int = 0
    explained: torch.Tensor | None = None  # bool per block: some behaviour reproduces it
    examined: torch.Tensor | None = None  # bool per block: in the rows attribution ran on
    fit: Any = None  # mxcheck.diagnose.fit.Fit on the rows examined, where profiles model the spec
    relations: list[Relation] = field(default_factory=list)  # where no behaviour reproduces every block
    stated: torch.Tensor | None = None  # bool per block: field relations state every field that differs there

    def field_relations(self) -> tuple[list[Relation], torch.Tensor]:
        """What differs, stated exactly (``relations.relate``); a values comparison reads its
        values instead (``conformance.values_relations``)."""
        return relate(self)

    @property
    def n_differing(self) -> int:
        return int(self.differing.sum()) if self.differing is not None else 0

    @property
    def n_examined(self) -> int:
        """Differing blocks attribution ran on (all of them, or those of its first rows)."""
        return int((self.differing & self.examined).sum()) if self.examined is not None else self.n_differing

    @property
    def unit(self) -> str:
        return "rows" if self.block_field == "rows" else "blocks"

    @property
    def n_blocks(self) -> int:
        return int(self.differing.numel()) if self.differing is not None else 0


def compare_quantized(x: torch.Tensor, spec: OperandSpec, oracle: Any, kernel: Any, *, operand: str = "x_row",
                      label: str = "") -> QuantizeDiff:
    """Every field of kernel against oracle (both the oracle's tensor type), block by block."""
    fields = compared_fields(oracle)
    d = QuantizeDiff(operand, label, spec, x.detach().cpu(), _cpu(oracle), _cpu(kernel))
    diffs = _element_diffs(d.kernel, d.oracle, fields)
    if isinstance(diffs, str):
        d.problem = diffs
        return d
    d.block_field, d.block_ids, n = _block_ids(d.oracle)
    per_block = {name: _per_block(m, d.block_ids, n) for name, m in diffs.items()}
    counts = []
    for name, m in diffs.items():
        own = getattr(d.oracle, name)
        if name == "codes":
            counts.append(FieldCount(name, int(m.sum()), m.numel(), "elements"))
        else:  # counted on the field itself: a per-tensor scale is one value
            counts.append(FieldCount(name, int((_bits(getattr(d.kernel, name)) != _bits(own)).sum()), own.numel(),
                                     "blocks" if own.ndim else "value"))
    d.counts = tuple(counts)
    d.differing = torch.stack(list(per_block.values())).any(0)
    # which fields differ in a block, as one integer (bit i: field i)
    pattern = sum(m.to(torch.int64) << i for i, m in enumerate(per_block.values()))
    for code in pattern[d.differing].unique().tolist():
        kind = tuple(name for i, name in enumerate(diffs) if code >> i & 1)
        d.kinds[kind] = pattern == code
    return d


# ---- attribution ------------------------------------------------------------------------------


SCREEN_ROWS = 8  # rows a behaviour is first tried on; only those that reproduce a block there run on more
ATTRIBUTION_ROWS = 256  # rows holding differing blocks that attribution counts on (the first ones; the
# conformance inputs have 256, so every differing block of theirs is counted)


@dataclass
class _Rows:
    """A comparison restricted to some rows: its input, oracle, kernel, blocks."""

    x: torch.Tensor
    oracle: Any
    kernel: Any
    ids: torch.Tensor
    differing: torch.Tensor
    where: torch.Tensor  # indices of these blocks in the whole comparison


def _rows(d: QuantizeDiff, rows: torch.Tensor | None) -> _Rows:
    if rows is None:
        return _Rows(d.x, d.oracle, d.kernel, d.block_ids, d.differing, torch.arange(d.n_blocks))
    rows = torch.unique(torch.cat([rows, _anchor_rows(d.x)]))
    oracle = _take_rows(d.oracle, rows)
    _, ids, _ = _block_ids(oracle)
    where = torch.arange(d.n_blocks).reshape(d.oracle.codes.shape[0], -1)[rows].flatten()
    return _Rows(d.x[rows], oracle, _take_rows(d.kernel, rows), ids, d.differing[where], where)


def _reproduces(b: Behaviour, d: QuantizeDiff, r: _Rows) -> torch.Tensor | None:
    """Per block of r: the behaviour's bits equal the kernel's in every field (None: it does
    not apply, or returns another layout)."""
    try:
        q = b.run(r.x, d.spec, r.oracle)
    except (ValueError, TypeError, RuntimeError):  # a layout or input the behaviour cannot take
        return None
    if q is None:
        return None
    diffs = _element_diffs(_cpu(q), r.kernel, compared_fields(d.oracle))
    if isinstance(diffs, str):
        return None
    return ~_per_block(torch.stack(list(diffs.values())).any(0), r.ids, len(r.differing))


def _differing_rows(d: QuantizeDiff, blocks: torch.Tensor, limit: int | None) -> torch.Tensor | None:
    if not _row_separable(d.oracle):
        return None
    per_row = d.differing.numel() // d.oracle.codes.shape[0]
    rows = torch.unique(blocks.nonzero().flatten() // per_row)
    return rows if limit is None else rows[:limit]


def attribute(d: QuantizeDiff, behaviours: tuple[Behaviour, ...], first: tuple[Behaviour, ...] = (),
              start: Any = None) -> QuantizeDiff:
    """Name each quantize behaviour for the differing blocks whose every field it reproduces,
    and count the agreeing blocks (in the rows it ran on) it would change. A behaviour is
    screened on a few rows holding differing blocks (first those no behaviour has explained
    yet) and run on every such row only where it reproduced one there. ``first``: behaviours
    that explained another comparison of the same check; they run before any screening, and
    when they explain every block the others are not tried. Then the fit
    (``mxcheck.diagnose.fit``, from ``start``: another comparison's fit of the same spec)
    combines as many conventions and failures as the blocks need, and is named where it
    combines several."""
    if d.differing is None or not d.n_differing:
        return d
    full = _rows(d, _differing_rows(d, d.differing, ATTRIBUTION_ROWS))
    d.examined = torch.zeros_like(d.differing)
    d.examined[full.where] = True
    d.explained = torch.zeros_like(d.differing)
    pending = [b for b in behaviours if b.level == "quantize"]
    tried = [b for b in first if b in pending]
    while pending:
        left = d.differing & d.examined & ~d.explained
        if not tried:
            if not bool(left.any()):
                break
            screen = _rows(d, _differing_rows(d, left, SCREEN_ROWS))
            tried = [b for b in pending if _fits_somewhere(_reproduces(b, d, screen), screen)]
            if not tried:
                break
        pending = [b for b in pending if b not in tried]
        for b in tried:
            _count(d, b, full)
        tried = []
    # What differs, stated exactly (it heads where no behaviour does better): before the fit
    # where only per-tensor values differ (stated, they need no search), else after it.
    if not _complete(d) and all(getattr(d.oracle, c.field).ndim == 0 for c in d.counts if c.differ):
        d.relations, d.stated = relate(d)
    if not _one_value_stated(d):
        _fitted(d, full, start)
    if d.stated is None and not _complete(d):
        d.relations, d.stated = relate(d)
    d.unexplained = int((d.differing & d.examined & ~d.explained).sum())
    return d


def _complete(d: QuantizeDiff) -> bool:
    """One behaviour reproduces every differing block examined, exactly."""
    examined = int((d.differing & d.examined).sum())
    return any(a.reproduced == examined and not a.also_changes for a in d.attributions)


def _with_relations(d: QuantizeDiff) -> QuantizeDiff:
    """d with its field relations, computed now where attribution skipped them (a behaviour
    reproduced every block): a summary over several comparisons counts them in each."""
    if d.stated is None and d.differing is not None and d.n_differing and not d.problem:
        d.relations, d.stated = d.field_relations()
    return d


def _one_value_stated(d: QuantizeDiff) -> bool:
    """Only per-tensor values differ and relations state them: no combination of
    conventions is needed to say what differs, so the fit (the costly search) is not run."""
    return bool(d.relations) and all(r.unit == "comparisons" for r in d.relations) and \
        _n_stated(d) == d.n_examined


def _n_stated(d: QuantizeDiff) -> int:
    if d.stated is None:
        return 0
    return int((d.stated & d.examined).sum()) if d.examined is not None else int(d.stated.sum())


def relations_head(d: QuantizeDiff) -> bool:
    """Field relations head the cause: no behaviour reproduces every differing block
    examined exactly, and the relations state at least as many of them as the best exact
    behaviour reproduces."""
    exact, _ = split_fits(d.attributions, d.n_examined)
    best = max((a.reproduced for a in exact), default=0)
    return bool(d.relations) and best < d.n_examined and _n_stated(d) >= max(best, 1)


def _weaker_than_relations(attributions: list[Attribution], stated: int, unit: str) -> list[str]:
    """Behaviours that reproduce fewer blocks than the relations state, on one line; ties
    keep their own line (they reproduce the same blocks)."""
    tied = [a.line() for a in attributions if a.reproduced >= stated and not a.also_changes]
    weaker = [a for a in attributions if a.reproduced < stated or a.also_changes]
    lines = list(tied)
    if weaker:
        names = "; ".join(f"{a.behaviour.title} ({a.reproduced:,} reproduced)" for a in weaker[:WEAKER_SHOWN])
        more = f"; and {len(weaker) - WEAKER_SHOWN} more" if len(weaker) > WEAKER_SHOWN else ""
        lines.append(f"weaker fits, not a cause (they reproduce fewer {unit} than the field relations state): "
                     f"{names}{more}")
    return lines


def cause_lines(d: QuantizeDiff) -> list[str]:
    """The cause lines of one comparison: the behaviours that reproduce its blocks
    (``render_attributions``), or, where field relations state more blocks exactly
    (``relations_head``), those relations first and the behaviours after them as weaker.
    Relations that head nothing follow the behaviours where some blocks are reproduced by
    no behaviour: they state what those are."""
    own = [f"field relation: {r.line()}" for r in d.relations]
    if not relations_head(d):  # relations say what the blocks no behaviour reproduces are
        return render_attributions(d.attributions, d.n_examined, d.unexplained, d.unit) + (own if d.unexplained else [])
    lines = own + _weaker_than_relations(d.attributions, _n_stated(d), d.unit)
    if d.unexplained:
        lines.append(f"{d.unexplained:,} of {d.n_examined:,} differing {d.unit} are reproduced by no known behaviour "
                     "(mxcheck.diagnose.CATALOGUE)")
    left = d.n_examined - _n_stated(d)
    if left:
        lines.append(f"{left:,} of {d.n_examined:,} differing {d.unit} are stated by no field relation")
    return lines


def _fitted(d: QuantizeDiff, full: _Rows, start: Any) -> None:
    """The fit on the rows examined, where no single behaviour reproduces every block; named
    where it combines conventions or failures (a single one is in the catalogue already)."""
    if _complete(d):
        return  # one behaviour reproduces every block exactly: a fit names nothing more (and costs a search)
    try:
        case = FitCase(full.x, d.spec, full.oracle, full.kernel, d.label)
    except ValueError:
        return
    d.fit = fit([case], start)
    if d.fit is None:  # 2D tiles, padding: conventions named so far, two at a time
        _pairs(d, full)
        return
    behaviour = d.fit.behaviour() if d.fit.size > 1 else None
    if behaviour is not None and all(a.behaviour.key != behaviour.key for a in d.attributions):
        _count(d, behaviour, full)


PAIRED = 6  # named conventions tried two at a time where the fit cannot run


def _pairs(d: QuantizeDiff, full: _Rows) -> None:
    """Where profiles cannot model the spec (2D tiles: conventions run on tiles as blocks),
    blocks no single behaviour reproduces may show two conventions at once."""
    named = [a.behaviour for a in d.attributions][:PAIRED]
    for i, first in enumerate(named):
        for second in named[i + 1:]:
            if not bool((d.differing & d.examined & ~d.explained).any()):
                return
            both = combined(first, second) if first.key in CONVENTION_OF and second.key in CONVENTION_OF else None
            if both is not None:
                _count(d, both, full)


def _fits_somewhere(ok: torch.Tensor | None, r: _Rows) -> bool:
    return ok is not None and bool((ok & r.differing).any())


def _count(d: QuantizeDiff, b: Behaviour, full: _Rows) -> None:
    """Run b on the rows attribution counts on; name it where it reproduces a differing block,
    unless it would change at least as many blocks the kernel gets right."""
    ok = _reproduces(b, d, full)
    if not _fits_somewhere(ok, full):
        return
    reproduced = torch.zeros_like(d.differing)
    reproduced[full.where] = ok & full.differing
    changed = int((~full.differing & ~ok).sum())
    if changed >= int(reproduced.sum()):  # it breaks more blocks than it explains: a coincidence
        return
    d.explained |= reproduced
    d.attributions.append(Attribution(b, int(reproduced.sum()), int(full.differing.sum()), d.unit, changed))


# ---- showing a block ---------------------------------------------------------------------------


def _hex(v: torch.Tensor) -> str:
    width = 2 * v.element_size()
    return f"0x{int(_bits(v.reshape(1))[0]) & ((1 << (4 * width)) - 1):0{width}x}"


def _float(v: float) -> str:
    return repr(v) if math.isfinite(v) else str(v)


def _byte_text(byte: int, fmt: FloatFormat) -> str:
    """A stored byte and its value in ``fmt``; a byte outside the format's codes (a kernel that
    wrote a signed e4m3 NaN 0xff as a ue4m3 scale, or high bits beside a 4-bit code) is shown
    as such, with what its bits mean as the nearest signed format, never an IndexError."""
    table = decode_table(fmt)
    if byte < len(table):
        return f"0x{byte:02x} ({_float(float(table[byte]))})"
    wider = _SIGNED_FORM.get(fmt.name)
    as_signed = f"; as {wider} {_float(float(decode_table(wider)[byte]))}" if wider else ""
    return f"0x{byte:02x} (not a {fmt.name} code: {fmt.name} has {len(table)}{as_signed})"


# The signed format whose bits an out-of-range byte of an unsigned scale format most likely holds.
_SIGNED_FORM = {"ue4m3": "e4m3"}


def _scale_text(name: str, q: Any, index: int) -> str:
    t = getattr(q, name).reshape(-1)[index] if getattr(q, name).ndim else getattr(q, name)
    if name == "scales":
        b = int(t)
        return f"0x{b:02x} (NaN)" if b == E8M0_NAN else f"0x{b:02x} (2^{b - 127})"
    if name == "block_scales":
        return _byte_text(int(t), get_format("ue4m3"))
    return f"{_hex(t)} ({_float(float(t))})"


def _code_text(q: Any, flat: int) -> str:
    return _byte_text(int(q.codes.reshape(-1)[flat]), element_format(q))


def _input_index(flat: torch.Tensor, shape: tuple[int, ...],
                 x_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """For indices ``flat`` into the quantized ``shape`` (padded where the spec has pad_to):
    which hold an input element, and its index in the input of ``x_shape`` (padding holds none)."""
    if len(shape) != len(x_shape):  # another layout: no element maps to the input
        return torch.zeros_like(flat, dtype=torch.bool), torch.zeros_like(flat)
    has_input, in_x = torch.ones_like(flat, dtype=torch.bool), torch.zeros_like(flat)
    for i, n in zip(torch.unravel_index(flat, shape), x_shape, strict=True):
        has_input &= i < n
        in_x = in_x * n + i
    return has_input, in_x


def _block_text(d: QuantizeDiff, block: int, kind: tuple[str, ...]) -> list[str]:
    where = (d.block_ids.reshape(-1) == block).nonzero().flatten()
    shape = d.oracle.codes.shape
    first, last = (torch.unravel_index(where[i], shape) for i in (0, -1))
    span = f"row {int(first[0])}, elements {int(first[-1])}-{int(last[-1])}" if len(shape) == 2 else f"{block}"
    has_input, in_x = _input_index(where, tuple(shape), tuple(d.x.shape))
    values = d.x.reshape(-1)[in_x[has_input]].abs().float()
    # a NaN element makes the block's amax NaN (the scale rules' NaN block), never Inf
    amax = values.new_tensor(math.nan) if bool(values.isnan().any()) or not values.numel() else values.max()
    rotated = " (before the rotation)" if d.spec.hadamard else ""
    why = " (unexplained)" if d.explained is not None and bool(d.examined[block] & ~d.explained[block]) else ""
    name = f"row {block}" if d.block_field == "rows" else f"block {d.block_field}[{block}] ({span})"
    amax_text = f"{_hex(amax.to(d.x.dtype))} ({_float(float(amax))})" if values.numel() else "none (padding only)"
    lines = [f"    {name}{why}, differs in {', '.join(kind)}; input amax{rotated} {amax_text}"]
    for name in compared_fields(d.oracle):
        if name == "codes":
            continue
        index = block if getattr(d.oracle, name).ndim else 0
        lines.append(f"      {name}: kernel {_scale_text(name, d.kernel, index)} | oracle "
                     f"{_scale_text(name, d.oracle, index)}")
    codes_k, codes_o = d.kernel.codes.reshape(-1)[where], d.oracle.codes.reshape(-1)[where]
    shown = where[codes_k != codes_o][:ELEMENTS_PER_BLOCK]
    given_at = dict(zip(where.tolist(), zip(has_input.tolist(), in_x.tolist(), strict=True), strict=True))
    for flat in shown.tolist():
        inside, at = given_at[flat]
        value = d.x.reshape(-1)[at] if inside else None
        given = "" if value is None else f"input {_hex(value)} ({_float(float(value))}): "
        lines.append(f"      element {int(torch.unravel_index(torch.tensor(flat), shape)[-1])}: {given}code kernel "
                     f"{_code_text(d.kernel, flat)} | oracle {_code_text(d.oracle, flat)}")
    more = int((codes_k != codes_o).sum()) - len(shown)
    if more > 0:
        lines.append(f"      ... and {more} more differing codes in this block")
    return lines


def diagnose(d: QuantizeDiff, behaviours: tuple[Behaviour, ...] | None = None) -> list[str]:
    """Report lines for one comparison: counts per field, attribution, example blocks."""
    head = f"{d.operand} ({d.label})" if d.label else d.operand
    if d.problem:
        return [f"{head}: {d.problem}"]
    counts = "; ".join(f"{c.field} {c.differ:,} of {c.total:,} {c.unit}" for c in d.counts if c.differ)
    lines = [f"{head}: {d.n_differing:,} of {d.n_blocks:,} {d.unit} differ ({counts})"]
    if behaviours is not None and not d.attributions and not d.unexplained:
        attribute(d, behaviours)
    examined = d.n_examined
    if examined < d.n_differing:
        lines.append(f"  attribution on the {examined:,} differing {d.unit} of the first {ATTRIBUTION_ROWS} rows "
                     "that hold any:")
    lines += ["  " + line for line in cause_lines(d)]
    if d.fit is not None and d.fit.size:
        lines.append(f"  fitted profile (on the rows examined; mxcheck fit for the whole recipe): "
                     f"{d.fit.text(d.spec.profile or 'the recipe')}")
    for kind, blocks in d.kinds.items():
        order = blocks.nonzero().flatten()
        if d.explained is not None:  # examined blocks no behaviour reproduces first: they are the news
            news = d.examined[order] & ~d.explained[order]
            order = torch.cat([order[news], order[~news]])
        for block in order[:EXAMPLES_PER_KIND].tolist():
            lines += _block_text(d, block, kind)
    return lines


# ---- one check's report -------------------------------------------------------------------------

DIAGNOSED_IN_FULL = 4  # comparisons shown with examples; the rest get their counts and best cause


def _best(d: QuantizeDiff) -> str:
    return cause_lines(d)[0]


def _field_totals(diffs: list[QuantizeDiff]) -> dict[tuple[str, str], int]:
    """(field, unit) -> where that field differs over every comparison: comparisons for a
    per-tensor field, blocks for the others."""
    totals: dict[tuple[str, str], int] = {}
    for d in diffs:
        for c in d.counts:
            if not c.differ:
                continue
            if c.unit == "value":
                key, n = (c.field, "comparisons"), 1
            else:
                key = (c.field, "blocks")
                n = int(sum(m for kind, m in d.kinds.items() if c.field in kind).sum()) if d.kinds else 0
            totals[key] = totals.get(key, 0) + n
        for reading in getattr(d, "readings", ()):  # a values comparison: each reading differs where values do
            totals[(reading, d.unit)] = totals.get((reading, d.unit), 0) + d.n_differing
    return totals


def relation_summary(diffs: list[QuantizeDiff]) -> tuple[list[Relation], int]:
    """The field relations of several comparisons combined (``relations.combine``), and
    the differing blocks examined that they state."""
    if any(d.relations for d in diffs):
        diffs = [_with_relations(d) for d in diffs]
    dtypes = tuple(sorted({str(d.x.dtype).removeprefix("torch.") for d in diffs}))
    found = combine([r for d in diffs for r in d.relations], dtypes, _field_totals(diffs))
    return found, sum(_n_stated(d) for d in diffs)


RELATIONS_SHOWN = 3


def members(b: Behaviour) -> frozenset[str]:
    """The catalogue behaviours a behaviour combines (``catalogue.combined`` joins their keys
    with " & "); one behaviour is its own single member."""
    return frozenset(b.key.split(" & "))


def reconcile(diffs: list[Any]) -> None:
    """The fewest conventions over the whole check. Each comparison names the fewest
    conventions its own blocks need, so a member whose blocks are only in other inputs (an Inf
    byte, on inputs without Inf) is dropped there. A combination exact in one comparison is
    run on every comparison of the same spec whose exact fits are parts of it, and kept there
    where it is exact too: the summary can then name the one combination every member of
    which is needed somewhere, for all of them."""
    for d in diffs:
        for a in list(d.attributions):
            combo = members(a.behaviour)
            if len(combo) < 2 or not _is_exact(a, d):
                continue
            for other in diffs:
                if other is d or other.spec != d.spec or \
                        any(b.behaviour.key == a.behaviour.key for b in other.attributions):
                    continue
                parts = [b for b in split_fits(other.attributions, other.n_examined)[0] if members(b.behaviour) < combo]
                if parts:
                    _add_if_exact(other, a.behaviour, max(b.reproduced for b in parts))


def _is_exact(a: Attribution, d: Any) -> bool:
    return not a.also_changes and a in split_fits(d.attributions, d.n_examined)[0]


def _add_if_exact(d: Any, b: Behaviour, at_least: int) -> None:
    """Count b on d (``count_behaviour``) and keep it only where it is exact there and
    reproduces at least ``at_least`` blocks."""
    kept = list(d.attributions), (None if d.explained is None else d.explained.clone())
    count_behaviour(d, b)
    added = [a for a in d.attributions if a.behaviour.key == b.key]
    if not added or not _is_exact(added[0], d) or added[0].reproduced < at_least:
        d.attributions = kept[0]
        if kept[1] is not None:
            d.explained = kept[1]


def count_behaviour(d: Any, b: Behaviour) -> None:
    """Run one behaviour on a comparison as its attribution did and record it where it fits: a
    codes comparison on the rows attribution counts on, a values comparison by its own
    ``count`` (``conformance.values.ValuesDiff``)."""
    if not isinstance(d, QuantizeDiff):
        d.count(b)
        return
    _count(d, b, _rows(d, _differing_rows(d, d.differing, ATTRIBUTION_ROWS)))
    d.unexplained = int((d.differing & d.examined & ~d.explained).sum())


def ranked_causes(diffs: list[Any]) -> tuple[list[tuple[Behaviour, int, int]], dict[str, Behaviour]]:
    """(behaviour, blocks reproduced, comparisons) for each behaviour exact in every comparison
    it touches, most blocks first; and the behaviours that are a weaker fit in some comparison.
    A behaviour that is a part of a combination (``members``) exact in every comparison where
    it is, is left out: the combination is the check's fewest conventions (``reconcile``)."""
    totals: dict[str, list[Any]] = {}
    weaker: dict[str, Behaviour] = {}
    for i, d in enumerate(diffs):
        exact, weak = split_fits(d.attributions, d.n_examined)
        for a in weak:
            weaker.setdefault(a.behaviour.key, a.behaviour)
        for a in exact:
            t = totals.setdefault(a.behaviour.key, [a.behaviour, 0, set()])
            t[1] += a.reproduced
            t[2].add(i)
    for key in [k for k in totals if k in weaker]:  # exact somewhere, weaker elsewhere
        del totals[key]
    parts = [k for k, (b, _, where) in totals.items()
             if any(members(b) < members(c) and where <= w for c, _, w in totals.values())]
    ranked = sorted(((b, n, len(w)) for k, (b, n, w) in totals.items() if k not in parts),
                    key=lambda t: (-t[1], t[0].key))
    return ranked, weaker


def summary(diffs: list[QuantizeDiff]) -> list[str]:
    """Each behaviour over the comparisons where it heads the text (an exact fit there:
    ``split_fits``): how many of the differing blocks examined there it reproduces, in how
    many comparisons (``ranked_causes``, after ``reconcile``). A behaviour that is a weaker fit
    in any comparison it touches is named only on a last line, as weaker: it heads nothing,
    here as in that comparison's text (one exact on a few small inputs and weaker on the rest
    is not the cause the rest shows). Field relations (``relation_summary``) head the summary
    where they state more blocks than the best behaviour reproduces; behaviours that
    reproduce fewer are then weaker."""
    reconcile(diffs)
    ranked, weaker = ranked_causes(diffs)
    examined = sum(d.n_examined for d in diffs)
    unexplained = sum(d.unexplained for d in diffs)
    relations, stated = relation_summary(diffs)
    lines = []
    if relations and stated > (ranked[0][1] if ranked else 0):
        lines += [f"field relation: {r.line()}" for r in relations[:RELATIONS_SHOWN]]
        if len(relations) > RELATIONS_SHOWN:
            lines.append(f"... {len(relations) - RELATIONS_SHOWN} more field relations (per comparison below)")
        for t in [t for t in ranked if t[1] < stated]:
            weaker.setdefault(t[0].key, t[0])
        ranked = [t for t in ranked if t[1] >= stated]
        relations = []
    lines += [f"{rep:,} of the {examined:,} differing blocks examined are reproduced by: {b.describe()} "
              f"(in {n} of {len(diffs)} comparisons)" for b, rep, n in ranked[:3]]
    if len(ranked) > 3:
        lines.append(f"... {len(ranked) - 3} more behaviours fit some blocks (per comparison below)")
    kept = {t[0].key for t in ranked}
    only_weaker = [b.title for k, b in weaker.items() if k not in kept]
    if only_weaker:
        lines.append("weaker fits, not a cause (they explain fewer blocks or change blocks the kernel gets right): "
                     + "; ".join(only_weaker[:3]) + (f"; and {len(only_weaker) - 3} more" if len(only_weaker) > 3 else ""))
    if unexplained:
        lines.append(f"{unexplained:,} of the {examined:,} differing blocks examined are reproduced by no known "
                     "behaviour")
    if stated and not relations and stated < examined:  # relations head: what they leave
        lines.append(f"{examined - stated:,} of the {examined:,} differing blocks examined are stated by no field "
                     "relation")
    if unexplained:  # relations that head nothing say what the blocks no behaviour reproduces are
        lines += [f"field relation: {r.line()}" for r in relations[:RELATIONS_SHOWN]]
    return lines


def report(diffs: list[QuantizeDiff], compared: int, head: str) -> str:
    """The failure message of a quantize check: the summary, each differing field's count,
    then each comparison's attribution and example blocks."""
    fields = [f"  {d.operand}.{c.field} ({d.label}): {c.differ:,} of {c.total:,} {c.unit} differ"
              for d in diffs for c in d.counts if c.differ]
    fields += [f"  {d.operand} ({d.label}): {d.problem}" for d in diffs if d.problem]
    first = next((f"{d.operand}.{c.field} ({d.label})" for d in diffs for c in d.counts if c.differ),
                 f"{diffs[0].operand} ({diffs[0].label})")
    out = [f"{head}: {len(diffs)} of {compared} comparisons differ from the oracle, the first in {first}", *fields,
           "cause:", *("  " + line for line in summary(diffs))]
    for i, d in enumerate(diffs):
        out += diagnose(d) if i < DIAGNOSED_IN_FULL else [f"{d.operand} ({d.label}): {d.n_differing:,} of "
                                                          f"{d.n_blocks:,} {d.unit} differ; {_best(d)}"]
    return "\n".join(out)
