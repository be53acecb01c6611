"""Fake-quant backends: kernels that return values, not codes, judged on those values.

A backend may offer ``fake_quantize(x, spec, *, state=None) -> Tensor`` instead of (or beside)
``quantize``: the quantized-then-dequantized values of the 2D operand ``x`` along its last
axis, shaped like ``x``, in ``x``'s dtype or float32 (what QAT toolkits and the fake-quant
kernels of a training step return). The contract (docs/backends.md, "Fake-quant backends"):

- The oracle's values are ``quantize_operand(x, spec).dequantize()``: exact in float32 (every
  element times its scale is a float32, or overflows either way), in the rotated basis
  where the spec rotates. They are cast to the dtype the kernel returned with torch's
  ``Tensor.to``, which rounds to nearest, ties to even (a float32 result needs no cast).
- Compared bit for bit through integer views (signs and -0 count), except that any NaN
  equals any NaN: a NaN's sign and payload are not part of the contract.
- A difference is attributed on values: each behaviour of the catalogue quantizes the same
  input, its result is dequantized and cast the same way, and it is named for the blocks
  whose every value it reproduces (``attribute_values``).

A fake-quant backend without ``gemm`` or ``linear`` gets its linears through the reference
Function with its ``fake_quantize`` in place of the oracle's quantizer
(``conformance._common.linear_of``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from mxcheck.assertions import NumericsError, check_bitwise
from mxcheck.conformance._common import fresh_state, values_problem
from mxcheck.conformance.overflow import overflow_lines
from mxcheck.diagnose.behaviour import Attribution, Behaviour, render_attributions
from mxcheck.diagnose.catalogue import QUANTIZE_BEHAVIOURS
from mxcheck.gemm import quantize_operand
from mxcheck.outcome import Outcome, say
from mxcheck.recipes import OperandSpec, Recipe

__all__ = ["VALUES_ROUNDING", "ValuesDiff", "attribute_values", "check_fake_quantize", "oracle_values", "same_nans",
           "value_blocks", "values_problem"]

# How the oracle's float32 values reach a narrower dtype the kernel returns: stated in every
# failure and in the contract.
VALUES_ROUNDING = "the oracle's float32 dequantized values cast to the kernel's dtype with round-to-nearest-even"
EXAMPLES = 4  # differing elements shown per comparison
ATTRIBUTED = 4  # differing comparisons attribution runs on (and the first of each input family)


def oracle_values(q: Any, dtype: torch.dtype) -> torch.Tensor:
    """The oracle's quantized operand ``q`` as values in ``dtype`` (float32 is exact; a
    narrower dtype rounds to nearest even)."""
    return q.dequantize().to(dtype)


def same_nans(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """``got`` with each NaN where ``want`` is NaN too replaced by ``want``'s bits: any NaN
    equals any NaN, so a NaN's sign and payload never count as a difference."""
    both = torch.isnan(got) & torch.isnan(want.to(got.device))
    return torch.where(both, want.to(got.device), got) if bool(both.any()) else got


def value_blocks(x: torch.Tensor, spec: OperandSpec) -> torch.Tensor:
    """The block (of the spec's scaling) each element of 2D ``x`` belongs to, as an int64
    index shaped like x: MX and NVFP4 1D blocks or 2D tiles, FP8 rows (tensor, row,
    delayed: a row is the unit shown) or 1x128 / 128x128 blocks."""
    rows, cols = x.shape
    r = torch.arange(rows).unsqueeze(1).expand(rows, cols)
    c = torch.arange(cols).unsqueeze(0).expand(rows, cols)
    if spec.scaling in ("mx", "nvfp4"):
        bs = spec.block_size
        return (r // bs if spec.block_2d else r) * (-(-cols // bs)) + c // bs
    if spec.scaling == "block1x128":
        return r * (-(-cols // 128)) + c // 128
    if spec.scaling == "block128x128":
        return (r // 128) * (-(-cols // 128)) + c // 128
    return r.clone()


@dataclass
class ValuesDiff:
    """One comparison of values (an operand copy on one input dtype and family)."""

    operand: str
    label: str
    spec: OperandSpec
    x: torch.Tensor
    oracle: Any  # the oracle's quantized tensor
    want: torch.Tensor  # its values in the kernel's dtype
    got: torch.Tensor
    differ: torch.Tensor = field(init=False)  # bool per element
    blocks: torch.Tensor = field(init=False)  # block index per element
    attributions: list[Attribution] = field(default_factory=list)
    unexplained: int = 0

    def __post_init__(self) -> None:
        self.differ = _bits(self.got) != _bits(self.want)
        self.blocks = value_blocks(self.x, self.spec)

    def differing_blocks(self) -> torch.Tensor:
        return torch.unique(self.blocks[self.differ])

    @property
    def unit(self) -> str:
        return "blocks" if self.spec.scaling in ("mx", "nvfp4", "block1x128", "block128x128") else "rows"


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).to(torch.int64)


def _per_block(mask: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    n = int(blocks.max()) + 1
    return torch.zeros(n, dtype=torch.int64).index_add_(0, blocks.flatten(), mask.flatten().to(torch.int64)) > 0


SCREEN_ROWS = 8  # rows holding differences a behaviour is first tried on; it runs on all only where it fits there


def _row_separable(spec: OperandSpec) -> bool:
    """Blocks lie within rows and a tensor-wide amax is kept by the anchor rows: 1D MX and
    NVFP4 blocks (not an NVFP4 rotation: its amax is taken after it), FP8 tensors, rows
    and 1x128 blocks (not delayed scaling: its history is the tensor's)."""
    if spec.scaling in ("mx", "nvfp4"):
        return not spec.block_2d and (spec.scaling == "mx" or spec.hadamard is None)
    return spec.scaling in ("tensor", "row", "block1x128")


def _anchor_rows(x: torch.Tensor) -> list[int]:
    """Rows that keep a tensor-wide amax what it is: the largest finite magnitude's, the first
    with a NaN, the first with an Inf."""
    a = x.abs().float()
    rows = [int(torch.where(torch.isfinite(a), a, 0).amax(dim=1).argmax())]
    for special in (torch.isnan(a), torch.isinf(a)):
        rows += special.any(dim=1).nonzero().flatten()[:1].tolist()
    return rows


@dataclass
class _Rows:
    x: torch.Tensor
    oracle: Any
    got: torch.Tensor
    blocks: torch.Tensor
    bad: torch.Tensor  # bool per block

    @classmethod
    def of(cls, x: torch.Tensor, oracle: Any, got: torch.Tensor, differ: torch.Tensor, spec: OperandSpec) -> _Rows:
        blocks = value_blocks(x, spec)
        return cls(x, oracle, got, blocks, _per_block(differ, blocks))

    def fit(self, b: Behaviour, spec: OperandSpec) -> tuple[torch.Tensor, int] | None:
        """(blocks of these rows whose every value b reproduces among the differing ones,
        right blocks b would change), or None where b does not apply."""
        try:
            q = b.run(self.x, spec, self.oracle)
            if q is None:
                return None
            theirs = same_nans(oracle_values(q, self.got.dtype), self.got)
        except (ValueError, TypeError, RuntimeError):  # a layout or input the behaviour cannot take
            return None
        if tuple(theirs.shape) != tuple(self.got.shape):
            return None
        wrong = _per_block(_bits(theirs) != _bits(self.got), self.blocks)
        return self.bad & ~wrong, int((~self.bad & wrong).sum())


def _screen(d: ValuesDiff) -> _Rows | None:
    if not _row_separable(d.spec):
        return None
    rows = torch.unique(d.differ.any(dim=1).nonzero().flatten())[:SCREEN_ROWS].tolist()
    rows = sorted(set(rows) | set(_anchor_rows(d.x)))
    if len(rows) >= d.x.shape[0]:
        return None
    x = d.x[rows]
    return _Rows.of(x, quantize_operand(x, d.spec), d.got[rows], d.differ[rows], d.spec)


def attribute_values(d: ValuesDiff, behaviours: tuple[Behaviour, ...], first: tuple[Behaviour, ...] = ()) -> None:
    """Name each quantize behaviour for the differing blocks whose every value it reproduces
    (the behaviour quantizes the same input, then its result is dequantized and cast as the
    oracle's is); skip one that changes at least as many blocks the kernel gets right. Each
    is screened on a few rows holding differences first (``first``: behaviours that explained
    another comparison, tried before the rest, unscreened)."""
    full = _Rows.of(d.x, d.oracle, d.got, d.differ, d.spec)
    screen = _screen(d)
    explained = torch.zeros_like(full.bad)
    order = [*first, *(b for b in behaviours if b not in first)]
    for b in (b for b in order if b.level == "quantize"):
        if not bool((full.bad & ~explained).any()):
            break
        if screen is not None and b not in first:
            fits = screen.fit(b, d.spec)
            if fits is None or not bool(fits[0].any()):
                continue
        fits = full.fit(b, d.spec)
        if fits is None:
            continue
        reproduced, changed = fits
        if not bool((reproduced & ~explained).any()) or changed >= int(reproduced.sum()):
            continue
        explained |= reproduced
        d.attributions.append(Attribution(b, int(reproduced.sum()), int(full.bad.sum()), d.unit, changed))
    d.unexplained = int((full.bad & ~explained).sum())


def _hex(v: torch.Tensor) -> str:
    width = 2 * v.element_size()
    return f"0x{int(_bits(v.reshape(1))[0]) & ((1 << (4 * width)) - 1):0{width}x}"


def _diagnose(d: ValuesDiff, attributed: bool) -> list[str]:
    """Report lines of one comparison: counts, attribution, the first differing elements."""
    n_blocks = int(d.blocks.max()) + 1
    bad = d.differing_blocks()
    lines = [f"{d.operand} ({d.label}): {int(d.differ.sum()):,} of {d.differ.numel():,} values differ, in "
             f"{len(bad):,} of {n_blocks:,} {d.unit}"]
    if attributed:
        lines += ["  " + line for line in render_attributions(d.attributions, len(bad), d.unexplained, d.unit)]
    for flat in d.differ.flatten().nonzero().flatten()[:EXAMPLES].tolist():
        row, col = divmod(flat, d.x.shape[1])
        x, g, w = (t.reshape(-1)[flat] for t in (d.x, d.got, d.want))
        lines.append(f"    [{row}, {col}] ({d.unit[:-1]} {int(d.blocks[row, col])}): input {_hex(x)} ({float(x)!r}): "
                     f"kernel {_hex(g)} ({float(g)!r}) | oracle {_hex(w)} ({float(w)!r})")
    return lines


def _report(diffs: list[ValuesDiff], compared: int, head: str) -> str:
    first = diffs[0]
    out = [f"{head}: {len(diffs)} of {compared} comparisons of values differ from the oracle, the first in "
           f"{first.operand} ({first.label}); compared bit for bit with {VALUES_ROUNDING}, any NaN equal to any NaN",
           *overflow_lines(diffs)]
    named: dict[str, list[int]] = {}
    for d in diffs:
        for a in d.attributions:
            named.setdefault(a.behaviour.describe(), [0, 0])
            named[a.behaviour.describe()][0] += a.reproduced
            named[a.behaviour.describe()][1] += a.differing
    examined = [d for d in diffs if d.attributions or d.unexplained]
    unexplained = sum(d.unexplained for d in examined)
    total = sum(len(d.differing_blocks()) for d in examined)
    if examined:
        out.append("cause:")
        out += [f"  {rep:,} of the {total:,} differing {first.unit} examined are reproduced by: {what}"
                for what, (rep, _) in sorted(named.items(), key=lambda kv: -kv[1][0])[:3]]
        if unexplained:
            out.append(f"  {unexplained:,} of the {total:,} differing {first.unit} examined are reproduced by no known "
                       "behaviour")
    for d in diffs:
        out += _diagnose(d, bool(d.attributions or d.unexplained))
    return "\n".join(out)


def _outcome(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, context: dict[str, Any]) -> Outcome:
    if problem := values_problem(got, x):
        return Outcome(None, False, say(problem, context), {"bit_equal": False, "passed": False})
    return check_bitwise(same_nans(got, want), want, None, context)


def check_fake_quantize(backend: Any, recipe: Recipe, numerics: Any = None, *,
                        inputs: Iterable[tuple[str, str, str, torch.Tensor]]) -> str | None:
    """The backend's ``fake_quantize`` of x_row and w_row equals the oracle's dequantized
    values bit for bit, on the inputs ``check_quantize`` feeds ``quantize`` (``inputs``:
    (family, operand, label, tensor), ``conformance.basic.quantize_inputs``); a failure counts
    each differing comparison, shows the first differing values and names the known
    behaviours that reproduce them."""
    ran, differing = 0, []
    for what, name, text, t in inputs:
        spec = recipe.spec(name)
        ours = quantize_operand(t, spec, **fresh_state(recipe, name))
        got = backend.fake_quantize(t, spec, **fresh_state(recipe, name))
        ran += 1
        want = oracle_values(ours, got.dtype if isinstance(got, torch.Tensor) else torch.float32)
        context = {"recipe": recipe.name, "layer": f"{name}.values ({text})", "direction": "quantize"}
        out = _outcome(got, want.to(got.device) if isinstance(got, torch.Tensor) else want, t, context)
        lines: list[str] = []
        if not out.passed:
            if values_problem(got, t):
                raise NumericsError(out.message)
            d = ValuesDiff(name, text, spec, t.detach().cpu(), _cpu(ours), want.cpu(),
                           same_nans(got.detach().cpu(), want.cpu()))
            # the first comparisons, and the first of each input family (another family
            # often shows another cause: zero signs, NaN policy)
            if len(differing) < ATTRIBUTED or all(not e.label.startswith(what + " ") for e in differing):
                first = tuple(a.behaviour for e in differing if e.spec == spec for a in e.attributions)
                attribute_values(d, QUANTIZE_BEHAVIOURS, tuple(dict.fromkeys(first)))
                lines = render_attributions(d.attributions, len(d.differing_blocks()), d.unexplained, d.unit)
            differing.append(d)
        if numerics is not None:
            message = out.message if out.passed else "\n".join([out.message, *lines])
            numerics.context(**context).record("bitwise", replace(out, message=message), got)
    if differing:
        raise NumericsError(_report(differing, ran, f"fake_quantize of recipe {recipe.name}, backend "
                                                   f"{getattr(backend, 'name', backend)}"))
    if not ran:
        return f"backend input_dtypes={getattr(backend, 'input_dtypes', None)} holds none of the input families' dtypes"
    return None


def _cpu(q: Any) -> Any:
    if not hasattr(q, "__dataclass_fields__"):
        return q
    moved = {f: getattr(q, f).cpu() for f in q.__dataclass_fields__ if isinstance(getattr(q, f), torch.Tensor)}
    return replace(q, **moved) if moved else q
