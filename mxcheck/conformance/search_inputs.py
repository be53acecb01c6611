"""The inputs the search draws (Hypothesis strategies), built so that shrinking simplifies them.

A tensor is a shape, a dtype, a *fill* (zeros first, then seeded normal, uniform,
heavy-tailed or outlier-row draws), a few explicit values (sign, an integer mantissa of up to
8 bits, a small exponent: they hit the element formats' codes and rounding midpoints and
amaxes that are not powers of two), one tensor magnitude 2^E across the dtype's whole range
(gradient magnitudes drawn apart), and a few specials placed after the scaling (NaN, +-Inf,
-0, the dtype's smallest subnormal and largest finite value). Each part shrinks toward the
simplest: one block, a length that is a multiple of the block, float32, the zero fill (so the
failure keeps only the values it needs), no specials, mantissas toward 0, exponents toward 0.

Shapes come from the operand specs (``geometry_of``): the block along the contraction axis,
the block rows of a 2D tile, whether the oracle takes a ragged length (an MX spec with
``pad_to``), and a recipe's ``shape_multiple`` for the linear.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from mxcheck.conformance._common import fresh_state
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import Recipe

__all__ = ["DTYPES", "FILLS", "SPECIALS", "Case", "Geometry", "cases", "geometry_of", "size_of", "special_value"]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # shrinks toward the first
FILLS = ("zeros", "normal", "uniform", "heavy", "outlier_rows")  # shrinks toward zeros
SPECIALS = ("nan", "inf", "-inf", "-0", "min_subnormal", "max")
MAX_BLOCKS = 4  # blocks along the contraction axis
MAX_ROW_BLOCKS = 3  # row blocks (rows of a 1D-blocked operand: up to 8)
MAX_VALUES = 6  # explicit values per tensor
MAX_SPECIALS = 3
# Runs of ones _near draws: 2, 3, 4 where the even rule's bump (1 << (22 - mbits)) carries for
# e2m1, e3m2 and e2m3/e4m3; 23, float32's nextbelow of a power of two (floor, ceil, a float32
# log2); 0 and 1, a power of two and 1.5 times one, each a few ulps off.
NEAR_ONES = (2, 23, 3, 4, 0, 1)
_ROW_UNITS = (1, 16, 32, 128)  # the block heights a 2D tile may have, smallest first


@dataclass(frozen=True)
class Unit:
    """One operand's block: rows and columns of one block, and whether the oracle takes a
    contraction length that is not a multiple of ``cols``."""

    rows: int
    cols: int
    ragged: bool


@dataclass(frozen=True)
class Geometry:
    """What a property's inputs may look like: the operands and their blocks, the dtypes."""

    units: dict[str, Unit]
    dtypes: tuple[torch.dtype, ...]
    shape_multiple: int = 1


@dataclass(frozen=True, eq=False)
class Case:
    """One input of a property: the tensors by name (quantize: x; gemm: a, b; linear: x, w, b)."""

    prop: str
    operand: str
    tensors: dict[str, torch.Tensor]
    blocks: dict[str, int] = field(default_factory=dict)  # tensor -> blocks it spans

    @property
    def label(self) -> str:
        t = self.tensors
        dtype = str(next(iter(t.values())).dtype).removeprefix("torch.")
        if self.prop == "quantize":
            return f"{self.operand} {'x'.join(map(str, t['x'].shape))} {dtype}"
        first, second = ("a", "b") if self.prop == "gemm" else ("x", "w")
        (m, k), n = t[first].shape, t[second].shape[0]
        return f"M={m} N={n} K={k} {dtype}"


def size_of(case: Case) -> dict[str, Any]:
    """Shapes, blocks (the most any operand spans) and nonzero values (NaN counts) of a case."""
    return {"shapes": {n: list(t.shape) for n, t in case.tensors.items()},
            "blocks": max(case.blocks.values(), default=0),
            "nonzeros": sum(int(torch.count_nonzero(t)) for t in case.tensors.values())}


def _accepts(recipe: Recipe, operand: str, rows: int, cols: int) -> bool:
    spec = recipe.spec(operand)
    rand = torch.zeros(rows, cols, dtype=torch.uint8) if spec.rounding == "sr" else None
    try:
        quantize_operand(torch.zeros(rows, cols), spec, rand=rand, **fresh_state(recipe, operand))
    except ValueError:
        return False
    return True


def _unit(recipe: Recipe, operand: str) -> Unit | str:
    spec = recipe.spec(operand)
    cols = spec.block_size if spec.scaling in ("mx", "nvfp4") else 128 if spec.scaling.startswith("block") else 16
    rows = next((r for r in _ROW_UNITS if _accepts(recipe, operand, r, cols)), None)
    if rows is None:
        return f"{operand} of recipe {recipe.name}: the oracle takes no shape of {list(_ROW_UNITS)} x {cols}"
    return Unit(rows, cols, _accepts(recipe, operand, rows, cols + 1))


def geometry_of(prop: str, recipe: Recipe, input_dtypes: Any = None) -> Geometry | str:
    """The shapes and dtypes ``prop`` draws for ``recipe``, or why it cannot draw any."""
    dtypes = tuple(d for d in DTYPES if input_dtypes is None or d in tuple(input_dtypes))
    if not dtypes:
        return f"the backend's input_dtypes={input_dtypes} holds none of {list(DTYPES)}"
    operands = ("x_row", "w_row")
    if prop == "quantize":
        operands = tuple(op for op in operands if recipe.spec(op).rounding != "sr")
    units = {op: _unit(recipe, op) for op in operands}
    bad = next((u for u in units.values() if isinstance(u, str)), None)
    if bad is not None:
        return bad
    return Geometry(units, dtypes, recipe.shape_multiple if prop == "linear" else 1)


# ---- strategies ------------------------------------------------------------------------------------


_MANTISSA_BITS = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}


def _exponent_range(dtype: torch.dtype) -> tuple[int, int]:
    """Exponents E for which 2^E spans the dtype: its smallest subnormal to its largest binade."""
    info = torch.finfo(dtype)
    return round(math.log2(info.smallest_normal)) - _MANTISSA_BITS[dtype], math.floor(math.log2(info.max))


def special_value(name: str, dtype: torch.dtype) -> float:
    """The value of a SPECIALS name in ``dtype``."""
    info = torch.finfo(dtype)
    return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "-0": -0.0,
            "min_subnormal": 2.0 ** _exponent_range(dtype)[0], "max": info.max}[name]


def _fill(kind: str, seed: int, rows: int, cols: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if kind == "zeros":
        return torch.zeros(rows, cols, dtype=torch.float64)
    if kind == "uniform":
        return torch.rand(rows, cols, generator=gen, dtype=torch.float64) * 2 - 1
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    if kind == "heavy":
        return x**3
    if kind == "outlier_rows":  # every third row 2^12 above the rest
        return x * torch.where(torch.arange(rows) % 3 == 0, 2.0**12, 1.0).double()[:, None]
    return x


def _st() -> Any:
    from hypothesis import strategies  # noqa: PLC0415  (optional: only a search imports it)

    return strategies


def _near(d: int, j: int, above: bool, e: int) -> float:
    """(2 - 2^-d) * 2^e (d ones after the leading one; d=0: 2^e itself) moved j float32 ulps
    down or up: amaxes where a scale rule's rounding bump carries or not, and where a
    float32 log2 rounds to the next power (d = 23 is nextbelow(2^(e+1)))."""
    v = 2.0 - 2.0**-d
    ulp = 2.0 ** (math.floor(math.log2(v)) - 23)
    return (v + (j if above else -j) * ulp) * 2.0**e


def _value(st: Any) -> Any:
    """A magnitude: an integer of up to 8 bits times 2^e (the element formats' codes, their
    rounding midpoints, amaxes that are not powers of two), or a run of ones moved a few
    float32 ulps (``_near``)."""
    exponent = st.integers(-6, 6)
    integer = st.builds(lambda m, e: m * 2.0**e, st.integers(0, 255), exponent)
    near = st.builds(_near, st.sampled_from(NEAR_ONES), st.integers(1, 2), st.booleans(), exponent)
    return st.one_of(integer, near)


def _tensor(draw: Any, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    st = _st()
    lo, hi = _exponent_range(dtype)
    n = rows * cols
    fill = draw(st.sampled_from(FILLS))
    seed = draw(st.integers(0, 2**16 - 1)) if fill != "zeros" else 0
    values = draw(st.lists(st.tuples(st.integers(0, 2**20), st.booleans(), _value(st)), max_size=MAX_VALUES))
    # the tensor's magnitude: near 1 first, then gradient magnitudes (2^-30 .. 2^-10), then anywhere
    magnitude = draw(st.one_of(st.integers(-3, 3), st.integers(-30, -10), st.integers(lo, hi)))
    specials = draw(st.lists(st.tuples(st.integers(0, 2**20), st.sampled_from(SPECIALS)), max_size=MAX_SPECIALS))
    x = _fill(fill, seed, rows, cols).reshape(-1)
    for pos, negative, value in values:
        x[pos % n] = -value if negative else value
    x = x * 2.0**magnitude
    for pos, name in specials:
        x[pos % n] = special_value(name, dtype)
    return x.reshape(rows, cols).to(dtype)


def _dims(draw: Any, unit: int, blocks: int, ragged: bool = False) -> int:
    st = _st()
    if unit == 1:  # rows of a 1D-blocked operand: each row is a block
        return draw(st.integers(1, 8 if blocks > 1 else 1))
    extra = draw(st.integers(0, unit - 1)) if ragged else 0
    return unit * draw(st.integers(1, blocks)) + extra


def _blocks(t: torch.Tensor, u: Unit) -> int:
    return -(-t.shape[0] // u.rows) * -(-t.shape[1] // u.cols)


def cases(prop: str, g: Geometry, one_block: bool = False) -> Any:
    """The Hypothesis strategy of ``prop``'s inputs under ``g`` (``one_block``: every operand
    one block, its contraction length the block's)."""
    st = _st()
    blocks, row_blocks = (1, 1) if one_block else (MAX_BLOCKS, MAX_ROW_BLOCKS)

    @st.composite
    def quantize(draw: Any) -> Case:
        operand = draw(st.sampled_from(sorted(g.units, key=("x_row", "w_row").index)))
        u, dtype = g.units[operand], draw(st.sampled_from(g.dtypes))
        x = _tensor(draw, _dims(draw, u.rows, row_blocks), _dims(draw, u.cols, blocks, u.ragged and not one_block),
                    dtype)
        return Case(prop, operand, {"x": x}, {"x": _blocks(x, u)})

    @st.composite
    def two(draw: Any) -> Case:
        ua, ub, dtype = g.units["x_row"], g.units["w_row"], draw(st.sampled_from(g.dtypes))
        sm = g.shape_multiple
        k = _dims(draw, max(ua.cols, ub.cols, sm), blocks, ua.ragged and ub.ragged and sm == 1 and not one_block)
        m = _dims(draw, max(ua.rows, sm), row_blocks)
        n = _dims(draw, max(ub.rows, sm), row_blocks)
        a, b = _tensor(draw, m, k, dtype), _tensor(draw, n, k, dtype)
        names = ("a", "b") if prop == "gemm" else ("x", "w")
        tensors = dict(zip(names, (a, b), strict=True))
        if prop == "linear":
            bias = torch.zeros(n, dtype=torch.float64)
            for pos, mantissa, exponent in draw(st.lists(st.tuples(st.integers(0, 2**20), st.integers(-255, 255),
                                                                   st.integers(-6, 6)), max_size=2)):
                bias[pos % n] = mantissa * 2.0**exponent
            tensors["b"] = bias.to(dtype)
        return Case(prop, "x_row", tensors, {names[0]: _blocks(a, ua), names[1]: _blocks(b, ub)})

    return quantize() if prop == "quantize" else two()
