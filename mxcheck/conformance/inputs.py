"""Conformance inputs that look like training tensors and sit where kernels differ.

``randn`` float32 almost never lands on a rounding midpoint or next to a power of two, so
a backend that rounds ties the wrong way, or takes a block exponent from a float32
``log2``, passes a randn suite. These tensors are bf16-valued (what training tensors
hold) and built from 32x32 tiles, each of one kind:

- ``mid``: a quarter of the elements are exact midpoints of the operand's element grid
  (ties for RNE vs half-away vs truncation), the rest bf16 Gaussian values, and the tile's
  amax on both diagonals, so every 1x32, 32x1, 1x16, 16x1, 16x16 and 32x32 block holds it.
  The amax is a power of two times the format's anchor (MX: 2**emax, which every scale
  rule maps to the same exponent; NVFP4: 6 with a tensor amax of 6 * 448 * 2**j; FP8
  tensor/delayed scaling: the format's max with that as the tensor amax), so every scale
  is a power of two and a midpoint stays a midpoint after scaling;
- ``randn``: bf16 Gaussian values with a few 8x outliers; ``zero``: an all-zero block;
- ``amax``: values whose amax sits exactly at, one ulp above, or 1-4 ulps below a
  scale-rule boundary (2**p for floor/ceil, 2**p (1 - 2**-(mbits+2)) for even, max * 2**k
  for rceil) across the exponent range, plus subnormal amaxes (where a float32 ``log2``
  lands a binade off, DESIGN.md "Scale rules"). The ulps are bf16's by default (linear
  checks: a backend that runs in bf16, as TE's adapter does, sees the very same values);
  ``value_dtype=torch.float32`` gives float32 ulps and float32 subnormals (quantize checks
  on float32 input);
- ``special`` (only when asked, for quantize checks): a single +Inf, -Inf or NaN.

Rotated operands (Hadamard) mix the tile before rounding, so their midpoints are not
exact; the unrotated copies of the same tensors carry them.

The tiled tensors have one tensor amax each, so ``FAMILIES`` (below) adds small tensors
drawn natively in float32, bf16 and float16 whose tensor amax walks each dtype's range,
with mixed magnitudes and specials alone; ``families_table()`` lists every family for the
docs ("Input families").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mxcheck.formats import decode_table, get_format
from mxcheck.recipes import OperandSpec

__all__ = [
    "FAMILIES",
    "FAMILY_DTYPES",
    "GRADIENT_AMAX",
    "TILE",
    "Family",
    "amax_boundaries",
    "families_table",
    "grid_midpoints",
    "magnitude_tensor",
    "sweep_amaxes",
    "training_like",
    "training_like_cropped",
]

TILE = 32
_E4M3_MAX = 448.0  # NVFP4's block scale format (ue4m3) max: tensor amax = 6 * 448 * 2**j
# Exponents of the amax tiles: the whole float32 range for quantize checks, a moderate
# range for linear checks (whose float32 GEMMs must not overflow or flush everything).
WIDE_POWERS = (-126, -100, -64, -20, -7, -3, -1, 0, 1, 3, 7, 20, 64, 100, 126)
LINEAR_POWERS = (-7, -3, 0, 3, 7)
_SPECIALS = (float("inf"), float("-inf"), float("nan"))
# Per value dtype: (the integer view of its bits, subnormal amaxes in its range).
_VALUE_DTYPES = {
    torch.float32: (torch.int32, (2.0**-149 * 3, 2.0**-133, 2.0**-130, 2.0**-127 * 1.5)),
    torch.bfloat16: (torch.int16, (2.0**-133 * 3, 2.0**-133, 2.0**-130, 2.0**-127 * 1.5)),
}


def grid_midpoints(fmt: str) -> torch.Tensor:
    """float64 midpoints between consecutive non-negative finite values of ``fmt``."""
    v = decode_table(get_format(fmt)).double()
    v = torch.unique(v[torch.isfinite(v) & (v >= 0)])  # sorted
    return (v[1:] + v[:-1]) / 2


def _check_value_dtype(value_dtype: torch.dtype) -> tuple[torch.dtype, tuple[float, ...]]:
    if value_dtype not in _VALUE_DTYPES:
        raise ValueError(f"value_dtype={value_dtype}; expected one of {list(_VALUE_DTYPES)}")
    return _VALUE_DTYPES[value_dtype]


def _step(a: torch.Tensor, ulps: int, value_dtype: torch.dtype) -> torch.Tensor:
    """a (positive, representable in value_dtype) moved by ``ulps`` of value_dtype's units in
    the last place (through its bits), as float32."""
    bits, _ = _check_value_dtype(value_dtype)
    return (a.to(value_dtype).view(bits) + ulps).view(value_dtype).float()


def amax_boundaries(fmt: str, powers: tuple[int, ...], value_dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Groups of float32-held amaxes: at, one ulp above and 1, 2, 4 ulps below each
    scale-rule boundary near 2**p (ulps of ``value_dtype``); then each "1 ulp below" alone
    (the amax of a whole 2D tile); then the subnormal amaxes of ``value_dtype``."""
    _, subnormals = _check_value_dtype(value_dtype)
    f = get_format(fmt)
    groups, below = [], []
    for p in powers:
        for b in (2.0**p, 2.0**p * (1 - 2.0 ** -(f.mbits + 2)), f.max * 2.0 ** (p - f.emax)):
            t = torch.tensor(b, dtype=torch.float32)
            if torch.isfinite(t.to(value_dtype)) and t != 0:
                groups.append(torch.stack([t, *(_step(t, j, value_dtype) for j in (1, -1, -2, -4))]))
                below.append(_step(t, -1, value_dtype).reshape(1))
    return groups + below + [torch.tensor(subnormals, dtype=torch.float32)]


def _anchors(spec: OperandSpec) -> tuple[float, float | None, int]:
    """(tile amax at 2**0, tensor amax or None, largest tile exponent)."""
    fmt = get_format(spec.fmt)
    if spec.scaling == "mx":
        return 2.0**fmt.emax, None, 6
    if spec.scaling == "nvfp4":
        return fmt.max, fmt.max * _E4M3_MAX, 6  # block scales 2**k stay inside ue4m3
    if spec.scaling == "none":
        return 1.0, None, 6
    return fmt.max, fmt.max, 0  # FP8 tensor/delayed: scale = max / amax = 1


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


def _diagonals() -> torch.Tensor:
    i = torch.arange(TILE)
    mask = torch.zeros(TILE, TILE, dtype=torch.bool)
    mask[i, i] = True
    mask[i, (i + TILE // 2) % TILE] = True
    return mask


def _mid_tile(gen: torch.Generator, anchor: float, mids: torch.Tensor) -> torch.Tensor:
    t = _bf16((torch.randn(TILE, TILE, generator=gen) / 3).clamp(-1, 1) * anchor)
    pick = torch.rand(TILE, TILE, generator=gen) < 0.25
    m = mids[torch.randint(0, len(mids), (TILE, TILE), generator=gen)].float()
    sign = torch.where(torch.rand(TILE, TILE, generator=gen) < 0.5, -1.0, 1.0)
    t = torch.where(pick, sign * m, t)
    return torch.where(_diagonals(), torch.where(sign > 0, anchor, -anchor), t)


def _randn_tile(gen: torch.Generator, anchor: float) -> torch.Tensor:
    t = torch.randn(TILE, TILE, generator=gen) * anchor / 4
    outliers = torch.rand(TILE, TILE, generator=gen) < 1 / 64
    return _bf16(torch.where(outliers, t * 8, t))


def _amax_tile(gen: torch.Generator, amaxes: torch.Tensor) -> torch.Tensor:
    # Row r's amax is amaxes[r % len], on its two diagonal elements (one per 16-block) with
    # random signs; the other values are bf16 well under it (scaled in float32, so a
    # subnormal amax stays exact).
    row_amax = amaxes[torch.arange(TILE) % len(amaxes)].unsqueeze(1)
    t = _bf16((torch.randn(TILE, TILE, generator=gen) / 4).clamp(-0.5, 0.5)) * amaxes.min()
    sign = torch.where(torch.rand(TILE, TILE, generator=gen) < 0.5, -1.0, 1.0)
    return torch.where(_diagonals(), sign * row_amax, t)


def _special_tile(gen: torch.Generator, anchor: float, value: float) -> torch.Tensor:
    t = _randn_tile(gen, anchor)
    t[int(torch.randint(0, TILE, (), generator=gen)), int(torch.randint(0, TILE, (), generator=gen))] = value
    return t


def _tile(kind: str, arg: object, gen: torch.Generator, anchor: float, mids: torch.Tensor) -> torch.Tensor:
    if kind == "mid":
        return _mid_tile(gen, anchor, mids)
    if kind == "randn":
        return _randn_tile(gen, anchor)
    if kind == "amax":
        return _amax_tile(gen, arg)
    if kind == "special":
        return _special_tile(gen, anchor, arg)
    return torch.zeros(TILE, TILE)


def training_like(gen: torch.Generator, rows: int, cols: int, spec: OperandSpec, *,
                  powers: tuple[int, ...] | None = LINEAR_POWERS, specials: bool = False,
                  value_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A float32 (rows, cols) tensor of tiles as the module docstring says, for ``spec``.

    rows and cols are multiples of 32. ``powers``: exponents of the amax tiles (for MX;
    for tensor-scaled formats those above 0 are dropped, to stay under the tensor amax);
    None: no amax tiles. ``specials``: add Inf/NaN tiles (quantize checks only: a linear's
    SNR means nothing with them). ``value_dtype``: every value is one of this dtype's
    (bfloat16: what training tensors hold and what a bf16 kernel sees unchanged; float32:
    amax tiles at float32 ulps, for quantize checks on float32 input).
    """
    if rows % TILE or cols % TILE:
        raise ValueError(f"rows={rows}, cols={cols}: training_like builds {TILE}x{TILE} tiles; "
                         f"expected multiples of {TILE}")
    tile_anchor, tensor_amax, kmax = _anchors(spec)
    mids = grid_midpoints(spec.fmt if spec.scaling != "none" else "e4m3")
    mids = mids[mids <= tile_anchor]
    # Scale everything but the amax tiles by a power of two to a typical magnitude ~1 (the
    # amax tiles keep their float32 values: 2**126 must not overflow, 2**-149 not vanish).
    norm = 2.0 ** -round(float(torch.log2(torch.tensor(tile_anchor))))
    tile_anchor, mids = tile_anchor * norm, mids * norm
    tensor_amax = None if tensor_amax is None else tensor_amax * norm
    # Tensor-scaled formats: amax tiles under the tensor amax, so they do not move its scale.
    amaxes = [] if powers is None else amax_boundaries(
        spec.fmt if spec.scaling != "none" else "e4m3",
        powers if tensor_amax is None else tuple(p for p in powers if p <= 0), value_dtype)
    n_tiles = (rows // TILE) * (cols // TILE)
    kinds = [("amax", a) for a in amaxes] + [("special", v) for v in (_SPECIALS if specials else ())]
    if len(kinds) + 2 > n_tiles:
        raise ValueError(f"a {rows}x{cols} tensor holds {n_tiles} tiles, too few for {len(kinds)} amax and "
                         "special tiles plus a zero and a midpoint tile")
    kinds += [("zero", None)] + [("mid", None), ("randn", None), ("mid", None)] * n_tiles
    order = torch.randperm(n_tiles, generator=gen).tolist()
    out = torch.empty(rows, cols)
    for slot, (kind, arg) in zip(order, kinds[:n_tiles], strict=True):
        k = int(torch.randint(-6, kmax + 1, (), generator=gen))
        tile = _tile(kind, arg, gen, tile_anchor * 2.0**k, mids * 2.0**k)
        r, c = divmod(slot, cols // TILE)
        out[r * TILE:(r + 1) * TILE, c * TILE:(c + 1) * TILE] = tile
    if tensor_amax is not None:
        out = torch.where(out.isfinite() & (out.abs() > tensor_amax), out.sign() * tensor_amax, out)
        out[0, 0] = tensor_amax  # one outlier sets the tensor scale to a power of two
    # The amaxes are value_dtype values; rounding the rest (amax tiles' small values scaled by
    # a full-mantissa amax) keeps each below its row's amax, rounding being monotone.
    return out.to(value_dtype).float()


def training_like_cropped(gen: torch.Generator, rows: int, cols: int, spec: OperandSpec) -> torch.Tensor:
    """``training_like`` at any shape (edge shapes: M = 1, K = 40): built at the next
    multiples of ``TILE`` and cropped to (rows, cols). Every row keeps its amax (amax tiles
    put each row's on its diagonals; mid tiles the tile's), so the cropped blocks still sit
    at the boundaries. Too small a tensor for the amax tiles keeps only midpoint, randn and
    zero tiles (at least two tile rows, so a zero and a midpoint tile both fit)."""
    r, c = (-(-d // TILE) * TILE for d in (rows, cols))
    try:
        full = training_like(gen, r, c, spec)
    except ValueError:  # too few tiles for the amax tiles
        full = training_like(gen, max(r, 2 * TILE), c, spec, powers=None)
    return full[:rows, :cols].contiguous()


# ---- input families across every magnitude (DESIGN.md "Reaching, fitting, ...") -------------
#
# The tiled tensors above all have one tensor amax (336 for NVFP4, 0.875 for FP8), so a
# per-tensor scale is always a power of two and no input reaches gradient magnitudes or a
# float16 tensor near its range ends. The families below are small tensors drawn natively
# in float32, bfloat16 and float16 (a float64 draw rounded once to the dtype), whose tensor
# amax walks each dtype's range. They are cheap: FAMILY_ROWS x FAMILY_COLS each.

FAMILY_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FAMILY_ROWS, FAMILY_COLS = 32, 128  # K = 128: every block size and pad_to (128) of the recipes
_SUBNORMAL_FACTOR = 0.75  # a non-power-of-two fraction: amax just inside a range end, not on a binade

# Per-tensor scale formulas of each scaling: (what it computes, the constant C in C / amax
# and amax / C). NVFP4: S_enc = 2688 / amax and ts = amax / 2688 (6 * 448); FP8 tensorwise
# and delayed: fmt.max / amax (448 for e4m3, 57344 for e5m2). MX and 1x128 blocks have no
# per-tensor scale.
_E2M1_MAX = 6.0


def _per_tensor_constants(spec: OperandSpec) -> tuple[float, ...]:
    if spec.scaling == "nvfp4":
        return (_E2M1_MAX * _E4M3_MAX,)
    if spec.scaling in ("tensor", "delayed"):
        return (get_format(spec.fmt).max,)
    return ()


def sweep_amaxes(spec: OperandSpec, dtype: torch.dtype) -> tuple[float, ...]:
    """Tensor amaxes of the magnitude sweep for ``spec`` in ``dtype``, ascending and each a
    value of ``dtype``: the smallest subnormal (a subnormal amax of 3/4 the smallest normal
    is the ``subnormals`` family's); gradient magnitudes 1e-8 (float16: 1e-7, its subnormals) and 5e-5; 1 (a power
    of two); 4.6 (a randn amax, as most are); 0.9 of the dtype's max; float16's max itself
    (65504: a float16 log2 of it rounds to 16, and the ceil and even rules take its scale
    past the dtype; the tiled amax families reach the top binade of float32 and bf16, 2^127,
    but are not fed in float16); and for each
    per-tensor formula C / amax and amax / C of ``spec`` (``_per_tensor_constants``), 3/4 of
    the amax where it leaves the dtype's normal range (C / amax overflows below C / max,
    amax / C is subnormal below C * tiny)."""
    fi = torch.finfo(dtype)
    smallest = fi.tiny * fi.eps  # the smallest subnormal (2**-149, 2**-133, 2**-24)
    points = [smallest, 1e-7 if dtype == torch.float16 else 1e-8, 5e-5, 1.0, 4.6, fi.max * 0.9]
    if dtype == torch.float16:
        points.append(fi.max)
    for c in _per_tensor_constants(spec):
        points += [c / fi.max * _SUBNORMAL_FACTOR, c * fi.tiny * _SUBNORMAL_FACTOR]
    held = torch.tensor(sorted(set(points)), dtype=torch.float64).to(dtype)
    return tuple(sorted({float(v) for v in held if v > 0 and torch.isfinite(v)}))


def _draw(gen: torch.Generator, rows: int, cols: int) -> torch.Tensor:
    """float64 Gaussian with a few 8x outliers, amax exactly 1."""
    t = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    t = torch.where(torch.rand(rows, cols, generator=gen) < 1 / 64, t * 8, t)
    return t / t.abs().max()


def _native(t: torch.Tensor, dtype: torch.dtype, amax: float) -> torch.Tensor:
    """t (float64) in dtype with its amax exactly ``amax`` (a value of dtype): one rounding,
    and the largest element set to amax so rounding cannot move the tensor amax."""
    out = t.to(dtype)
    flat = int(t.abs().argmax())
    out.view(-1)[flat] = amax if float(t.view(-1)[flat]) > 0 else -amax
    return out


def magnitude_tensor(gen: torch.Generator, rows: int, cols: int, dtype: torch.dtype, amax: float) -> torch.Tensor:
    """A Gaussian draw (a few 8x outliers) natively in ``dtype`` with tensor amax ``amax``
    (rounded to dtype): the magnitude family's tensor, at any shape."""
    amax = float(torch.tensor(amax, dtype=torch.float64).to(dtype))
    return _native(_draw(gen, rows, cols) * amax, dtype, amax)


_scaled = magnitude_tensor
GRADIENT_AMAX = 5e-5  # a typical gradient tensor's amax (the other checks' small-magnitude input)


def _outliers(gen: torch.Generator, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    # Most values about 1e-4; every 8th row (a token) and every 16th column (a channel) 1e8 above.
    t = _draw(gen, rows, cols) * 1e-4
    big = torch.zeros(rows, cols, dtype=torch.bool)
    big[::8, :] = True
    big[:, 3::16] = True
    return torch.where(big, t * 1e8, t).to(dtype)


def _one_nonzero(gen: torch.Generator, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    t = torch.zeros(rows, cols, dtype=dtype)
    t.view(-1)[int(torch.randint(0, rows * cols, (), generator=gen))] = -0.7
    return t


def _subnormals(gen: torch.Generator, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    return _scaled(gen, rows, cols, dtype, float(torch.tensor(torch.finfo(dtype).tiny * _SUBNORMAL_FACTOR,
                                                              dtype=torch.float64).to(dtype)))


def _with_one(value: float) -> Callable[..., torch.Tensor]:
    def make(gen: torch.Generator, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        t = _scaled(gen, rows, cols, dtype, 4.6)
        t.view(-1)[int(torch.randint(0, rows * cols, (), generator=gen))] = value
        return t
    return make


def _small_shape(spec: OperandSpec) -> tuple[int, int]:
    """FAMILY_ROWS x FAMILY_COLS, or 128 rows where 128x128 blocks need them."""
    return (128 if spec.scaling == "block128x128" else FAMILY_ROWS), FAMILY_COLS


@dataclass(frozen=True)
class Family:
    """One input family: how its tensors are made, in which dtypes, and why.

    ``tiles``: the keywords of ``training_like`` for a tiled family (one draw at the check's
    shape, fed in each dtype of ``dtypes``, which holds its values exactly). Otherwise
    ``make(gen, rows, cols, dtype)`` draws a small tensor natively in each dtype, or with
    ``sweep`` one per amax of ``sweep_amaxes``. ``amax``: its tensor amax (or range), for
    the docs."""

    name: str
    purpose: str
    amax: str
    make: Callable[..., torch.Tensor] | None = None
    dtypes: tuple[torch.dtype, ...] = FAMILY_DTYPES
    sweep: bool = False
    tiles: dict[str, Any] | None = None
    scale: float = 1.0  # a tiled family drawn small and times this power of two (midpoints stay midpoints)

    def tensors(self, gen: torch.Generator, spec: OperandSpec, rows: int,
                cols: int) -> list[tuple[torch.dtype, float, torch.Tensor]]:
        """(dtype, finite tensor amax, tensor) for each tensor of the family for ``spec``;
        rows x cols is the shape of a tiled family's tensors (the others are small)."""
        if self.tiles is not None:
            shape = (rows, cols) if self.scale == 1.0 else _small_shape(spec)
            values = training_like(gen, *shape, spec, **self.tiles) * self.scale
            made = [values.to(dtype) for dtype in self.dtypes]
        else:
            shape = _small_shape(spec)
            made = [t for dtype in self.dtypes for t in (
                [_scaled(gen, *shape, dtype, a) for a in sweep_amaxes(spec, dtype)] if self.sweep
                else [self.make(gen, *shape, dtype)])]
        out = []
        for t in made:
            finite = t.double().abs()[torch.isfinite(t)]
            out.append((t.dtype, float(finite.max()) if finite.numel() else 0.0, t))
        return out


_WIDE = "2^-149 .. 2^127 block maxima inside tensor amax 336 (NVFP4), 0.875 (FP8) or up to 2^126 (MX)"
FAMILIES: dict[str, Family] = {f.name: f for f in (
    # Tiled (training_like): bf16 values only (rounding midpoints with no float32 help),
    # adversarial block amaxes over the whole exponent range at bf16 and at float32 ulps,
    # Inf/NaN. fp16 holds the bf16 family's midpoints and Gaussians, not the wide range.
    Family("bf16", "rounding midpoints of the element grid, Gaussians with outliers and zero blocks (bf16 values)",
           "one per recipe: 336 (NVFP4), 0.875 (FP8), about 1 (MX)", tiles={"powers": None}),
    Family("amax", "block amaxes at, one ulp above and 1-4 ulps below each scale-rule boundary, float32 ulps and "
           "subnormals", _WIDE, dtypes=(torch.float32,),
           tiles={"powers": WIDE_POWERS, "value_dtype": torch.float32}),
    Family("amax-bf16", "the same block amaxes at bf16 ulps", _WIDE, dtypes=(torch.float32, torch.bfloat16),
           tiles={"powers": WIDE_POWERS}),
    Family("inf-nan", "one +Inf, one -Inf and one NaN tile among the bf16 family's", "Inf (and NaN)",
           dtypes=(torch.float32, torch.bfloat16), tiles={"powers": None, "specials": True}),
    # The bf16 family's tiles (midpoints, Gaussians, zero blocks) in a small tensor at a
    # gradient magnitude: 2^-24 is a power of two, so every scale stays one and a midpoint
    # stays a midpoint (float32 and bf16 hold the values; float16 would flush them).
    Family("midpoints-small", "the bf16 family's rounding midpoints and Gaussians at a gradient magnitude",
           "2^-24 times the bf16 family's", dtypes=(torch.float32, torch.bfloat16), tiles={"powers": None},
           scale=2.0**-24),
    # Small tensors drawn natively in each dtype, at every magnitude.
    Family("magnitude", "the same draw at every tensor magnitude the dtype holds: gradient magnitudes, range "
           "ends, and where each per-tensor scale formula (2688 / amax, amax / 2688, fmt.max / amax) leaves the "
           "dtype's normal range (amaxes mostly not powers of two)",
           "smallest subnormal .. 0.9 * dtype max, and float16's max 65504 (sweep_amaxes)", sweep=True),
    Family("outliers", "outlier rows (tokens) and columns (channels) 1e8 above the rest: a per-tensor scale set "
           "by the outliers flushes the rest", "about 1e4, the rest about 1e-4", _outliers),
    Family("zeros", "an all-zero tensor (amax 0: a per-tensor 1 / amax must not give NaN)", "0",
           lambda gen, r, c, dtype: torch.zeros(r, c, dtype=dtype)),
    Family("one-nonzero", "one nonzero value in a zero tensor", "0.7", _one_nonzero),
    Family("subnormals", "subnormal values only", "3/4 of the dtype's smallest normal", _subnormals),
    Family("one-inf", "one +Inf and no NaN among finite values", "4.6 (finite values)", _with_one(math.inf)),
    Family("one-nan", "one NaN and no Inf among finite values", "4.6 (finite values)", _with_one(math.nan)),
    Family("neg-zero", "-0 only (the zero code's sign)", "0",
           lambda gen, r, c, dtype: torch.full((r, c), -0.0, dtype=dtype)),
)}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def families_table() -> str:
    """The input families as a Markdown table (family, dtypes, tensor amax, purpose); for
    the magnitude sweep, the amaxes of each dtype for an NVFP4 and an FP8 operand."""
    from mxcheck.recipes import RECIPES  # noqa: PLC0415  (docs only)

    rows = ["| family | dtypes | tensor amax | purpose |", "|---|---|---|---|"]
    for f in FAMILIES.values():
        rows.append(f"| {f.name} | {', '.join(map(_dtype_name, f.dtypes))} | {f.amax} | {f.purpose} |")
    rows += ["", "The magnitude sweep's tensor amaxes (the per-tensor formula points depend on the scaling):", "",
             "| operand | dtype | tensor amaxes |", "|---|---|---|"]
    for recipe in ("mxfp8", "nvfp4", "fp8"):
        spec = RECIPES[recipe].x_row
        for dtype in FAMILY_DTYPES:
            amaxes = ", ".join(f"{a:.3g}" for a in sweep_amaxes(spec, dtype))
            rows.append(f"| {recipe} ({spec.scaling}) | {_dtype_name(dtype)} | {amaxes} |")
    return "\n".join(rows) + "\n"
