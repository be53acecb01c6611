"""Where two profiles give different bits, and the divergences of section 8 (and later ones).

``divergence(a, b)`` quantizes every class of a battery of generated inputs with both
profiles and counts, per class, the blocks whose scale byte differs and the elements whose
code differs, with a few example blocks. ``DIVERGENCE_TABLE`` has one row per case of
research/reference_emulators.md section 8 (rows 1-20; rows after them were found here) and
says how mxcheck reaches it: a profile option, a pinned test, or why it cannot, and which
witness versions behave how where a witness changed. A report names the rows its
differences show.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from mxcheck.formats import FloatFormat, decode_table
from mxcheck.profiles import QUIRK_FIELDS, Profile, get_profile
from mxcheck.scaling.blocks import block_amax
from mxcheck.text import table

__all__ = ["DIVERGENCE_TABLE", "INPUTS", "Case", "ClassResult", "DivergenceReport", "Example",
           "battery", "cases_for", "divergence", "table_json", "table_text"]

_R, _B = 128, 4  # rows per class and 32-blocks per row: 512 blocks, 16384 elements


# ---- the battery: (generator, element format) -> float32 (or bf16) tensor (128, 128) ----


def _exp2(k: torch.Tensor) -> torch.Tensor:
    return torch.ldexp(torch.ones(k.shape), k.float())


def _k(gen: torch.Generator, lo: int = -20, hi: int = 20) -> torch.Tensor:
    return torch.randint(lo, hi + 1, (_R, _B, 1), generator=gen)


def _signs(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.where(torch.rand(*shape, generator=gen) < 0.5, -1.0, 1.0)


def _plant(gen: torch.Generator, amax: torch.Tensor, rest: torch.Tensor | None = None) -> torch.Tensor:
    """Blocks of ``rest`` (default: uniform in +-0.9 amax) with one element at +-amax."""
    x = (torch.rand(_R, _B, 32, generator=gen) * 1.8 - 0.9) * amax if rest is None else rest
    where = torch.randint(0, 32, (_R, _B, 1), generator=gen)
    return x.scatter(-1, where, _signs(gen, _R, _B, 1) * amax).flatten(-2)


def _near(x: torch.Tensor, toward: float) -> torch.Tensor:
    return torch.nextafter(x, torch.full_like(x, toward))


def _amax_above_max(gen, fmt):
    top = fmt.max * _exp2(_k(gen))  # even blocks nextabove(top), odd ones inside (top, 2^(emax+1+k))
    inside = top * (1 + torch.rand(top.shape, generator=gen) * (2.0 ** (fmt.emax + 1) / fmt.max - 1))
    return _plant(gen, torch.where(torch.arange(_B).view(1, -1, 1) % 2 == 0, _near(top, math.inf), inside))


def _amax_even_band(gen, fmt):
    low = 2.0 - 2.0 ** -(fmt.mbits + 1)  # "even" bumps these amax a binade up
    sig = torch.where(torch.rand(_R, _B, 1, generator=gen) < 0.5, low,
                      low + torch.rand(_R, _B, 1, generator=gen) * (2 - low)).clamp(max=_near(torch.tensor(2.0), 0))
    return _plant(gen, sig * _exp2(_k(gen)))


def _ties(gen, fmt):
    pos = decode_table(fmt).float()
    pos = pos[torch.isfinite(pos) & (pos >= 0)].unique()
    mids = (pos[1:] + pos[:-1]) / 2
    x = mids[torch.randint(0, len(mids), (_R, _B, 32), generator=gen)] * _signs(gen, _R, _B, 32)
    x[..., 0] = fmt.max  # pins the scale at 2^k under every rule
    return (x * _exp2(_k(gen))).flatten(-2)


INPUTS: dict[str, tuple[str, Callable[[torch.Generator, FloatFormat], torch.Tensor]]] = {
    "normal": ("standard normal", lambda g, f: torch.randn(_R, 32 * _B, generator=g)),
    "normal_scaled": ("normal times 2^k per row, k in [-40, 40]", lambda g, f: torch.randn(
        _R, 32 * _B, generator=g) * _exp2(torch.randint(-40, 41, (_R, 1), generator=g))),
    "heavy_tail": ("normal / uniform(1e-4, 1)", lambda g, f: torch.randn(_R, 32 * _B, generator=g)
                   / torch.rand(_R, 32 * _B, generator=g).clamp(min=1e-4)),
    "bf16": ("normal times 2^k per row, bf16 input", lambda g, f: (torch.randn(
        _R, 32 * _B, generator=g) * _exp2(torch.randint(-8, 9, (_R, 1), generator=g))).bfloat16()),
    "amax_pow2": ("amax = 2^k", lambda g, f: _plant(g, _exp2(_k(g)))),
    "amax_below_pow2": ("amax = nextbelow(2^k)", lambda g, f: _plant(g, _near(_exp2(_k(g)), 0.0))),
    "amax_max_pow2": ("amax = max_elem * 2^k", lambda g, f: _plant(g, f.max * _exp2(_k(g)))),
    "amax_above_max": ("amax = nextabove(max_elem * 2^k), or in (max_elem, 2^(emax+1)) * 2^k",
                       _amax_above_max),
    "amax_even_band": ("amax significand in [2 - 2^-(mbits+1), 2)", _amax_even_band),
    "inf": ("one +-Inf per block among normals", lambda g, f: _plant(
        g, torch.full((_R, _B, 1), math.inf), torch.randn(_R, _B, 32, generator=g))),
    "nan": ("one NaN per block among normals", lambda g, f: _plant(
        g, torch.full((_R, _B, 1), math.nan), torch.randn(_R, _B, 32, generator=g))),
    "zero": ("all-zero blocks of +0 and -0", lambda g, f: _signs(g, _R, 32 * _B) * 0.0),
    "tiny": ("amax = 2^k, k in [-149, -118]: float32 subnormals, byte-0 blocks",
             lambda g, f: _plant(g, _exp2(_k(g, -149, -118)))),
    "ties": ("midpoints between codes, one element at max_elem * 2^k", _ties),
}


def battery(fmt: FloatFormat, seed: int = 0) -> dict[str, torch.Tensor]:
    """The standard input classes for one element format (each seeded from seed and its name)."""
    return {name: make(torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode())), fmt).contiguous()
            for name, (_, make) in INPUTS.items()}


# ---- the report -----------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """A block where the profiles differ, and its first differing element (if any)."""

    row: int
    block: int
    amax: str
    scale_a: int
    scale_b: int
    element: int | None = None
    value: str | None = None
    code_a: int | None = None
    code_b: int | None = None


@dataclass(frozen=True)
class ClassResult:
    name: str
    description: str
    blocks: int
    scale_diff: int  # blocks whose scale byte differs
    elements: int
    code_diff: int  # elements whose code differs
    cases: tuple[int, ...]  # DIVERGENCE_TABLE rows that name the difference
    examples: tuple[Example, ...]


@dataclass(frozen=True)
class DivergenceReport:
    a: str
    b: str
    fmt: str
    block_size: int
    inputs: str
    seed: int
    differences: tuple[tuple[str, str, str], ...]  # (profile field, a's value, b's value)
    classes: tuple[ClassResult, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def to_text(self) -> str:
        diffs = ", ".join(f"{f} ({va} | {vb})" for f, va, vb in self.differences) or "nothing"
        rows = [("class", "blocks", "scale bytes differ", "elements", "codes differ", "section 8")]
        for c in (*self.classes, _total(self.classes)):
            rows.append((c.name, str(c.blocks), _count(c.scale_diff, c.blocks), str(c.elements),
                         _count(c.code_diff, c.elements), ", ".join(map(str, c.cases)) or "-"))
        out = [f"{self.a} vs {self.b}: {self.fmt}, blocks of {self.block_size}, inputs {self.inputs!r}, "
               f"seed {self.seed}\nprofiles differ in: {diffs}\n\n", table(rows, indent="")]
        examples = [(c.name, e) for c in self.classes for e in c.examples[:1]]
        if examples:
            out.append(f"\nexamples (scale and code: {self.a} | {self.b}):\n")
        for name, e in examples:
            elem = "" if e.element is None else (f"; element {e.element} = {e.value}: "
                                                  f"code 0x{e.code_a:02x} | 0x{e.code_b:02x}")
            out.append(f"  {name} row {e.row} block {e.block}: amax {e.amax}, scale {e.scale_a} | "
                       f"{e.scale_b}{elem}\n")
        return "".join(out)


def _count(n: int, of: int) -> str:
    return f"{n} ({100 * n / of:.1f}%)" if of else "0"


def _total(classes: tuple[ClassResult, ...]) -> ClassResult:
    s = lambda attr: sum(getattr(c, attr) for c in classes)  # noqa: E731
    return ClassResult("total", "", s("blocks"), s("scale_diff"), s("elements"), s("code_diff"), (), ())


def _value(v: object) -> str:
    if isinstance(v, float) and v > 0 and math.frexp(v)[0] == 0.5 and abs(math.frexp(v)[1]) > 8:
        return f"2^{math.frexp(v)[1] - 1}"
    return str(v)


def _f(v: float) -> str:
    return repr(v) if math.isfinite(v) else str(v)


def _examples(x, ca, cb, sa, sb, amax, bs: int, limit: int = 3) -> tuple[Example, ...]:
    codes = (ca != cb).unflatten(-1, (-1, bs))
    out = []
    for r, b in ((sa != sb) | codes.any(-1)).nonzero().tolist()[:limit]:
        e = codes[r, b].nonzero().flatten().tolist()[:1]
        ex = Example(r, b, _f(float(amax[r, b])), int(sa[r, b]), int(sb[r, b]))
        if e:
            i = b * bs + e[0]
            ex = replace(ex, element=e[0], value=_f(float(x[r, i])), code_a=int(ca[r, i]), code_b=int(cb[r, i]))
        out.append(ex)
    return tuple(out)


def divergence(a: str | Profile, b: str | Profile, *, inputs: str = "standard", seed: int = 0,
               fmt: str | None = None) -> DivergenceReport:
    """Run both profiles on the battery and count, per input class, where their bits differ.

    The element format is the profiles' own, or ``fmt`` where both are families. A rotation
    both profiles share is applied by neither: the battery then stands for the rotated
    values, so a planted amax lands where the scale rule sees it.
    """
    a, b = get_profile(a, scaling="mx"), get_profile(b, scaling="mx")
    if inputs != "standard":
        raise ValueError(f"inputs={inputs!r}; expected 'standard'")
    f = _common_format(a, b, fmt)
    if a.block_size != b.block_size:
        raise ValueError(f"{a.name} has blocks of {a.block_size}, {b.name} of {b.block_size}")
    differences = tuple((k, _value(getattr(a, k)), _value(getattr(b, k)))
                        for k in QUIRK_FIELDS if k != "fmt" and getattr(a, k) != getattr(b, k))
    if a.hadamard == b.hadamard:
        a, b = replace(a, hadamard=None), replace(b, hadamard=None)
    results = []
    for name, x in battery(f, seed).items():
        (ca, sa), (cb, sb) = a.quantize(x, f), b.quantize(x, f)
        scale_diff, code_diff = int((sa != sb).sum()), int((ca != cb).sum())
        cases = cases_for(differences, name) if scale_diff or code_diff else ()
        amax = block_amax(x, 1, a.block_size)
        results.append(ClassResult(name, INPUTS[name][0], sa.numel(), scale_diff, ca.numel(), code_diff,
                                   cases, _examples(x, ca, cb, sa, sb, amax, a.block_size)))
    return DivergenceReport(a.name, b.name, f.name, a.block_size, inputs, seed, differences, tuple(results))


def _common_format(a: Profile, b: Profile, fmt: str | None) -> FloatFormat:
    pinned = {p.fmt for p in (a, b) if p.fmt is not None}
    if len(pinned) > 1:
        raise ValueError(f"{a.name} is pinned to {a.fmt} and {b.name} to {b.fmt}: compare one element format")
    if pinned and fmt is not None and fmt not in pinned:
        raise ValueError(f"fmt={fmt!r}, but the profiles are pinned to {next(iter(pinned))}")
    chosen = next(iter(pinned), fmt)
    if chosen is None:
        raise ValueError(f"{a.name} and {b.name} are both families: pass fmt (one of the MX element formats)")
    return a.element_format(chosen)


# ---- the table of section 8 -------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One case of reference_emulators.md section 8 (cases 1-20; later ones are not in it)
    and how mxcheck reaches it.

    ``options``: fields of the ``profiles``' kind (MX, NVFP4) that reproduce it ("field=v1|v2":
    only between those two values); ``classes``: battery classes where it shows (MX only); ``tests``: pytest
    node ids that pin it; ``unreachable``: why mxcheck cannot reach it; ``versions``: which
    versions of a witness behave how, each version range as tests/_witness.py pins it
    (observed by running the pinned tests under those versions).
    """

    case: int
    title: str
    libraries: str
    options: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    tests: tuple[str, ...] = ()
    unreachable: str = ""
    versions: tuple[str, ...] = ()

    @property
    def reached(self) -> str:
        parts = []
        if self.options:
            parts.append(f"profile option {', '.join(self.options)} ({' vs '.join(self.profiles)})")
        if self.tests:
            parts.append("pinned: " + ", ".join(self.tests))
        if self.unreachable:
            parts.append(f"{'not a profile option' if parts else 'not reachable'}: {self.unreachable}")
        return "; ".join(parts)


_P, _D, _F, _M = ("tests/test_profiles.py::", "tests/test_divergence.py::", "tests/test_formats.py::",
                  "tests/test_mx.py::")
_N, _T, _A = "tests/test_nvfp4.py::", "tests/test_torch_backends.py::", "tests/test_aiter_triton_vectors.py::"
_NVFP4 = ("te.nvfp4", "torchao.nvfp4")
_FINITE = ("normal", "normal_scaled", "heavy_tail", "bf16", "amax_below_pow2", "amax_above_max",
           "amax_even_band")
DIVERGENCE_TABLE: tuple[Case, ...] = (
    Case(1, "element tie rounding: half away vs RNE", "microxcaling 'nearest', AITER Triton MXFP4 (amd-aiter "
         "0.1.7.post2.dev18, bit twiddling on the float32 bits) vs torchao, gfloat, TE, ml_dtypes, torch",
         ("rounding",), ("microxcaling", "ocp"), ("ties",),
         (_D + "test_case1_microxcaling_rounds_ties_away_where_ocp_rounds_to_even",
          _A + "test_aiter_triton_codes_are_the_even_rule_with_ties_away",
          _A + "test_aiter_triton_codes_are_not_ties_to_even")),
    Case(2, "below-tie double rounding in float32 floor(|x| + 0.5)", "microxcaling (Python) vs all",
         ("half_away_sum",), ("microxcaling", "ocp"),
         tests=(_D + "test_case2_below_a_tie_rounds_to_zero_where_microxcaling_gives_min_subnormal",
                "tests/test_vocabulary.py::test_floor_half_in_float32_rounds_a_quarter_quantum_below_the_tie_up")),
    Case(3, "FLOOR scale from a float32 log2 at amax = nextbelow(2^k)", "microxcaling, gfloat float32, "
         "AITER MXFP6 Triton/torch vs torchao FLOOR, gfloat float64, AITER HIP",
         ("exponent_source",), ("aiter.mxfp6.triton", "aiter.mxfp6"), ("amax_below_pow2", "amax_above_max"),
         (_M + "test_floor_reads_exponent_bits_not_float32_log2",
          _P + "test_aiter_triton_log2_scale_is_one_binade_high_at_nextbelow_pow2")),
    Case(4, "FLOOR vs RCEIL when max_elem * 2^k < amax < 2^(emax+1+k)", "microxcaling, torchao FLOOR, "
         "gfloat vs torchao RCEIL, TE", ("scale_rule=floor|rceil",), ("torchao.mxfp8", "te.mxfp8"), _FINITE,
         (_M + "test_golden_e4m3_floor_versus_rceil_at_480",)),
    Case(5, "Inf in an MX block", "microxcaling (0xFF) vs TE, gfloat (0xFE) vs torchao 0.18 (rule "
         "arithmetic; 0xFF in the read snapshot)", ("inf_amax_byte", "scale_rule"),
         ("microxcaling", "ocp"), ("inf",),
         (_M + "test_inf_amax_follows_the_rule_arithmetic_as_torchao", _P + "test_inf_amax_byte_of_each_profile")),
    Case(6, "NaN in an MX block", "microxcaling, torchao (block NaN) vs TE, AITER HIP, Primus-Turbo "
         "(fmaxf ignores NaN) vs AITER torch (zero block)", ("nan_policy",), ("torchao.mxfp8", "te.mxfp8"),
         ("nan",), (_P + "test_nan_policy_of_each_profile",)),
    Case(7, "RCEIL descale > 2^127: satfinite 0xFE vs NOSAT 0xFF", "TE vs torchao (read snapshot's PTX)",
         ("inf_amax_byte",), ("te.mxfp8", "microxcaling"), ("inf",),
         (_P + "test_te_and_torchao_rceil_saturate_an_inf_amax_to_254",)),
    Case(8, "EVEN rule at amax ~ FLT_MAX", "torchao EVEN vs FLOOR",
         tests=(_D + "test_case8_even_rule_at_flt_max_carries_into_the_inf_field",)),
    Case(9, "NaN element codes in fp4/fp6", "CUDA, TE-ref, torchao, ml_dtypes, gfloat",
         tests=(_F + "test_ml_dtypes_maps_nan_to_the_negative_zero_code_where_mxcheck_raises",
                _M + "test_nan_block_gets_e8m0_nan_and_deterministic_codes")),
    Case(10, "-0.0 input", "torchao, gfloat, ml_dtypes, torch, CUDA (keep -0) vs TE-ref, microxcaling (+0)",
         tests=("tests/test_packing.py::test_fp4_pack_matches_torchao_pinned_example",
                _D + "test_case10_negative_zero_keeps_its_sign_as_ml_dtypes_and_torchao")),
    Case(11, "FP8 NaN encoding", "torch, ml_dtypes, CUDA, gfloat",
         tests=(_F + "test_nan_codes_of_ml_dtypes_torch_gfloat_and_mxcheck",)),
    Case(12, "FP8 overflow: NaN/Inf vs saturate", "torch, ml_dtypes vs TE, torchao, microxcaling, gfloat",
         tests=(_F + "test_fp8_overflow_of_ml_dtypes_torch_and_mxcheck",)),
    Case(13, "FP4/FP6 overflow and Inf", "ml_dtypes, torchao, gfloat(sat), TE vs microxcaling (keeps Inf), "
         "gfloat(sat=False) raises", tests=(_D + "test_case13_fp4_fp6_overflow_and_inf_saturate",)),
    Case(14, "E8M0 dtype casts", "torch vs ml_dtypes vs gfloat",
         tests=(_F + "test_e8m0_casts_of_torch_ml_dtypes_gfloat_and_mxcheck",),
         versions=("ml_dtypes<0.7 (0.6.0 run): float32 subnormals in (2^-127, 1.5*2^-127) round up to "
                   "0x01, as torch 2.13.0",
                   "ml_dtypes>=0.7 (0.7.0 run): they round to nearest, 0x00, as gfloat and mxcheck")),
    Case(15, "NVFP4 block scales below 2^-6", "torchao (clamps) vs TE (subnormal, zero)",
         tests=("tests/test_nvfp4.py::test_pinned_subnormal_and_zero_block_scale_te_vs_torchao",
                "tests/test_nvfp4.py::test_pinned_all_zero_tensor_te_zeros_vs_torchao_nan_scales"),
         unreachable="profiles are MX (E8M0) quantizers; NVFP4 is nvfp4_quantize's"),
    Case(16, "current scaling with amax 0, Inf, NaN", "TE kernel vs TE reference vs torchao",
         tests=("tests/test_fp8.py::test_pinned_amax_zero_te_scale_one_vs_torchao_448e12",
                "tests/test_fp8.py::test_scale_edge_cases",
                "tests/test_torch_backends.py::test_torchao_float8_turns_a_nan_or_inf_amax_into_a_nan_or_zero_scale")),
    Case(17, "power-of-2 scale from exp2(floor(log2 s))", "torchao vs TE",
         tests=("tests/test_fp8.py::test_pinned_power_of_2_at_nextafter_28_te_8_vs_torchao_16",)),
    Case(18, "DelayedScaling with current amax 0", "TE fused vs unfused",
         tests=("tests/test_delayed_scaling.py::"
                "test_pinned_zero_amax_fused_keeps_scale_unfused_recomputes_from_history",)),
    Case(19, "torchao fp4 nibble order before 2025-10", "old torchao vs torch core, TE, CUDA",
         tests=("tests/test_packing.py::test_fp4_pack_matches_torchao_pinned_example",),
         unreachable="the old high-nibble order is history; mxcheck packs element 0 low, as torchao now"),
    Case(20, "torchao fp6 packing (removed 2025-12)", "torchao Triton vs pack_uint6_pytorch",
         tests=("tests/test_packing.py::test_fp6_pack_hand_worked_example",),
         unreachable="both layouts were removed from torchao; mxcheck packs one 6-bit stream (AITER order)"),
    Case(21, "float64 input rounded twice, through float32 (not in RE)", "ml_dtypes<0.7, torch .to() vs "
         "ml_dtypes>=0.7, gfloat, mxcheck", tests=(_F + "test_ml_dtypes_and_torch_round_float64_inputs_twice",),
         unreachable="an input-dtype artefact of the witnesses; mxcheck rounds the float64 value once",
         versions=("ml_dtypes<0.7 (0.6.0 run): casts float64 to float32 first, so a float64 just off a "
                   "tie rounds twice (e2m1 0.25 + 2^-54 -> 0x0, not 0x1)",
                   "ml_dtypes>=0.7 (0.7.0 run): rounds the float64 value once, as gfloat and mxcheck",
                   "torch 2.13.0 .to(): through float32, twice (fp8, e8m0, bf16, fp16)")),
    Case(22, "NVFP4 element tie decided by the float32 order of the encode scale", "TE (1 / (s * (1 / S_enc))), "
         "mxcheck vs torchao 0.17+ ((1 / per_tensor_scale) / s)", ("element_scale=te|reciprocal_quotient",), _NVFP4,
         tests=(_N + "test_pinned_element_tie_te_and_torchao_round_from_different_float32_products",)),
    Case(23, "NVFP4 scale-byte tie decided by the float32 order of the block scale", "TE (vec_max * (S_enc * "
         "fl32(1/6))), mxcheck vs torchao ((vec_max / 6) / per_tensor_scale)", ("block_scale=te|quotient",), _NVFP4,
         tests=(_N + "test_pinned_scale_byte_tie_te_and_torchao_round_from_different_float32_products",)),
    Case(24, "byte-0 MX blocks divided by 2^-126, not 2^-127", "torchao FLOOR, CEIL, EVEN (float32 scale clamped "
         "to F32_MIN_NORMAL) vs OCP, TE, gfloat, mxcheck", ("subnormal_scale_clamp=None|2^-126",),
         ("torchao.floor", "ocp"), ("tiny",),
         (_M + "test_pinned_torchao_divides_scale_byte_zero_blocks_by_2_pow_minus_126",
          _P + "test_torchao_floor_divides_byte_zero_blocks_by_2_pow_minus_126")),
    Case(25, "byte-0 MX blocks left unscaled (divided by 1)", "torchao RCEIL (_to_mx_rceil: reciprocal 1.0 at "
         "byte 0) vs TE, mxcheck", ("subnormal_scale_clamp=None|1.0",), ("torchao.rceil", "te.mxfp8"), ("tiny",),
         (_M + "test_pinned_torchao_rceil_zeroes_scale_byte_zero_blocks",
          _P + "test_torchao_rceil_leaves_byte_zero_blocks_unscaled")),
    Case(26, "RCEIL scale from a float32 log2 one binade low at amax just above max_elem * 2^k", "torchao 0.18 "
         "RCEIL eager fallback (ceil(log2(amax / max)) in float32) vs TE, torchao sm100 cvt.rp, mxcheck",
         ("exponent_source=bits|log2_fp32",), ("torchao.rceil", "te.mxfp8"), ("amax_above_max",),
         (_P + "test_torchao_rceil_log2_scale_is_one_binade_low_at_nextabove_max_pow2",
          _T + "test_torchao_fails_the_conformance_quantize_check_only_on_adversarial_amaxes")),
    Case(27, "NVFP4 tensor amax below 2688 / FLT_MAX: the reciprocal of the per-tensor scale is Inf",
         "torchao 0.18 vs TE, mxcheck (S_enc capped at FLT_MAX)", ("element_scale=te|reciprocal_quotient",), _NVFP4,
         tests=(_N + "test_pinned_tiny_amax_torchao_per_tensor_scale_reciprocal_overflows_where_te_caps_it",)),
    Case(28, "delayed-scaling scale as one division vs a reciprocal times fp8_max", "TE fused kernel (fp8_max / "
         "amax) vs unfused Python (fl32(1 / amax) * fp8_max; overflows first with a margin)",
         tests=("tests/test_delayed_scaling.py::test_pinned_unfused_reciprocal_times_max_differs_from_fused_division",
                "tests/test_delayed_scaling.py::test_margin_scale_and_the_pinned_overflow_order_difference"),
         unreachable="a delayed-scaling option (DelayedScaling(fused=)), not a quantizer profile"),
    Case(29, "negative MX block exponent stored as byte 127", "AITER Triton MXFP4 (amd-aiter 0.1.7.post2.dev18) "
         "on NVIDIA (a negative float to uint8 saturates to 0) vs the same kernel on AMD (wraps), every other MX "
         "quantizer", tests=(_A + "test_aiter_triton_on_h200_stores_byte_127_for_every_negative_block_exponent",),
         unreachable="a Triton conversion on one vendor's GPU; profile aiter.mxfp4.triton gives the byte the kernel "
                     "means"),
    Case(30, "linear output rounded to bf16 before the bias is added", "torchao 0.18 MXFP8Linear on bf16 "
         "activations, Float8Linear rowwise (addmm_float8_unwrapped) vs the reference Function (bias added to "
         "the float32 product)", tests=(_T + "test_torchao_mxfp8_linear_on_bf16_rounds_the_gemm_to_bf16_before_the_bias",
                                    _T + "test_torchao_rowwise_forward_equals_bf16_gemm_then_bias"),
         unreachable="a linear's epilogue, not a quantizer"),
    Case(31, "FP8 GEMM accumulated in Hopper's tensor cores without float32 promotion (fast accumulation: "
             "k-steps of 32 products, terms truncated to 2^-13 of the step's largest exponent, a 13-bit running sum)",
         "torch._scaled_mm(use_fast_accum=True) on an H100 (torch 2.11.0+cu130, sm90; measured bit for bit, "
         "tools/h200/capture_fast_accum.py), as in torchao Float8Linear's forward (torchao/float8/config.py "
         "Float8LinearConfig.gemm_config_output = Float8GemmConfig(use_fast_accum=True), v0.14.0 and v0.18.0 "
         "@5f2baf9d) vs an accumulation in float32 (use_fast_accum=False promotes to float32 every 128 products, "
         "which the GEMM check accepts)",
         tests=("tests/conformance/test_known_bad.py::"
                "test_known_bad_backend_fails_the_check_its_bug_breaks_and_is_named_by_its_cause",
                "tests/test_accumulation.py::test_the_model_gives_the_h100s_bits"),
         unreachable="a GEMM accumulator, not a quantizer: catalogue behaviour gemm-reduced-accumulation, seeded "
                     "as bad-fast-accumulation"),
)


def _matches(option: str, differences: tuple[tuple[str, str, str], ...]) -> bool:
    field, _, values = option.partition("=")
    allowed = set(values.split("|")) if values else None
    return any(f == field and (allowed is None or {va, vb} <= allowed) for f, va, vb in differences)


def cases_for(differences: tuple[tuple[str, str, str], ...], input_class: str) -> tuple[int, ...]:
    """The table rows that explain a difference in these profile fields on this input class."""
    return tuple(c.case for c in DIVERGENCE_TABLE
                 if input_class in c.classes and any(_matches(o, differences) for o in c.options))


def table_json() -> list[dict[str, Any]]:
    return [asdict(c) | {"reached": c.reached} for c in DIVERGENCE_TABLE]


def table_text() -> str:
    return "".join(f"{c.case:>2}  {c.title}\n    {c.libraries}\n    {c.reached}\n"
                   + "".join(f"    versions: {v}\n" for v in c.versions) for c in DIVERGENCE_TABLE)
