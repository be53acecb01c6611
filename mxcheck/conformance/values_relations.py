"""Field relations on a values kernel's values: what exactly differs, read three ways.

Where no behaviour of the catalogue reproduces a values comparison (``conformance.values``),
what differs is stated with the algebra of ``mxcheck.diagnose.relations`` (the same kinds,
coverage and conditions; one path), on three readings of the same values. Each differing
block is stated by the reading that covers the most blocks (``relate_fields``' alternatives):

- ``scale``: every value of the block is the oracle's quantization of its input (the
  spec's element rounding, saturating) at another block scale, which ``infer_scales`` finds;
  that scale is related to the oracle's: times 2^K (a binade high or low), a constant such as
  1e-10, a ratio such as 4/3, not a power of two, rounded to bf16, one ulp off.
- ``values``: per element, the kernel's value against the oracle's in the kernel's dtype
  (rounded to bf16 or fp16, one ulp, times 2^K, 0, 1, +-max, the sign flipped, NaN, Inf).
- ``codes``: where every differing value of a block is a value of the element format at the
  oracle's scale (``infer_codes``), the codes those values give against the oracle's codes
  (one code step above or below, the sign flipped, 0, NaN).

A relation is stated only for blocks where it reproduces every differing value.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import Any

import torch

from mxcheck.conformance.values_judge import infer_codes
from mxcheck.diagnose.catalogue import element_format
from mxcheck.diagnose.relations import (
    FieldEntries,
    Relation,
    block_facts,
    float32_text,
    ratio_text,
    relate_fields,
)
from mxcheck.formats import decode_table, encode_bits

__all__ = ["READINGS", "infer_scales", "oracle_scales", "relate_values", "shared_scales"]

READINGS = ("scale", "values", "codes")  # in the order one is preferred where two state the same blocks
BINADES = 8  # scales the oracle's times 2^K, |K| <= BINADES, are tried first
SHARED = 4  # scales (or ratios to the oracle's) found in several blocks, tried on every differing block


def oracle_scales(q: Any) -> torch.Tensor:
    """Per element, the float32 factor the oracle multiplies its element value by: q
    dequantized with every code set to the element format's 1.0 (MX 2^e, FP8 scale_inv,
    NVFP4 s * amax / 2688), so no quantized type needs a case of its own here."""
    fmt = element_format(q)
    one = int(encode_bits(torch.ones(1), fmt)[0])
    return replace(q, codes=torch.full_like(q.codes, one)).dequantize()


def _grouped(t: torch.Tensor, order: torch.Tensor, n: int) -> torch.Tensor:
    return t.flatten()[order].reshape(n, -1)


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Equal bits (any NaN equal to any NaN), through same-width integer views."""
    view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return (a.contiguous().view(view) == b.contiguous().view(view)) | (a.isnan() & b.isnan())


def _requantized(x: torch.Tensor, scale: torch.Tensor, fmt: Any, rounding: str, dtype: torch.dtype) -> torch.Tensor:
    """x quantized at ``scale`` (broadcast against x) in float32 as a kernel does: x / s
    rounded to the element format, saturating, times s, in ``dtype``."""
    s = scale.float()
    codes = encode_bits(x / s, fmt, rounding, True)
    return (decode_table(fmt)[codes.to(torch.int64)] * s).to(dtype)


def _hits(x: torch.Tensor, got: torch.Tensor, candidates: torch.Tensor, fmt: Any, rounding: str) -> torch.Tensor:
    """Per block (rows of x and got) and candidate scale (columns of ``candidates``),
    whether every value of the block is reproduced at that scale. Each candidate is
    screened on three of the block's values first; only those that pass run on the block."""
    a = got.double().abs()
    # the largest value and the two smallest nonzero ones: a scale one binade off keeps the
    # first on the grid, but seldom the small ones (the grid is coarser relative to them)
    top = torch.where(a.isfinite(), a, -1.0).argmax(-1, keepdim=True)
    small = torch.where(a.isfinite() & (a > 0), a, math.inf).argsort(-1)[:, :2]
    picked = torch.cat([top, small], dim=1)
    screen = _requantized(x.gather(1, picked).unsqueeze(1), candidates.unsqueeze(-1), fmt, rounding, got.dtype)
    hit = _same(screen, got.gather(1, picked).unsqueeze(1).expand_as(screen)).all(-1) & candidates.isfinite()
    b, c = hit.nonzero(as_tuple=True)
    if len(b):
        whole = _requantized(x[b], candidates[b, c].unsqueeze(1), fmt, rounding, got.dtype)
        wrong = ~_same(whole, got[b]).all(-1)
        hit[b[wrong], c[wrong]] = False
    return hit


def _pick(hit: torch.Tensor, candidates: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """Per block, the hitting candidate of lowest ``rank`` (float64), or NaN."""
    best = torch.where(hit, rank.double(), float("inf")).argmin(-1, keepdim=True)
    found = hit.gather(1, best).squeeze(1)
    return torch.where(found, candidates.double().gather(1, best).squeeze(1), float("nan"))


_NONE = torch.zeros(0, dtype=torch.float64)


def infer_scales(x: torch.Tensor, got: torch.Tensor, s_o: torch.Tensor, fmt: Any, rounding: str,
                 known: tuple[torch.Tensor, torch.Tensor] = (_NONE, _NONE)) -> torch.Tensor:
    """Per block (rows of ``x``, ``got``: input and kernel values grouped by block; ``s_o``
    the oracle's scale of each), a block scale other than the oracle's at which every value
    is reproduced, or NaN where none is found: first the oracle's times 2^K (smallest |K|
    first); else a scale that puts the block's largest value on a grid value, preferring
    the one scale, then the one ratio to the oracle's, that reproduces the most blocks (it
    also covers blocks whose values are all 0, where one block alone fixes no scale), and
    else the block's own closest to the oracle's. ``known``: (scales, ratios to the
    oracle's) other comparisons of the same check share, tried as this one's shared ones."""
    k = torch.tensor([j * sign for j in range(1, BINADES + 1) for sign in (1, -1)], dtype=torch.float64)
    a = got.double().abs()
    top = torch.where(a.isfinite(), a, 0.0).amax(-1)
    # a block whose values are all 0 (or not finite) fixes no scale of its own
    found = torch.full((len(x),), float("nan"), dtype=torch.float64)
    fixed = top > 0
    if bool(fixed.any()):
        binades = s_o[fixed].unsqueeze(1) * torch.exp2(k)
        hit = _hits(x[fixed], got[fixed], binades, fmt, rounding)
        found[fixed] = _pick(hit, binades, torch.arange(len(k)).expand_as(hit))
    grid = decode_table(fmt).double()
    grid = torch.unique(grid[grid.isfinite() & (grid > 0)])
    # each a float32 scale, as a kernel holds one, and its float32 neighbours (the largest
    # value is the scale times a grid value rounded once, so the quotient may be one off)
    near = (top.unsqueeze(1) / grid).float()
    free = torch.cat([near, torch.nextafter(near, torch.zeros_like(near)),
                      torch.nextafter(near, torch.full_like(near, float("inf")))], dim=1).double()
    left = found.isnan() & fixed
    shared, ratios = known
    # Scales that are not the oracle's times 2^K: a block's values on the grid at s are on it
    # at s / 2 too (away from the grid's ends), so one block rarely fixes its scale. The scale
    # (or the ratio to the oracle's) that reproduces the most blocks is taken where it fits,
    # then the next; a block no shared one fits takes its own closest to the oracle's.
    if bool(left.any()):
        free, s_left = free[left], s_o[left].unsqueeze(1)
        hit = _hits(x[left], got[left], free, fmt, rounding)
        found[left] = _pick(hit, free, (torch.log2(free / s_left)).abs())
        shared = torch.unique(torch.cat([shared, _plainer(_common(free[hit]))]))
        ratios = torch.unique(torch.cat([ratios, _plainer(_common((free / s_left)[hit]), ratio=True)]))
    retry = found.isnan() | (torch.frexp(found / s_o).mantissa.abs() != 0.5)
    candidates = torch.cat([shared.expand(int(retry.sum()), -1), s_o[retry].unsqueeze(1) * ratios], dim=1)
    if candidates.shape[1] and bool(retry.any()):
        hit = _hits(x[retry], got[retry], candidates, fmt, rounding)
        # most blocks first; where two tie (both exact), the plainer number
        plain = [len(float32_text(c)) for c in shared.tolist()] + [len(ratio_text(r)) for r in ratios.tolist()]
        key = [(-int(n), p) for n, p in zip(hit.sum(0).tolist(), plain, strict=True)]
        rank = torch.tensor(sorted(range(len(key)), key=key.__getitem__)).argsort().expand_as(hit)
        again = _pick(hit, candidates, rank)
        found[retry] = torch.where(again.isnan(), found[retry], again)
    return found


def _plainer(v: torch.Tensor, *, ratio: bool = False) -> torch.Tensor:
    """v and plainer numbers near each (a scale to 1-3 significant digits, a ratio as a
    fraction of denominator at most 64), as float32 values: a kernel whose values are
    rounded to bf16 leaves its scale known to a few bits, and the plain number it used is
    among those that reproduce it (1e-10, not 1.0004441e-10)."""
    near = [float(Fraction(c).limit_denominator(64)) if ratio else float(f"{c:.{d}g}")
            for c in v.tolist() for d in (1, 2, 3)]
    return torch.unique(torch.cat([v, torch.tensor(near, dtype=torch.float64)]).float().double())


def _common(v: torch.Tensor, most: int = SHARED) -> torch.Tensor:
    """The ``most`` values of v that occur most often (at least twice)."""
    values, counts = torch.unique(v, return_counts=True)
    return values[counts >= 2][counts[counts >= 2].argsort(descending=True, stable=True)][:most]


def _scale_reading(d: Any, order: torch.Tensor, n: int, s_o: torch.Tensor) -> FieldEntries | None:
    """The ``scale`` reading: blocks whose values are all the oracle's quantization of their
    input at another scale (``d.known_scales``: those other comparisons found). None where
    the spec reads its input otherwise (a rotation, SR)."""
    if d.spec.hadamard is not None or d.spec.rounding == "sr":
        return None
    fmt = element_format(d.oracle)
    x, got = _grouped(d.x.float(), order, n), _grouped(d.got, order, n)
    bad = d.differing.nonzero().flatten()
    try:
        found = infer_scales(x[bad], got[bad], s_o[bad], fmt, d.spec.rounding, d.known_scales)
    except (ValueError, KeyError):  # a rounding the element cast does not take
        return None
    keep = found.isfinite() & (found != s_o[bad])
    return FieldEntries("scale", found[keep].float(), s_o[bad][keep].float(), bad[keep], free=True,
                        template=f"the values lie on the {fmt.name} grid at a block scale of {{}}")


def _codes_reading(d: Any, left: torch.Tensor) -> FieldEntries | None:
    """The ``codes`` reading of the differing blocks ``left`` (bool per block; those the
    scale reading leaves: a block it reproduces lies on no grid at the oracle's scale): in
    blocks whose every differing value some code gives at the oracle's scale, those codes
    against the oracle's."""
    if tuple(d.oracle.codes.shape) != tuple(d.got.shape) or not bool(left.any()):
        return None
    codes = infer_codes(d.got, d.oracle)
    off_grid = ~left.clone()
    off_grid[d.blocks[d.differ & (codes == 0xFF)]] = True
    keep = d.differ & ~off_grid[d.blocks]
    return FieldEntries("codes", codes[keep], d.oracle.codes.cpu()[keep], d.blocks[keep], fmt=element_format(d.oracle),
                        template="{} (the codes the values give under the oracle's block scale)")


def shared_scales(found: FieldEntries, known: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``known`` and the fewest scales, and ratios to the oracle's, that are not powers of
    two and explain the ``scale`` reading's blocks, each at least two (most blocks first, at
    most SHARED): what the next comparisons try. A ratio 4/3 is carried, not the scale of
    each binade it gives; a constant 1e-10, not its ratio to each binade's scale."""
    scale, ratio = found.kernel.double(), found.kernel.double() / found.oracle.double()
    left = torch.frexp(ratio).mantissa.abs() != 0.5
    options = [(0, v) for v in _common(scale[left], 2 * SHARED).tolist()]
    options += [(1, v) for v in _common(ratio[left], 2 * SHARED).tolist()]
    chosen: tuple[list[float], list[float]] = ([], [])
    while options and len(chosen[0]) + len(chosen[1]) < SHARED:
        covers = [left & ((scale, ratio)[which] == v) for which, v in options]
        best = max(range(len(options)), key=lambda i: int(covers[i].sum()))
        if int(covers[best].sum()) < 2:
            break
        which, v = options.pop(best)
        chosen[which].append(v)
        left &= ~covers[best]
    return tuple(torch.unique(torch.cat([known[i], torch.tensor(chosen[i], dtype=torch.float64)]))
                 for i in range(2))


def relate_values(d: Any) -> tuple[list[Relation], torch.Tensor]:
    """The field relations of one values comparison (a ``ValuesDiff``) and, per block,
    whether one states it: the three readings (``READINGS``), each block by the reading that
    covers the most."""
    n = d.n_blocks
    flat = d.blocks.flatten()
    counts = torch.bincount(flat, minlength=n)
    readings: dict[str, FieldEntries | None] = {"scale": None, "values": None, "codes": None}
    scales = oracle_scales(d.oracle).cpu()
    if bool((counts == counts[0]).all()) and tuple(d.x.shape) == tuple(d.got.shape) == tuple(scales.shape):
        order = flat.argsort(stable=True)
        readings["scale"] = _scale_reading(d, order, n, _grouped(scales, order, n)[:, 0].double())
    readings["values"] = FieldEntries("values", d.got[d.differ], d.want[d.differ], d.blocks[d.differ])
    scaled = torch.zeros(n, dtype=torch.bool)
    if readings["scale"] is not None:
        scaled[readings["scale"].block] = True
    readings["codes"] = _codes_reading(d, d.differing & ~scaled)
    fields = [f for f in readings.values() if f is not None]
    if readings["scale"] is not None:
        d.known_scales = shared_scales(readings["scale"], d.known_scales)
    return relate_fields(fields, block_facts(d.x, d.blocks, n), d.differing, alternatives=True, unit=d.unit)
