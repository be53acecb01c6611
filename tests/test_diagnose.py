"""Quantize failures are counted in full, shown block by block, and attributed to the
catalogue behaviour that reproduces them (mxcheck.diagnose), and only to one that does.
Each seeded bug of mxcheck.backends.known_bad is named by its cause in test_known_bad.py."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.backends.known_bad import KNOWN_BAD
from mxcheck.conformance import CHECKS
from mxcheck.diagnose import CATALOGUE, NOT_BLOCK_BEHAVIOURS, compare_quantized, diagnose
from mxcheck.diagnose import quantize as diagnose_quantize
from mxcheck.diagnose.catalogue import QUANTIZE_BEHAVIOURS
from mxcheck.divergence import DIVERGENCE_TABLE
from mxcheck.gemm import quantize_operand
from mxcheck.profiles import ALL_PROFILES
from mxcheck.recipes import RECIPES, Recipe
from tests.conformance.test_known_bad import fully_reproduced

pytestmark = pytest.mark.emulated


def _quantize_failure(backend, recipe: Recipe) -> str:
    with pytest.raises(NumericsError) as info:
        CHECKS["quantize"](backend, recipe, torch.Generator().manual_seed(0))
    return str(info.value)


def test_the_nvfp4_half_away_bug_is_named_with_its_block_scale_ties():
    # the seeded bug rounds the ue4m3 block scales half away too (one rounding helper)
    message = _quantize_failure(KNOWN_BAD["bad-half-away"](), RECIPES["nvfp4"])
    found = fully_reproduced(message, "nvfp4.block_scale_rounding=half_away+nvfp4.rounding=half_away")
    assert found and all(r == d for r, d in found), message[:3000]


class _TwoBugs(EmulatedBackend):
    """x_row (e2m1) with fp4 pairs swapped, w_row (e4m3) with a float32-log2 block exponent:
    two independent bugs in two operand copies."""

    name = "two-bugs"

    def quantize(self, x, spec, **kw):
        if spec.fmt == "e2m1":
            q = super().quantize(x, spec, **kw)
            return replace(q, codes=q.codes.unflatten(-1, (-1, 2)).flip(-1).flatten(-2))
        return KNOWN_BAD["bad-log2-scale"]().quantize(x, spec, **kw)


def test_one_run_reports_two_independent_bugs_each_with_counts_examples_and_cause():
    recipe = replace(RECIPES["mxfp4"], name="mxfp4-x-mxfp8-w", w_row=RECIPES["mxfp8"].w_row)
    message = _quantize_failure(_TwoBugs(), recipe)
    # counts per operand copy x field x input family
    assert re.search(r"x_row\.codes \(bf16 input\): [\d,]+ of 131,072 elements differ", message)
    assert re.search(r"w_row\.scales \(amax input\): [\d,]+ of 4,096 blocks differ", message)
    assert not re.search(r"x_row\.scales \(", message)  # the swap leaves x's scales alone
    # each class attributed in full to its own cause
    swaps, logs = (fully_reproduced(message, k) for k in ("nibble_order", "mx.exponent_source=log2_fp32"))
    assert swaps and all(r == d for r, d in swaps), message[:4000]
    assert logs and all(r == d for r, d in logs), message[:4000]
    # and example blocks of both, with inputs, amax, both scales and both codes decoded
    assert re.search(r"block scales\[\d+\] \(row \d+, elements \d+-\d+\), differs in codes; input amax 0x", message)
    assert re.search(r"scales: kernel 0x[0-9a-f]{2} \(2\^-?\d+\) \| oracle 0x[0-9a-f]{2} \(2\^-?\d+\)", message)
    assert re.search(r"element \d+: input 0x[0-9a-f]+ \(.+\): code kernel 0x[0-9a-f]{2} \(.+\) \| oracle", message)


def test_a_passing_check_runs_no_attribution(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("attribution ran on a passing check")
    for name in ("compare_quantized", "attribute", "report"):
        monkeypatch.setattr(diagnose_quantize, name, boom)
    assert CHECKS["quantize"](EmulatedBackend(), RECIPES["nvfp4"], torch.Generator().manual_seed(0)) is None


class _FlipsBits(EmulatedBackend):
    """Flips the low bit of one code in 97 (no behaviour in the catalogue does that)."""

    name = "flips-bits"

    def quantize(self, x, spec, **kw):
        q = super().quantize(x, spec, **kw)
        flip = (torch.arange(q.codes.numel()).reshape(q.codes.shape) % 97 == 5).to(torch.uint8)
        return replace(q, codes=q.codes ^ flip)


def test_no_cause_is_named_where_none_reproduces_the_bits():
    message = _quantize_failure(_FlipsBits(), RECIPES["mxfp8"])
    assert " are reproduced by: " not in message, message[:3000]
    assert "reproduced by no known behaviour" in message
    assert "(unexplained)" in message


def test_an_example_block_shows_both_scale_bytes_and_exponents():
    spec = RECIPES["mxfp8"].x_row
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    ours = quantize_operand(x, spec)
    byte = int(ours.scales[2, 1])
    kernel = replace(ours, scales=ours.scales.clone().index_put_((torch.tensor(2), torch.tensor(1)),
                                                                 torch.tensor(byte + 1, dtype=torch.uint8)))
    d = compare_quantized(x, spec, ours, kernel, operand="x_row", label="test")
    lines = "\n".join(diagnose(d, ()))
    assert "x_row (test): 1 of 8 blocks differ (scales 1 of 8 blocks)" in lines
    assert f"scales: kernel 0x{byte + 1:02x} (2^{byte + 1 - 127}) | oracle 0x{byte:02x} (2^{byte - 127})" in lines
    assert "block scales[5] (row 2, elements 32-63)" in lines


def test_every_divergence_case_is_a_behaviour_or_says_why_not():
    named = {c for b in CATALOGUE.values() for c in b.cases}
    cases = {c.case for c in DIVERGENCE_TABLE}
    assert named <= cases, sorted(named - cases)
    assert not named & set(NOT_BLOCK_BEHAVIOURS), sorted(named & set(NOT_BLOCK_BEHAVIOURS))
    assert cases == named | set(NOT_BLOCK_BEHAVIOURS), sorted(cases - named - set(NOT_BLOCK_BEHAVIOURS))


def test_every_profile_is_a_behaviour():
    assert {f"profile={name}" for name in ALL_PROFILES} <= set(CATALOGUE)


def test_a_profile_built_from_a_spec_is_the_oracle():
    """The premise of every convention behaviour: the spec's own profile gives the oracle's bits."""
    from mxcheck.diagnose.catalogue import spec_profile

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(8, 128, generator=gen) * torch.ldexp(torch.ones(8, 1), torch.randint(-20, 20, (8, 1)))
    for name in ("mxfp4", "mxfp6", "mxfp8", "nvfp4", "fp8"):
        spec = RECIPES[name].x_row
        ours, theirs = quantize_operand(x, spec), spec_profile(spec, x).quantized(x, spec.fmt)
        for field in diagnose_quantize.compared_fields(ours):
            assert torch.equal(getattr(theirs, field), getattr(ours, field)), (name, field)


class _Log2AndNoNegativeZero(EmulatedBackend):
    """Two conventions in one operand: a float32-log2 block exponent and every zero code +0."""

    name = "log2-and-no-negative-zero"

    def quantize(self, x, spec, **kw):
        q = KNOWN_BAD["bad-log2-scale"]().quantize(x, spec, **kw)
        sign = 1 << (q.fmt.bits - 1)
        return replace(q, codes=torch.where(q.codes == sign, 0, q.codes).to(torch.uint8))


def test_blocks_showing_two_conventions_at_once_are_named_by_both_together():
    message = _quantize_failure(_Log2AndNoNegativeZero(), RECIPES["mxfp4"])
    log2, zero = "mx.exponent_source=log2_fp32", "mx.zero_sign=never"
    pair = fully_reproduced(message, f"{log2} & {zero}") + fully_reproduced(message, f"{zero} & {log2}")
    assert pair and all(r == d for r, d in pair), message[:4000]
    assert "reproduced by no known behaviour" not in message, message[:4000]


def _block_line(x: torch.Tensor, spec, kernel_of) -> str:
    """The first differing block's header line for the kernel ``kernel_of(oracle)``."""
    ours = quantize_operand(x, spec)
    d = compare_quantized(x, spec, ours, kernel_of(ours))
    return next(line for line in diagnose(d, behaviours=()) if "input amax" in line)


def test_a_nan_blocks_amax_is_shown_as_nan_not_inf():
    x = torch.linspace(-1, 1, 32).reshape(1, 32)
    x[0, 5] = float("nan")
    line = _block_line(x, RECIPES["mxfp8"].x_row, lambda q: replace(q, scales=torch.full_like(q.scales, 254)))
    assert line.endswith("input amax 0x7fc00000 (nan)"), line  # float32's canonical NaN: NaN is the amax


def test_a_padded_blocks_amax_is_its_inputs_not_nan():
    # mxfp4 pads K to 128 (pad_to): the 96 input elements fill three blocks, the fourth is padding
    x = torch.linspace(-3, 3, 96).reshape(1, 96)
    line = _block_line(x, RECIPES["mxfp4"].x_row, lambda q: replace(q, codes=q.codes ^ 1))
    assert line.endswith("input amax 0x40400000 (3.0)"), line  # |x[0, 0]| = 3.0, the first block's largest


def test_the_summary_names_the_combination_every_member_of_which_some_input_needs():
    """bad-three-conventions (even rule, -0 lost, Inf byte 254) on an rceil recipe: a
    comparison without Inf needs two of its conventions, one with Inf all three (rceil's own
    Inf byte is 254 too, but the even rule's arithmetic is not). The check names the three,
    exact in every comparison, and not the pair that is a part of it."""
    backend, recipe = KNOWN_BAD["bad-three-conventions"](), RECIPES["mxfp8"]
    spec = recipe.x_row
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=gen).clamp(-1.5, 1.5)
    # block amaxes where the rules part: rceil takes 1.8 / 448 up to 2^-7, even rounds 1.8 to
    # 1.75 and floors (2^-8, as floor); 1.95 even rounds to 2 (2^-7, as rceil), floor 2^-8
    x[::2, ::32], x[1::2, ::32] = 1.8, 1.95
    x[3, :32] = -0.0  # a -0 block: the zero sign shows
    with_inf = x.clone()
    with_inf[2, 5] = float("inf")
    diffs = []
    for t in (x, with_inf):
        d = compare_quantized(t, spec, quantize_operand(t, spec), backend.quantize(t, spec))
        diffs.append(diagnose_quantize.attribute(d, QUANTIZE_BEHAVIOURS))
    three = {"mx.scale_rule=even", "mx.inf_amax_byte=254", "mx.zero_sign=never"}
    parts = {diagnose_quantize.members(a.behaviour) for a in diffs[0].attributions
             if a.reproduced == diffs[0].n_examined and not a.also_changes}
    assert parts and all(p < three for p in parts), parts  # without Inf: fewer than the three
    head = diagnose_quantize.summary(diffs)[0]
    total = sum(d.n_examined for d in diffs)
    assert head.startswith(f"{total:,} of the {total:,} differing blocks examined are reproduced by: ") and \
        head.endswith("(in 2 of 2 comparisons)"), head
    ranked, _ = diagnose_quantize.ranked_causes(diffs)
    assert [set(diagnose_quantize.members(b)) for b, _, _ in ranked] == [three], ranked
