"""Field relations on a values kernel's values (mxcheck.conformance.values_relations): where no
behaviour reproduces a fake-quant kernel, what differs is stated exactly, read as values, as
the block scale they lie at, or as codes under the oracle's scale. Each kernel here computes
its values on its own (frexp for the exponent, torch's float8 cast for the elements); the
expected counts and thresholds come from that model, never from the code under test."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.known_bad import KNOWN_BAD
from mxcheck.conformance import basic
from mxcheck.conformance.accuracy import CASES, run_case
from mxcheck.conformance.values import ValuesDiff, oracle_values, value_blocks
from mxcheck.conformance.values_relations import relate_values
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import RECIPES, get_recipe
from mxcheck.report import Report
from mxcheck.report.recorder import Numerics

pytestmark = pytest.mark.emulated

SPEC = replace(RECIPES["mxfp8"].x_row, scale_rule="floor")  # e4m3, 32-element blocks, emax 8


def _e4m3(t: torch.Tensor) -> torch.Tensor:
    """float32 rounded to e4m3 (RNE, saturating at 448) by torch's own float8 cast."""
    return t.clamp(-448, 448).to(torch.float8_e4m3fn).float()


def _block_amax(x: torch.Tensor) -> torch.Tensor:
    return x.float().abs().unflatten(-1, (-1, 32)).amax(-1).flatten()


def _pow2_scale(x: torch.Tensor, binades: int = 0) -> torch.Tensor:
    """The OCP floor scale 2^(floor(log2 amax) - 8) of each block (frexp reads the exponent
    exactly), times 2^binades, spread over its elements."""
    e = torch.frexp(x.float().abs().unflatten(-1, (-1, 32)).amax(-1)).exponent - 1
    return torch.exp2((e - 8 + binades).float()).repeat_interleave(32, dim=-1)


def _magnitudes(lo: int, hi: int, rows: int = 16, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Blocks whose amax steps through 2^lo ... 2^hi a quarter binade at a time (each power
    of two some block's exact amax), signs mixed."""
    g = torch.Generator().manual_seed(7)
    n = rows * 4
    amax = torch.exp2(torch.linspace(lo, hi, n).mul(4).round().div(4))
    x = torch.rand(n, 32, generator=g) * amax[:, None]
    x[:, 0] = amax
    x *= torch.where(torch.rand(n, 32, generator=g) < 0.5, -1.0, 1.0)
    return x.reshape(rows, 128).to(dtype)


def _diff(x: torch.Tensor, got: torch.Tensor) -> ValuesDiff:
    oracle = quantize_operand(x, SPEC)
    return ValuesDiff("x_row", "test", SPEC, x, oracle, oracle_values(oracle, got.dtype), got)


def test_values_nan_in_float16_blocks_below_an_amax_threshold_are_stated_on_the_values():
    # the example: x / 2**e in float16, 2**e = 0 below 2^-24, so every value of a
    # block whose amax is below 2^-16 is NaN
    x = _magnitudes(-22, 0, dtype=torch.float16)
    tiny = _block_amax(x) < 2.0**-16
    oracle = oracle_values(quantize_operand(x, SPEC), torch.float16)
    got = torch.where(tiny.repeat_interleave(32).reshape(x.shape), torch.nan, oracle).half()
    relations, stated = relate_values(_diff(x, got))
    n = int(tiny.sum())
    assert [r.line() for r in relations] == [
        f"values: NaN in every float16 block whose amax is below 2^-16 ({n} of {n} such blocks, in 1 comparison), "
        "and nowhere else; nothing else differs"]
    assert torch.equal(stated, tiny)


def test_a_block_scale_one_binade_low_is_stated_as_the_oracles_times_one_half():
    # at half the scale every block's amax / s is at least 512 and saturates at 448
    x = _magnitudes(-6, 6)
    s = _pow2_scale(x, binades=-1)
    got = _e4m3(x / s) * s
    d = _diff(x, got)
    assert d.n_differing == d.n_blocks  # the premise
    relations, stated = relate_values(d)
    assert [r.line() for r in relations] == [
        "scale: the values lie on the e4m3 grid at a block scale of the oracle's times 2^-1 in every float32 block "
        f"({d.n_blocks} of {d.n_blocks} such blocks, in 1 comparison), and nowhere else; nothing else differs"]
    assert relations[0].name == "scale: times 2^-1" and bool(stated.all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_block_scale_floored_at_1e_minus_10_is_stated_as_that_constant_in_the_blocks_it_floors(dtype):
    # max(2^e, 1e-10): with e = floor(log2 amax) - 8, 2^e is below 1e-10 (2^-33.2) exactly
    # where amax is below 2^-25. Values returned in bfloat16 leave the scale known to 8 bits
    # only: 1e-10 is still the plain number stated.
    x = _magnitudes(-40, -10, rows=32, dtype=dtype)
    s = torch.clamp(_pow2_scale(x), min=torch.tensor(1e-10))
    got = (_e4m3(x.float() / s) * s).to(dtype)
    floored = _block_amax(x) < 2.0**-25
    relations, stated = relate_values(_diff(x, got))
    n, name = int(floored.sum()), str(dtype).removeprefix("torch.")
    assert [r.line() for r in relations] == [
        f"scale: the values lie on the e4m3 grid at a block scale of 1e-10, not a power of two in every {name} block "
        f"whose amax is below 2^-25 ({n} of {n} such blocks, in 1 comparison), and nowhere else; nothing else differs"]
    assert relations[0].name == "scale: constant 1e-10"
    assert torch.equal(stated, floored)


def test_a_block_scale_divided_by_0_75_is_stated_as_the_oracles_times_4_over_3():
    x = _magnitudes(-6, 6)
    s = _pow2_scale(x) / 0.75
    got = _e4m3(x / s) * s
    d = _diff(x, got)
    relations, stated = relate_values(d)
    assert relations[0].name == "scale: times 4/3"
    assert relations[0].covered == d.n_differing and bool(stated.all())


def test_a_code_one_step_up_in_some_blocks_is_stated_as_codes_under_the_oracles_scale():
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(3)).abs() + 1.0  # positive, no top code
    q = quantize_operand(x, SPEC)
    codes = q.codes.clone()
    codes[0, [1, 33, 65]] += 1  # element 1 of blocks 0, 1, 2 one e4m3 code up
    got = replace(q, codes=codes).dequantize()
    relations, stated = relate_values(_diff(x, got))
    assert [(r.name, r.covered, r.total) for r in relations] == [("codes: ulp_up", 3, 3)]
    assert stated.tolist() == [True, True, True] + [False] * 5


def test_a_block_whose_differing_values_no_one_relation_reproduces_is_not_stated():
    # blocks 0-2 at half the scale; block 3 at half the scale with one value changed besides
    x = _magnitudes(-2, 2, rows=1)
    s = _pow2_scale(x, binades=-1)
    got = _e4m3(x / s) * s
    got[0, 100] = -3.0 * got[0, 100]  # the sign flipped and three times the magnitude
    relations, stated = relate_values(_diff(x, got))
    assert stated.tolist() == [True, True, True, False]
    assert all(r.covered <= 3 for r in relations)


def _only_magnitude(monkeypatch):
    monkeypatch.setattr(basic, "QUANTIZE_INPUTS", {"magnitude": replace(basic.QUANTIZE_INPUTS["magnitude"],
                                                                         dtypes=(torch.float32,))})


def test_the_values_check_heads_with_the_scale_relation_and_records_it_as_json(monkeypatch):
    _only_magnitude(monkeypatch)
    records = []
    numerics = Numerics(records.append, "t", backend="bad-mx-scale-over-0.6", recipe="mxfp8")
    with pytest.raises(NumericsError) as info:
        basic.check_quantize(KNOWN_BAD["bad-mx-scale-over-0.6"](), get_recipe("mxfp8"),
                             torch.Generator().manual_seed(0), numerics)
    message = str(info.value)
    cause = message.split("\ncause:\n")[1].splitlines()
    assert cause[0].startswith("  field relation: scale: the values lie on the e4m3 grid at a block scale of the "
                               "oracle's times 5/3 in "), message[:3000]
    # each comparison's own lines state it too
    assert re.search(r"^  field relation: scale: the values lie on the e4m3 grid at a block scale of the oracle's "
                     r"times 5/3", message.split("\ncause:\n")[1].split("\nx_row (")[1], flags=re.M), message[:3000]
    failed = [r for r in records if not r.passed and r.kind == "bitwise"]
    names = {rel["name"] for r in failed for rel in r.extra.get("relations", [])}
    assert failed and "scale: times 5/3" in names
    back = Report.loads(json.dumps(Report(records=records).to_json()))
    assert {rel["name"] for r in back.records for rel in r.extra.get("relations", [])} == names


@pytest.mark.parametrize("name", ["bad-mx-scale-floor-1e-10", "bad-mx-scale-over-0.6"])
def test_a_seeded_non_power_of_two_scale_is_headed_by_its_relation_in_the_benchmark(name):
    case = next(c for c in CASES if c.name == name)
    outcome = run_case(case, quick=True)
    assert outcome.failed and outcome.named and set(outcome.headline) == {case.truth}, outcome


def test_a_scale_found_in_a_later_comparison_restates_an_earlier_one_whose_values_are_all_0(monkeypatch):
    # the amax family runs first: its floored blocks are all 0 at 1e-10, which fixes no scale
    # on its own; the magnitude family then finds 1e-10, and the check restates the first
    monkeypatch.setattr(basic, "QUANTIZE_INPUTS", {f: replace(basic.QUANTIZE_INPUTS[f], dtypes=(torch.float32,))
                                                    for f in ("amax", "magnitude")})
    with pytest.raises(NumericsError) as info:
        basic.check_quantize(KNOWN_BAD["bad-mx-scale-floor-1e-10"](), get_recipe("mxfp8"),
                             torch.Generator().manual_seed(0))
    cause = str(info.value).split("\ncause:\n")[1].split("\nx_row (")[0]
    assert cause.splitlines()[0].startswith("  field relation: scale: the values lie on the e4m3 grid at a block scale "
                                            "of 1e-10, not a power of two in "), cause
    assert "values: 0" not in cause, cause


def test_a_constant_scale_that_is_a_subnormal_power_of_two_is_not_called_otherwise():
    # 2^-135 is a float32 subnormal; its shortest text "2.2959e-41" is no power of two in float64
    from mxcheck.diagnose.relations import FieldEntries, block_facts, relate_fields

    kernel = torch.full((2,), 2.0**-135, dtype=torch.float32)
    oracle = torch.full((2,), 2.0**-120, dtype=torch.float32)
    scale = FieldEntries("scale", kernel, oracle, torch.tensor([0, 1]), free=True)
    x = torch.ones(2, 32)
    relations, _ = relate_fields([scale], block_facts(x, value_blocks(x, SPEC), 2), torch.ones(2, dtype=torch.bool),
                                 alternatives=True)
    assert relations[0].name == "scale: constant 2.2959e-41"
    assert relations[0].kind_text == "2.2959e-41"
