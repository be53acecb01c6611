"""Cause accuracy: a labelled set of buggy backends, each with its true cause, and how often
the failure's headline names it.

Each :class:`LabelledCase` is a backend with one bug (every ``known_bad`` backend, and seeded
cases modelled on released libraries), the check its bug fails, the class of publicly
reported quantizer defects it belongs to (``CLASSES``) and its true cause: a key of
``mxcheck.diagnose.CATALOGUE``, or a field relation's name ``"FIELD: KIND"`` (e.g.
``"tensor_scale: bf16_rne"``), or for an edge-shape bug the pattern its failure states.

A case is run as the conformance check runs it (same inputs, same attribution) and its
*headline* read: for a quantize failure, the behaviours ``diagnose.quantize.summary`` puts
first (exact in every comparison they touch, the most differing blocks reproduced; ties
all count); for a GEMM or linear failure, the behaviour of the first attribution line that
reproduces every differing output. Then, per class:

- *precision*: of the cases with a headline, the share not headed by a wrong cause (a
  headline naming only members of a true combination of conventions is not wrong; it is
  not the whole cause either, so it counts as a miss for recall);
- *recall*: of all cases, the share whose headline holds the true cause.

A case whose check passes, or whose headline is empty, is a miss (listed), never a wrong
cause. ``mxcheck accuracy`` runs every case and writes the record that docs/cause-accuracy.md
renders; the test suite runs ``QUICK`` on the input families that show each bug.
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.known_bad import KNOWN_BAD, _ProfileBug
from mxcheck.conformance import CHECKS, basic
from mxcheck.conformance.basic import DEFAULT_INPUT_DTYPES, quantize_inputs
from mxcheck.conformance.values import (
    ValuesDiff,
    attribute_values,
    carried_scales,
    reread_scales,
    values_comparison,
)
from mxcheck.diagnose import CATALOGUE
from mxcheck.diagnose import quantize as diagnose_quantize
from mxcheck.diagnose.catalogue import QUANTIZE_BEHAVIOURS
from mxcheck.recipes import get_recipe

__all__ = ["CASES", "CLASSES", "QUICK", "ClassScore", "LabelledCase", "Outcome", "headline", "run_case",
           "run_cases", "score"]

# The classes publicly reported against MX, NVFP4 and FP8 quantizers (41 reports, grouped),
# and the linear's own path (a seeded bug of the suite that is none of them).
CLASSES: dict[str, str] = {
    "exponent": "the exponent from an inexact log2 or frexp",
    "scale-rounding": "the scale's rounding rule",
    "narrow-scale": "scale arithmetic narrower than float32",
    "reciprocal": "a reciprocal (or encode factor) that overflows or underflows",
    "zero-blocks": "all-zero blocks (0/0, eps floors, the zero-block byte)",
    "specials": "NaN and Inf in the data",
    "edge-codes": "decoding edge codes (E8M0 0 and 255, E4M3 0x7F)",
    "element-rounding": "element rounding at ties, subnormals, double rounding",
    "mul-vs-div": "multiply by a reciprocal against divide",
    "packing": "packing order",
    "layouts": "layouts at shapes off the tile",
    "accumulation": "accumulation width",
    "linear-path": "the linear's own path (weights, bias, fallbacks)",
}


@dataclass(frozen=True)
class LabelledCase:
    """One buggy backend with its true cause. ``backend`` makes it; ``families``: the
    quantize input families the quick run feeds (all of them in the full run)."""

    name: str
    klass: str
    truth: str
    backend: Callable[[], Any]
    recipe: str
    check: str = "quantize"
    families: tuple[str, ...] = ()
    modelled_on: str = ""

    def __post_init__(self) -> None:
        if self.klass not in CLASSES:
            raise ValueError(f"case {self.name!r}: klass={self.klass!r}; expected one of {list(CLASSES)}")
        if self.check not in CHECKS:
            raise ValueError(f"case {self.name!r}: check={self.check!r}; expected one of {sorted(CHECKS)}")


def _known(name: str, klass: str, truth: str, recipe: str, check: str = "quantize",
           families: tuple[str, ...] = ()) -> LabelledCase:
    backend = KNOWN_BAD[name]
    return LabelledCase(name, klass, truth, backend, recipe, check, families,
                        (inspect.getdoc(backend) or "").split("\n")[0])


def _seeded(name: str, klass: str, truth: str, recipe: str, scaling: str, fields: dict[str, Any],
            families: tuple[str, ...], modelled_on: str) -> LabelledCase:
    """A backend quantizing ``scaling`` operands as the spec's own profile with ``fields``
    changed (the convention a released library has), the oracle elsewhere."""
    cls = type(f"Seeded_{name}", (_ProfileBug,), {"name": name, "scaling": scaling, "fields": dict(fields)})
    return LabelledCase(name, klass, truth, cls, recipe, "quantize", families, modelled_on)


_K_MOD_256 = "fails at every shape with K % 256 != 0 and at no shape with K % 256 == 0"

CASES: tuple[LabelledCase, ...] = (
    # every known_bad backend, with the check its bug fails
    _known("bad-nibble-swap", "packing", "gemm-fp4-nibble-swap", "mxfp4", "gemm"),
    _known("bad-scale-rule", "scale-rounding", "mx.scale_rule=floor", "mxfp4", families=("amax",)),
    _known("bad-stale-weight", "linear-path", "linear-stale-weight", "mxfp8", "weight_change"),
    _known("bad-bf16-fallback", "linear-path", "linear-bf16-unquantized", "mxfp4", "linear"),
    _known("bad-nan-to-zero", "specials", "linear-nan-flushed", "fp8", "nan"),
    _known("bad-drops-bias", "linear-path", "linear-bias-dropped", "mxfp8", "linear"),
    _known("bad-k-mod-256", "layouts", _K_MOD_256, "mxfp4", "edge_shapes"),
    _known("bad-half-away", "element-rounding", "mx.rounding=half_away", "mxfp4", families=("bf16",)),
    _known("bad-trunc", "element-rounding", "mx.rounding=trunc", "mxfp4", families=("bf16",)),
    _known("bad-log2-scale", "exponent", "mx.exponent_source=log2_fp32", "mxfp4", families=("amax",)),
    _known("bad-nvfp4-scale-threshold", "narrow-scale", "nvfp4_decoded_scale_threshold", "nvfp4",
           families=("magnitude",)),
    _known("bad-nvfp4-encode-input-dtype", "narrow-scale", "nvfp4_encode_scale_input_dtype", "nvfp4",
           families=("magnitude",)),
    _known("bad-nvfp4-encode-bf16", "narrow-scale", "nvfp4_encode_scale_bf16", "nvfp4", families=("magnitude",)),
    _known("bad-nvfp4-block-scale-bf16", "narrow-scale", "nvfp4_block_scale_bf16", "nvfp4",
           families=("magnitude",)),
    _known("bad-mx-scale-float16", "narrow-scale", "mx_scale_float16", "mxfp8", families=("magnitude",)),
    _known("bad-fp8-double-round", "element-rounding", "fp8_product_bf16", "fp8", families=("magnitude",)),
    _known("bad-even-mantissa", "scale-rounding", "mx.scale_mbits=1+mx.scale_rule=even", "mxfp8",
           families=("amax",)),
    _known("bad-nvfp4-eps-scale", "zero-blocks", "nvfp4.underflow_block_scale=2^-3", "nvfp4",
           families=("zeros", "magnitude")),
    _known("bad-nvfp4-nonfinite-scale-1", "specials", "nvfp4.nonfinite_tensor_scale=2^0", "nvfp4",
           families=("inf-nan",)),
    _known("bad-three-conventions", "scale-rounding",
           "mx.scale_rule=even & mx.inf_amax_byte=254 & mx.zero_sign=never", "mxfp8",
           families=("amax", "inf-nan", "bf16")),
    _known("bad-inf-block-127", "specials", "inf_block_byte_127", "mxfp8", families=("inf-nan",)),
    _known("bad-cuda-nan-code", "edge-codes", "canonical_nan_code", "fp8", families=("inf-nan",)),
    _known("bad-fast-accumulation", "accumulation", "gemm-reduced-accumulation", "fp8", "gemm"),
    _known("bad-below-tie", "element-rounding", "mx.half_away_sum=float32+mx.rounding=half_away", "mxfp4",
           families=("bf16",)),
    _known("bad-nvfp4-reciprocal-encode", "mul-vs-div", "nvfp4_encode_factor_reciprocal", "nvfp4",
           families=("magnitude",)),
    _known("bad-nvfp4-uncapped-encode", "reciprocal", "nvfp4_encode_factor_uncapped", "nvfp4",
           families=("magnitude",)),
    _known("bad-nvfp4-fp16-fallback", "reciprocal", "nvfp4_fp16_fallback_scale_1", "nvfp4",
           families=("magnitude",)),
    _known("bad-nvfp4-special-zero-block", "specials", "special_zeroes_block_finite_amax", "nvfp4",
           families=("inf-nan",)),
    _known("bad-mx-fp16-pow2-underflow", "reciprocal", "mx_divide_by_underflowed_pow2_float16", "mxfp8",
           families=("magnitude",)),
    _known("bad-mx-fp16-zero-block-nan", "zero-blocks", "mx_zero_block_nan_float16", "mxfp8",
           families=("zeros",)),
    _known("bad-mx-fp16-subnormal-amax", "exponent", "mx_subnormal_amax_float16", "mxfp8",
           families=("magnitude",)),
    _known("bad-zero-block-byte", "zero-blocks", "mx.zero_scale=85", "mxfp8", families=("zeros",)),
    _known("bad-fp16-log2-overflow", "exponent", "mx.exponent_source=log2_input", "mxfp8", families=("magnitude",)),
    _known("bad-fp8-rowwise-zero-eps", "zero-blocks", "fp8_eps_floor", "fp8-rowwise", families=("zeros",)),
    # values backends whose truth is a field relation on the block scale their values lie at
    _known("bad-mx-scale-floor-1e-10", "zero-blocks", "scale: constant 1e-10", "mxfp8", families=("magnitude",)),
    _known("bad-mx-scale-over-0.6", "scale-rounding", "scale: times 5/3", "mxfp8", families=("magnitude",)),
    _known("bad-mx-scale-floor", "zero-blocks", "mx_scale_floor_after_pow2", "ocp-mxfp8-e4m3", families=("amax",)),
    _known("bad-mx-scale-div-0.75", "scale-rounding", "mx_scale_divided_by_0.75", "ocp-mxfp4", families=("bf16",)),
    _known("bad-fp8-divide-amax-over-max", "mul-vs-div", "fp8_divide_by_amax_over_max", "fp8-tensorwise",
           families=("magnitude",)),
    _known("bad-mx-overflow-byte-127", "reciprocal", "mx_overflow_scale_byte_127", "mxfp8", families=("magnitude",)),
    # seeded cases: one convention of a released library each
    _seeded("seeded-log2-input", "exponent", "mx.exponent_source=log2_input", "mxfp8", "mx",
            {"exponent_source": "log2_input"}, ("bf16", "amax"), "torchao 0.7-0.9 to_mx on bf16 tensors"),
    _seeded("seeded-ceil-rule", "scale-rounding", "mx.scale_rule=ceil", "mxfp8", "mx", {"scale_rule": "ceil"},
            ("amax",), "torchao ScaleCalculationMode.CEIL"),
    _seeded("seeded-byte0-clamp", "edge-codes", "mx.subnormal_scale_clamp=2^-126", "mxfp8", "mx",
            {"subnormal_scale_clamp": 2.0**-126}, ("magnitude", "subnormals"),
            "torchao to_mx (byte-0 blocks divided by F32_MIN_NORMAL)"),
    _seeded("seeded-inf-byte-255", "edge-codes", "mx.inf_amax_byte=255", "mxfp8", "mx", {"inf_amax_byte": 255},
            ("inf-nan",), "microxcaling (an Inf block stores E8M0 NaN)"),
    _seeded("seeded-nvfp4-reciprocal-quotient", "mul-vs-div", "nvfp4.element_scale=reciprocal_quotient", "nvfp4",
            "nvfp4", {"element_scale": "reciprocal_quotient"}, ("magnitude",),
            "torchao 0.17+ nvfp4_quantize: x * ((1 / ts) / s)"),
    _seeded("seeded-nvfp4-bf16-scales", "narrow-scale", "nvfp4.scale_dtype=bfloat16", "nvfp4", "nvfp4",
            {"scale_dtype": "bfloat16"}, ("magnitude",), "NVFP4 scale arithmetic in bf16"),
    _seeded("seeded-fp8-input-multiply", "narrow-scale", "tensor.multiply_dtype=input", "fp8", "tensor",
            {"multiply_dtype": "input"}, ("magnitude",), "torchao 0.5 _ToFloat8ConstrFunc"),
    _seeded("seeded-nvfp4-zero-sign", "element-rounding", "nvfp4.zero_sign=negative_values", "nvfp4", "nvfp4",
            {"zero_sign": "negative_values"}, ("neg-zero", "bf16"), "TE reference_nvfp4.py, ModelOpt _cast_fp4"),
    # compressed-tensors 0.20 (helpers.py generate_gparam, calculate_qparams): scale arithmetic in the input's dtype
    _seeded("seeded-nvfp4-input-dtype-factor", "narrow-scale", "nvfp4.encode_factor=input_dtype", "nvfp4", "nvfp4",
            {"encode_factor": "input_dtype"}, ("magnitude",), "compressed-tensors 0.20 generate_gparam"),
    _seeded("seeded-nvfp4-input-dtype-block-quotient", "narrow-scale", "nvfp4.block_scale=factor_times_input_quotient",
            "nvfp4", "nvfp4", {"block_scale": "factor_times_input_quotient"}, ("magnitude",),
            "compressed-tensors 0.20 calculate_qparams"),
    _seeded("seeded-fp8-input-dtype-quotient", "narrow-scale", "tensor.scale_arithmetic=input_quotient", "fp8",
            "tensor", {"scale_arithmetic": "input_quotient"}, ("magnitude",),
            "compressed-tensors 0.20 calculate_qparams, _quantize"),
    _seeded("seeded-mx-zero-negative", "element-rounding", "mx.zero_sign=zero_negative", "mxfp8", "mx",
            {"zero_sign": "zero_negative"}, ("zeros", "one-nonzero"), "ModelOpt 0.46-0.47 MXFP4 cast_fp4"),
)

# Cases modelled on AMD Quark 0.12-0.13's residuals (wt-quark): its MX floor scale held as a
# float, its FP8 dequantization scale amax / 448 in the input's dtype, its NVFP4 eps fill.
CASES += (
    _known("bad-mx-float-scale", "narrow-scale", "mx.scale_storage=input_dtype", "mxfp4-1x32",
           families=("subnormals",)),
    _seeded("seeded-fp8-descale-input-dtype", "mul-vs-div", "tensor.descale=quotient_input", "fp8", "tensor",
            {"descale": "quotient_input"}, ("magnitude",), "amd-quark FP8E4M3PerTensorSpec: x / (amax / 448)"),
    _seeded("seeded-nvfp4-zero-scale-eps", "zero-blocks", "nvfp4.zero_scale_fill=2^-23+nvfp4.block_scale=quotient",
            "nvfp4", "nvfp4", {"block_scale": "quotient", "zero_scale_fill": 2.0**-23}, ("zeros", "magnitude"),
            "amd-quark nvfp4 scheme: scale.masked_fill(scale == 0, eps)"),
)

QUICK: tuple[str, ...] = ("bad-nvfp4-reciprocal-encode", "bad-nvfp4-uncapped-encode", "bad-zero-block-byte")
"""The cases the CPU test suite runs (on their families): the two wrong causes the issue
measured, and the cheapest of the new vocabulary (the zero-block byte)."""


def headline(diffs: list[Any]) -> tuple[str, ...]:
    """What a quantize failure names first (as ``diagnose.quantize.summary``): the field
    relations (their names, ``FIELD: KIND``) where they state more differing blocks than any
    behaviour reproduces; else the behaviours exact in every comparison where they fit, weaker
    in none, with the most blocks reproduced (ties all)."""
    diagnose_quantize.reconcile(diffs)
    ranked, _ = diagnose_quantize.ranked_causes(diffs)
    top = ranked[0][1] if ranked else 0
    relations, stated = diagnose_quantize.relation_summary(diffs)
    if relations and stated > top:
        return tuple(r.name for r in relations[:diagnose_quantize.RELATIONS_SHOWN])
    return tuple(sorted(b.key for b, n, _ in ranked if n == top and n > 0))


def is_relation(name: str) -> bool:
    """A headline entry that is a field relation (``FIELD: KIND``), not a behaviour's key."""
    return ": " in name


_REPRODUCED = re.compile(r"^\s*([\d,]+) of ([\d,]+) differing (?:blocks|rows|outputs|forward outputs) are "
                         r"reproduced by: (.*)$", re.M)


def _message_headline(message: str, truth: str) -> tuple[str, ...]:
    """The behaviour of the first attribution line of a GEMM or linear failure that reproduces
    every differing output (the text those checks raise holds the attribution), or the edge
    shapes' stated pattern."""
    if truth not in CATALOGUE and " & " not in truth:
        return (truth,) if truth in message else ()
    for reproduced, differing, text in _REPRODUCED.findall(message):
        if reproduced != differing:
            continue
        named = [k for k, b in CATALOGUE.items() if b.level != "quantize" and text.startswith(b.describe())]
        if named:
            return (max(named, key=lambda k: len(CATALOGUE[k].describe())),)
    return ()


@dataclass(frozen=True)
class Outcome:
    """What one case's failure headed with. ``failed``: the check failed at all."""

    case: str
    klass: str
    truth: str
    failed: bool
    headline: tuple[str, ...]
    seconds: float  # wall-clock
    cpu_seconds: float = 0.0  # this process's CPU time (steadier on a shared machine)

    @property
    def named(self) -> bool:
        return self.truth in self.headline

    @property
    def partial(self) -> bool:
        """The headline names only members of the true combination (true, not all of it: two of
        a kernel's three conventions, on inputs where the third changes nothing)."""
        members = set(self.truth.split(" & "))
        return bool(self.headline) and not self.named and all(set(h.split(" & ")) <= members for h in self.headline)

    @property
    def wrong(self) -> bool:
        """Headed by a behaviour that is not the true cause. A field relation states exactly
        what differs (it reproduces every entry it covers), so a headline of relations alone is
        never a wrong cause: it is a miss where the truth is a behaviour."""
        return (bool(self.headline) and not self.named and not self.partial
                and not all(is_relation(h) for h in self.headline))


def _quantize_diffs(case: LabelledCase, quick: bool) -> tuple[list[Any], bool]:
    """The differing comparisons of check_quantize on the case's backend (its families only
    when ``quick``), each attributed as the check does; and whether any tensor is lost."""
    backend, recipe = case.backend(), get_recipe(case.recipe)
    accepted = tuple(getattr(backend, "input_dtypes", DEFAULT_INPUT_DTYPES))
    differing: list[Any] = []
    verdicts: list[Any] = []
    for family, name, label, t in quantize_inputs(recipe, torch.Generator().manual_seed(0), accepted, "cpu"):
        if quick and case.families and family not in case.families:
            continue  # the generator still drew it: the inputs kept are the check's own
        if hasattr(backend, "quantize"):
            basic._quantize_one(backend, recipe, name, t, label, None, differing, verdicts)
        else:  # a values backend: its values judged and attributed as check_fake_quantize does
            d = values_comparison(backend, recipe, name, t, label)
            if d is not None:
                d.known_scales = carried_scales(differing, d.spec)
                attribute_values(d, QUANTIZE_BEHAVIOURS)
                differing.append(d)
                verdicts += [d.verdict] if d.verdict is not None and not d.verdict.passed else []
    reread_scales([d for d in differing if isinstance(d, ValuesDiff)])
    return differing, bool(verdicts)


def run_case(case: LabelledCase, *, quick: bool = False) -> Outcome:
    """Run the case's check as conformance does and read its headline."""
    start, cpu = time.perf_counter(), time.process_time()
    if case.check == "quantize":
        diffs, lost = _quantize_diffs(case, quick)
        failed, named = bool(diffs) or lost, headline(diffs)
    else:
        try:
            CHECKS[case.check](case.backend(), get_recipe(case.recipe), torch.Generator().manual_seed(0))
            failed, named = False, ()
        except NumericsError as e:
            failed, named = True, _message_headline(str(e), case.truth)
    return Outcome(case.name, case.klass, case.truth, failed, named, round(time.perf_counter() - start, 2),
                   round(time.process_time() - cpu, 2))


def run_cases(cases: Iterable[LabelledCase] = CASES, *, quick: bool = False,
              progress: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    out = []
    for case in cases:
        out.append(run_case(case, quick=quick))
        if progress is not None:
            progress(out[-1])
    return out


@dataclass(frozen=True)
class ClassScore:
    klass: str
    cases: int
    headed: int  # cases whose failure names any headline
    named: int  # headline holds the true cause (a part of a true combination is a miss, not wrong)
    misses: tuple[str, ...] = field(default=())
    wrong: tuple[str, ...] = field(default=())

    @property
    def precision(self) -> float:
        return 1.0 - len(self.wrong) / self.headed if self.headed else 1.0

    @property
    def recall(self) -> float:
        return self.named / self.cases if self.cases else 1.0


def score(outcomes: Iterable[Outcome]) -> list[ClassScore]:
    """Per class (in ``CLASSES`` order, classes with cases only), then a total row."""
    outcomes = list(outcomes)
    rows = []
    for klass in [*CLASSES, "total"]:
        mine = [o for o in outcomes if klass in (o.klass, "total")]
        if not mine:
            continue
        rows.append(ClassScore(klass, len(mine), sum(bool(o.headline) for o in mine), sum(o.named for o in mine),
                               tuple(o.case for o in mine if not o.named and not o.wrong),
                               tuple(o.case for o in mine if o.wrong)))
    return rows


def record(outcomes: list[Outcome], *, quick: bool) -> dict[str, Any]:
    """A JSON-able record of a run (what docs/cause-accuracy.md renders)."""
    return {"quick": quick, "cases": [asdict(o) for o in outcomes],
            "seconds": round(sum(o.seconds for o in outcomes), 1),
            "cpu_seconds": round(sum(o.cpu_seconds for o in outcomes), 1)}


def outcomes_of(data: dict[str, Any]) -> list[Outcome]:
    return [Outcome(**{**c, "headline": tuple(c["headline"])}) for c in data["cases"]]


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def scores_table(outcomes: list[Outcome]) -> list[tuple[str, ...]]:
    """Rows (header first): per class, cases, headed, named, precision, recall, misses, wrong."""
    rows = [("class", "cases", "headed", "true cause named", "precision", "recall", "missed", "wrong headline")]
    for s in score(outcomes):
        rows.append((s.klass if s.klass == "total" else f"{s.klass}: {CLASSES[s.klass]}", str(s.cases),
                     str(s.headed), str(s.named), _pct(s.precision), _pct(s.recall),
                     ", ".join(s.misses) or "-", ", ".join(s.wrong) or "-"))
    return rows


def cases_table(outcomes: list[Outcome] | None = None) -> list[tuple[str, ...]]:
    """Rows (header first): every labelled case, its class, true cause, and (with outcomes) the
    headline its failure gave."""
    got = {o.case: o for o in outcomes or ()}
    rows = [("case", "class", "true cause", "check", "headline", "CPU seconds")]
    for c in CASES:
        o = got.get(c.name)
        head = "not run" if o is None else ("check passed" if not o.failed else ", ".join(o.headline) or "none")
        rows.append((c.name, c.klass, c.truth, f"{c.check} ({c.recipe})", head, "-" if o is None else f"{o.cpu_seconds:g}"))
    return rows
