"""Fake-quant backends: kernels that return values, not codes, judged on those values.

A backend may offer ``fake_quantize(x, spec, *, state=None) -> Tensor`` instead of (or beside)
``quantize``: the quantized-then-dequantized values of the 2D operand ``x`` along its last
axis, shaped like ``x``, in ``x``'s dtype or float32 (what QAT toolkits and the fake-quant
kernels of a training step return). The contract (docs/backends.md, "Fake-quant backends"):

- The oracle's values are ``quantize_operand(x, spec).dequantize()``, in the rotated basis
  where the spec rotates: MX and FP8 values are one product (exact for MX), NVFP4's the
  exact product ``e2m1 * s * amax / 2688`` rounded once. They are cast to the dtype the
  kernel returned with torch's ``Tensor.to`` (round to nearest, ties to even).
- One judge, ``values_agree``: a kernel's value agrees with a quantized tensor where its
  bits are the oracle's value's (any NaN equal to any NaN: a NaN's sign and payload are not
  part of the contract) or, for NVFP4, where it is finite, has the oracle value's sign and
  lies within the spread of the float32 orders released libraries dequantize in
  (``DEQUANT_ORDERS``, each cast the same way). A kernel whose codes and scales are the
  oracle's passes whatever legitimate order it uses; one code or one block scale off moves
  a value by at least 1/16 of itself, far outside that spread, and fails.
- A difference is attributed on values with the same judge: each behaviour of the catalogue
  quantizes the same input and is named for the blocks whose every value agrees with its
  result (``attribute_values``): every fit is kept, and only an exact one heads the text.
- Each input where a value differs gets the tensor-level verdict on values
  (``conformance.verdict.values_verdict``): a kernel that loses the tensor says so first.

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
from mxcheck.conformance.values_judge import (
    DEQUANT_ORDERS,
    dequant_spread,
    infer_codes,
    oracle_values,
    same_nans,
    values_agree,
    values_bits,
)
from mxcheck.conformance.values_relations import READINGS, relate_values
from mxcheck.conformance.verdict import TensorVerdict, lost_lines, values_verdict
from mxcheck.diagnose import quantize as diagnose_quantize
from mxcheck.diagnose.behaviour import Attribution, Behaviour
from mxcheck.diagnose.catalogue import QUANTIZE_BEHAVIOURS
from mxcheck.diagnose.dump import dump_dir, write_dump
from mxcheck.diagnose.relations import Relation
from mxcheck.gemm import quantize_operand
from mxcheck.outcome import Outcome, say
from mxcheck.recipes import OperandSpec, Recipe

__all__ = ["DEQUANT_ORDERS", "VALUES_ROUNDING", "KernelValues", "ValuesDiff", "attribute_values", "carried_scales",
           "check_fake_quantize", "dequant_spread", "infer_codes", "oracle_values", "quantized_on_cpu", "reread_scales",
           "same_nans", "value_blocks", "values_agree", "values_problem", "values_report"]

# How the oracle's float32 values reach a narrower dtype the kernel returns: stated in every
# failure and in the contract.
VALUES_ROUNDING = "the oracle's float32 dequantized values cast to the kernel's dtype with round-to-nearest-even"
ORDERS_ACCEPTED = "an NVFP4 value anywhere within the spread of the released float32 dequantization orders"
EXAMPLES = 4  # differing elements shown per comparison
ATTRIBUTED = 4  # differing comparisons attribution runs on (and the first of each input family)

_NO_SCALES = torch.zeros(0, dtype=torch.float64)


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


@dataclass(frozen=True)
class KernelValues:
    """A values kernel's result as a dump holds it: its values, and the codes they say it wrote."""

    codes: torch.Tensor
    values: torch.Tensor


@dataclass
class ValuesDiff:
    """One comparison of values (an operand copy on one input dtype and family). ``got`` is
    the kernel's values as it returned them; ``differ`` is where they disagree with the
    oracle (``values_agree``)."""

    operand: str
    label: str
    spec: OperandSpec
    x: torch.Tensor
    oracle: Any  # the oracle's quantized tensor
    want: torch.Tensor  # its values in the kernel's dtype
    got: torch.Tensor
    differ: torch.Tensor | None = None  # bool per element (values_agree's, when not given)
    blocks: torch.Tensor = field(init=False)  # block index per element
    attributions: list[Attribution] = field(default_factory=list)
    unexplained: int = 0
    verdict: TensorVerdict | None = None
    relations: list[Relation] = field(default_factory=list)  # where no behaviour reproduces every block
    stated: torch.Tensor | None = None  # bool per block: a field relation states it
    # (block scales, ratios to the oracle's) that are not powers of two and that earlier
    # comparisons of the check found shared by several blocks (values_relations.shared_scales)
    known_scales: tuple[torch.Tensor, torch.Tensor] = field(default_factory=lambda: (_NO_SCALES, _NO_SCALES))
    scales_read: tuple[torch.Tensor, torch.Tensor] | None = None  # the known_scales its relations were read with

    def __post_init__(self) -> None:
        if self.differ is None:
            self.differ = ~values_agree(self.got, self.oracle, self.want)
        self.blocks = value_blocks(self.x, self.spec)

    def differing_blocks(self) -> torch.Tensor:
        return torch.unique(self.blocks[self.differ])

    @property
    def n_examined(self) -> int:
        """Differing blocks attribution ran on (``diagnose.quantize.summary`` reads it)."""
        return len(self.differing_blocks())

    # What ``diagnose.dump.write_dump`` reads of a comparison, as a QuantizeDiff holds it.
    @property
    def differing(self) -> torch.Tensor:
        """bool per block: some value of it differs."""
        return _per_block(self.differ, self.blocks)

    @property
    def n_differing(self) -> int:
        return int(self.differing.sum())

    @property
    def n_blocks(self) -> int:
        return int(self.blocks.max()) + 1

    @property
    def kinds(self) -> dict[tuple[str, ...], torch.Tensor]:
        return {("values",): self.differing}

    examined = explained = fit = None  # every differing block is examined; no per-block explanation kept
    problem = ""  # a values comparison is kept only where the values have the input's shape
    counts: tuple = ()
    readings = READINGS  # the fields its relations read the values as (each differs where values do)

    def field_relations(self) -> tuple[list[Relation], torch.Tensor]:
        """What differs, stated exactly (``values_relations.relate_values``)."""
        self.scales_read = self.known_scales
        return relate_values(self)

    @property
    def kernel(self) -> KernelValues:
        """The kernel's values, with the codes they say it wrote under the oracle's scales
        (``infer_codes``; 0xFF where no code gives the value)."""
        return KernelValues(codes=infer_codes(self.got, self.oracle), values=self.got)

    @property
    def unit(self) -> str:
        return "blocks" if self.spec.scaling in ("mx", "nvfp4", "block1x128", "block128x128") else "rows"

    def count(self, b: Behaviour) -> None:
        """Run one behaviour on every row and record it as ``attribute_values`` does
        (``diagnose.quantize.reconcile`` asks for a combination named in another comparison)."""
        _record_fit(self, b, _Rows.of(self.x, self.oracle, self.got, self.differ, self.spec))


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
        """(blocks of these rows whose every value agrees with b's result among the differing
        ones, right blocks b would change), or None where b does not apply."""
        try:
            q = b.run(self.x, spec, self.oracle)
            if q is None:
                return None
            if tuple(oracle_values(q, self.got.dtype).shape) != tuple(self.got.shape):
                return None
            wrong = _per_block(~values_agree(self.got, q), self.blocks)
        except (ValueError, TypeError, RuntimeError):  # a layout or input the behaviour cannot take
            return None
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
    """Every quantize behaviour that reproduces some differing blocks (every value of the
    block agrees with its result under ``values_agree``) and changes fewer right blocks than
    it reproduces, as an Attribution: the best fits, not the first cover (a weaker fit such
    as another scale rule that also changes right blocks is kept, and ``render_attributions``
    lets only an exact one head). Each is screened on a few rows holding differences first
    (``first``: behaviours that explained another comparison, unscreened). ``unexplained``:
    differing blocks no fit reproduces."""
    full = _Rows.of(d.x, d.oracle, d.got, d.differ, d.spec)
    screen = _screen(d)
    explained = torch.zeros_like(full.bad)
    order = [*first, *(b for b in behaviours if b not in first)]
    for b in (b for b in order if b.level == "quantize"):
        if screen is not None and b not in first:
            fits = screen.fit(b, d.spec)
            if fits is None or not bool(fits[0].any()):
                continue
        reproduced = _record_fit(d, b, full)
        if reproduced is not None:
            explained |= reproduced
    d.unexplained = int((full.bad & ~explained).sum())
    # what differs, stated exactly, unless one behaviour reproduces every block (as the codes path)
    if not any(a.reproduced == d.n_examined and not a.also_changes for a in d.attributions):
        d.relations, d.stated = d.field_relations()


def carried_scales(earlier: list[ValuesDiff], spec: OperandSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The non-power-of-two block scales (and ratios) earlier comparisons of ``spec`` found
    shared, for the next comparison's scale reading (it then covers blocks whose values
    are all 0 at that scale: one such block alone fixes no scale)."""
    return next((e.known_scales for e in reversed(earlier) if e.spec == spec), (_NO_SCALES, _NO_SCALES))


def reread_scales(diffs: list[ValuesDiff]) -> None:
    """Once every comparison of a check is attributed, restate the relations of those read
    before a later comparison found a shared non-power-of-two scale, with every scale the
    check found for their spec (the input families run in a fixed order; a family whose
    differing blocks are all 0 at that scale comes before the one that fixes it)."""
    every: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for d in diffs:
        mine = [e.known_scales for e in diffs if e.spec == d.spec]
        every[id(d)] = tuple(torch.unique(torch.cat([k[i] for k in mine])) for i in range(2))
    for d in diffs:
        every_scale = every[id(d)]
        if d.scales_read is None:  # not attributed: the summary reads it later, with every scale
            d.known_scales = every_scale
            continue
        if all(r.field == "scale" for r in d.relations) and bool(d.stated[d.differing].all()):
            continue  # every block stated by a scale already
        if any(not bool(torch.isin(every_scale[i], d.scales_read[i]).all()) for i in range(2)):
            d.known_scales = every_scale
            d.relations, d.stated = d.field_relations()


def _record_fit(d: ValuesDiff, b: Behaviour, rows: _Rows) -> torch.Tensor | None:
    """Record b on d where it reproduces some differing blocks of ``rows`` and changes fewer
    right ones than it reproduces; the blocks it reproduces, or None."""
    fits = rows.fit(b, d.spec)
    if fits is None:
        return None
    reproduced, changed = fits
    if not bool(reproduced.any()) or changed >= int(reproduced.sum()):
        return None
    d.attributions.append(Attribution(b, int(reproduced.sum()), int(rows.bad.sum()), d.unit, changed))
    return reproduced


def _hex(v: torch.Tensor) -> str:
    width = 2 * v.element_size()
    return f"0x{int(values_bits(v.reshape(1))[0]) & ((1 << (4 * width)) - 1):0{width}x}"


def _diagnose(d: ValuesDiff, attributed: bool) -> list[str]:
    """Report lines of one comparison: counts, attribution, the first differing elements."""
    n_blocks = int(d.blocks.max()) + 1
    bad = d.differing_blocks()
    lines = [f"{d.operand} ({d.label}): {int(d.differ.sum()):,} of {d.differ.numel():,} values differ, in "
             f"{len(bad):,} of {n_blocks:,} {d.unit}"]
    if attributed:
        lines += ["  " + line for line in diagnose_quantize.cause_lines(d)]
    for flat in d.differ.flatten().nonzero().flatten()[:EXAMPLES].tolist():
        row, col = divmod(flat, d.x.shape[1])
        x, g, w = (t.reshape(-1)[flat] for t in (d.x, d.got, d.want))
        lines.append(f"    [{row}, {col}] ({d.unit[:-1]} {int(d.blocks[row, col])}): input {_hex(x)} ({float(x)!r}): "
                     f"kernel {_hex(g)} ({float(g)!r}) | oracle {_hex(w)} ({float(w)!r})")
    return lines


def values_report(diffs: list[ValuesDiff], compared: int, head: str) -> str:
    """The failure message of a values check: the summary (``diagnose.quantize.summary``, the
    rule the codes path uses: only an exact fit is named a cause, its counts the sum of the
    per-comparison lines), then each comparison's counts, attribution and first values."""
    first = diffs[0]
    out = [f"{head}: {len(diffs)} of {compared} comparisons of values differ from the oracle, the first in "
           f"{first.operand} ({first.label}); compared bit for bit with {VALUES_ROUNDING}, any NaN equal to any NaN"
           + (f", {ORDERS_ACCEPTED}" if first.spec.scaling == "nvfp4" else ""),
           *overflow_lines(diffs)]
    examined = [d for d in diffs if d.attributions or d.unexplained]
    if examined:
        out += ["cause:", *("  " + line for line in diagnose_quantize.summary(examined))]
    for d in diffs:
        out += _diagnose(d, bool(d.attributions or d.unexplained))
    return "\n".join(out)


def _outcome(got: torch.Tensor, differ: torch.Tensor | None, want: torch.Tensor, x: torch.Tensor,
             context: dict[str, Any]) -> Outcome:
    if problem := values_problem(got, x):
        return Outcome(None, False, say(problem, context), {"bit_equal": False, "passed": False})
    # every value the judge accepts counts as the oracle's (an NVFP4 value in another legitimate order)
    judged = torch.where(differ.to(got.device), got, want.to(got.device))
    return check_bitwise(judged, want, None, context)


def values_comparison(backend: Any, recipe: Recipe, name: str, t: torch.Tensor, text: str) -> ValuesDiff | None:
    """The backend's values of operand ``name`` on input ``t`` against the oracle's, on the
    CPU, with the tensor-level verdict; None where every value agrees (or the values are
    not the input's shape, which check_fake_quantize reports)."""
    spec = recipe.spec(name)
    ours = quantize_operand(t, spec, **fresh_state(recipe, name))
    got = backend.fake_quantize(t, spec, **fresh_state(recipe, name))
    if values_problem(got, t):
        return None
    want = oracle_values(ours, got.dtype)
    differ = ~values_agree(got, ours, want)
    if not bool(differ.any()):
        return None
    d = ValuesDiff(name, text, spec, t.detach().cpu(), quantized_on_cpu(ours), want.cpu(), got.detach().cpu(), differ)
    d.verdict = values_verdict(d.x, spec, d.oracle, d.got, operand=name)
    return d


def check_fake_quantize(backend: Any, recipe: Recipe, numerics: Any = None, *,
                        inputs: Iterable[tuple[str, str, str, torch.Tensor]]) -> str | None:
    """The backend's ``fake_quantize`` of x_row and w_row agrees with the oracle's values
    (``values_agree``), on the inputs ``check_quantize`` feeds ``quantize`` (``inputs``:
    (family, operand, label, tensor), ``conformance.basic.quantize_inputs``); a failure counts
    each differing comparison, shows the first differing values and names the known
    behaviours that reproduce them. Each input where a value differs also gets the
    tensor-level verdict on values (an SNR record); a kernel that loses the tensor heads the
    failure with that line, as on the codes path."""
    ran, differing, verdicts = 0, [], []
    for what, name, text, t in inputs:
        spec = recipe.spec(name)
        ours = quantize_operand(t, spec, **fresh_state(recipe, name))
        got = backend.fake_quantize(t, spec, **fresh_state(recipe, name))
        ran += 1
        want = oracle_values(ours, got.dtype if isinstance(got, torch.Tensor) else torch.float32)
        context = {"recipe": recipe.name, "layer": f"{name}.values ({text})", "direction": "quantize"}
        if values_problem(got, t):
            out = _outcome(got, None, want, t, context)
            if numerics is not None:
                numerics.context(**context).record("bitwise", out, None)
            raise NumericsError(out.message)
        differ = ~values_agree(got, ours, want)
        # a comparison is kept (on the CPU) only where a value differs
        d = None if not bool(differ.any()) else ValuesDiff(
            name, text, spec, t.detach().cpu(), quantized_on_cpu(ours), want.cpu(), got.detach().cpu(), differ)
        out = _outcome(got, differ, want, t, context)
        lines: list[str] = []
        if d is not None:
            d.verdict = values_verdict(d.x, spec, d.oracle, d.got, operand=name)
            if d.verdict is not None:
                verdicts.append((d.verdict, text))
            # the first comparisons, and the first of each input family (another family
            # often shows another cause: zero signs, NaN policy)
            if len(differing) < ATTRIBUTED or all(not e.label.startswith(what + " ") for e in differing):
                first = tuple(a.behaviour for e in differing if e.spec == spec for a in e.attributions)
                d.known_scales = carried_scales(differing, spec)
                attribute_values(d, QUANTIZE_BEHAVIOURS, tuple(dict.fromkeys(first)))
                lines = diagnose_quantize.cause_lines(d)
            differing.append(d)
        if numerics is not None:
            message = out.message if out.passed else "\n".join([out.message, *lines])
            # structured field relations for the JSON report, as the codes path records them
            relations = [r.to_json() for r in d.relations] if d is not None else []
            fields = out.fields if out.passed or not relations else \
                {**out.fields, "extra": {**out.fields.get("extra", {}), "relations": relations}}
            numerics.context(**context).record("bitwise", replace(out, message=message, fields=fields), got)
            if d is not None and d.verdict is not None:
                numerics.context(**{**context, "layer": f"{name} tensor values ({text})"}).record(
                    "snr", Outcome(None, d.verdict.passed, d.verdict.line(), d.verdict.record_fields()))
    if differing:
        reread_scales(differing)
        if (where := dump_dir()) is not None:  # every differing block, beyond the summary
            write_dump(where, differing, f"fake_quantize-{recipe.name}-{getattr(backend, 'name', 'backend')}")
        head = f"fake_quantize of recipe {recipe.name}, backend {getattr(backend, 'name', backend)}"
        raise NumericsError("\n".join([*lost_lines(verdicts, ran), values_report(differing, ran, head)]))
    if not ran:
        return f"backend input_dtypes={getattr(backend, 'input_dtypes', None)} holds none of the input families' dtypes"
    return None


def quantized_on_cpu(q: Any) -> Any:
    """A quantized tensor with every tensor field on the CPU (anything else unchanged)."""
    if not hasattr(q, "__dataclass_fields__"):
        return q
    moved = {f: getattr(q, f).cpu() for f in q.__dataclass_fields__ if isinstance(getattr(q, f), torch.Tensor)}
    return replace(q, **moved) if moved else q
