"""Field relations (mxcheck.diagnose.relations): where no known behaviour reproduces a
comparison, what exactly differs is stated, per field, with its coverage and the condition
that picks out exactly the blocks it covers. Each seeded kernel here computes its bits on
its own (integer bit arithmetic, torch's float8 cast), modelled on a defect measured in a
released library (issue 42); the expected thresholds and counts come from the model, never
from the code under test."""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import takewhile

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.conformance import CHECKS
from mxcheck.diagnose import quantize as diagnose_quantize
from mxcheck.diagnose.relations import KINDS, relate
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import PLAIN_RECIPES, RECIPES
from mxcheck.report import Report
from mxcheck.report.html import render_html
from mxcheck.report.markdown import render_markdown
from mxcheck.report.recorder import Numerics

pytestmark = pytest.mark.emulated


def _bf16_rne(t: torch.Tensor) -> torch.Tensor:
    """float32 rounded to bfloat16 (ties to even) by integer arithmetic on its bits; a NaN
    stays NaN (its payload would carry into the sign)."""
    bits = t.float().view(torch.int32).to(torch.int64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & ~0xFFFF
    return torch.where(t.isnan(), t, bits.to(torch.int32).view(torch.float32).reshape(t.shape))


class _TensorScaleBf16(EmulatedBackend):
    """An NVFP4 quantizer that computes codes and block scales with the float32 per-tensor
    scale and then stores that scale in bf16 (a released NVFP4 library, issue 42)."""

    name = "tensor-scale-bf16"

    def quantize(self, x, spec, **kw):
        q = super().quantize(x, spec, **kw)
        return replace(q, tensor_scale=_bf16_rne(q.tensor_scale)) if spec.scaling == "nvfp4" else q


def test_an_nvfp4_tensor_scale_held_in_bf16_is_stated_as_that_relation_and_nothing_else():
    records = []
    numerics = Numerics(records.append, "t", backend="tensor-scale-bf16", recipe="nvfp4-1x16")
    with pytest.raises(NumericsError) as info:
        CHECKS["quantize"](_TensorScaleBf16(), PLAIN_RECIPES["nvfp4-1x16"], torch.Generator().manual_seed(0),
                           numerics)
    message = str(info.value)
    differing = message.count("\n  x_row.tensor_scale (")
    assert differing > 0 and ".codes (" not in message and ".block_scales (" not in message  # the premise
    cause = list(takewhile(lambda line: line.startswith("  "), message.split("\ncause:\n")[1].splitlines()))
    assert cause[0] == (f"  field relation: tensor_scale: the oracle's rounded to bfloat16 (RNE), in {differing} "
                        f"of {differing} differing comparisons, and nothing else differs"), message[:3000]
    # no combination of conventions heads it (issue 42: "ties rounded toward zero, together with ...")
    assert not any(" are reproduced by: " in line for line in cause), cause
    # the JSON record of each comparison no behaviour reproduces in full carries the relation
    # as structure; Markdown and HTML show its line
    failed = [r for r in records if not r.passed and r.kind == "bitwise"]
    assert len(failed) == differing
    names = [rel["name"] for r in failed for rel in r.extra.get("relations", [])]
    assert names and set(names) == {"tensor_scale: bf16_rne"}
    report = Report(records=records)
    back = Report.loads(json.dumps(report.to_json()))
    assert [rel["name"] for r in back.records for rel in r.extra.get("relations", [])] == names
    line = "tensor_scale: the oracle's rounded to bfloat16 (RNE), and nothing else differs"
    assert line in render_markdown(report).replace("\\", "") and line in render_html(report).replace("&#x27;", "'")


def _per_block_amax(x: torch.Tensor, block: int) -> torch.Tensor:
    return x.float().abs().unflatten(-1, (-1, block)).amax(-1).flatten()


def _float16_magnitudes(rows: int = 16, cols: int = 128, block: int = 32) -> torch.Tensor:
    """A float16 tensor whose blocks' amax step through 2^-22 ... 2^0 (a quarter binade a
    block, so each power of two is some block's exact amax), with signs mixed."""
    g = torch.Generator().manual_seed(42)
    n = rows * cols // block
    amax = torch.exp2(torch.linspace(-22, 0, n).mul(4).round().div(4))
    x = torch.rand(n, block, generator=g) * amax[:, None]
    x[:, 0] = amax
    x *= torch.where(torch.rand(n, block, generator=g) < 0.5, -1.0, 1.0)
    return x.reshape(rows, cols).half()


def _diff(x, spec, kernel):
    oracle = quantize_operand(x, spec)
    return diagnose_quantize.compare_quantized(x, spec, oracle, kernel(oracle)), oracle


def test_codes_nan_in_float16_blocks_below_an_amax_threshold_are_stated_with_the_threshold():
    # x / 2**e computed in float16: 2**e is 0 below 2^-24 (floor rule, e4m3: e = floor(log2
    # amax) - 8, so every block whose amax is below 2^-16), and x / 0 is NaN in e4m3.
    spec = replace(RECIPES["mxfp8"].x_row, scale_rule="floor")
    x = _float16_magnitudes()
    tiny = _per_block_amax(x, 32) < 2.0**-16
    sign = (x.float() < 0).to(torch.uint8) << 7

    def kernel(q):
        nan = (tiny.repeat_interleave(32).reshape(x.shape)) & (x != 0)
        return replace(q, codes=torch.where(nan, 0x7F | sign, q.codes).to(torch.uint8))

    d, _ = _diff(x, spec, kernel)
    relations, stated = relate(d)
    assert [r.name for r in relations] == ["codes: nan"]
    n = int(tiny.sum())
    assert relations[0].line() == (f"codes: NaN in every float16 block whose amax is below 2^-16 ({n:,} of {n:,} "
                                   "such blocks, in 1 comparison), and nowhere else; nothing else differs")
    assert torch.equal(stated, tiny)


def test_a_block_scale_byte_127_with_codes_0_for_float16_subnormal_amax_blocks_is_stated():
    # the block scale 2^e held in float16 flushes for a subnormal-amax block (amax < 2^-14):
    # scale byte 127 (2^0) and the elements unscaled, so torch's e4m3 cast gives +-0
    spec = replace(RECIPES["mxfp8"].x_row, scale_rule="floor")
    x = _float16_magnitudes()
    subnormal = _per_block_amax(x, 32) < 2.0**-14
    unscaled = x.float().to(torch.float8_e4m3fn).view(torch.uint8)

    def kernel(q):
        elements = subnormal.repeat_interleave(32).reshape(x.shape)
        return replace(q, scales=torch.where(subnormal.reshape(q.scales.shape), 127, q.scales).to(torch.uint8),
                       codes=torch.where(elements, unscaled, q.codes))

    d, _ = _diff(x, spec, kernel)
    relations, stated = relate(d)
    n = int(subnormal.sum())
    lines = {r.name: r.line() for r in relations}
    assert lines == {
        "scales: constant 127": f"scales: byte 0x7f (1.0) in every float16 block whose amax is below 2^-14 ({n:,} of "
                                f"{n:,} such blocks, in 1 comparison), and nowhere else; with codes also differing there",
        "codes: constant 0": f"codes: 0 in every float16 block whose amax is below 2^-14 ({n:,} of {n:,} such blocks, "
                             "in 1 comparison), and nowhere else; with scales also differing there"}
    assert torch.equal(stated, subnormal)


def test_fp8_rowwise_all_zero_rows_with_scale_inv_2_to_the_minus_48_are_stated():
    # torchao's fp8-rowwise on the H100: an all-zero row gets scale_inv 2^-48 where the oracle's is 1.0
    spec = RECIPES["fp8-rowwise"].x_row
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(5))
    x[[1, 6]] = 0.0
    zero_rows = (x == 0).all(dim=1)
    d, _ = _diff(x, spec, lambda q: replace(q, scale_inv=torch.where(zero_rows[:, None], 2.0**-48, q.scale_inv)))
    relations, _ = relate(d)
    assert relations[0].name == "scale_inv: times 2^-48"
    assert relations[0].line() == ("scale_inv: the oracle's times 2^-48 in every all-zero float32 block (2 of 2 such "
                                   "blocks, in 1 comparison), and nowhere else; nothing else differs")


def test_a_relation_is_stated_only_for_the_blocks_whose_every_differing_entry_it_reproduces():
    # in blocks 0-3 one code goes one step up in magnitude; in block 4 one goes up and one
    # down: only the first four are stated as "ulp_up", block 4 as no single relation
    spec = RECIPES["mxfp8"].x_row
    x = torch.randn(1, 160, generator=torch.Generator().manual_seed(9)) + 3.0  # positive, no top code

    def kernel(q):
        codes = q.codes.clone()
        for i in (0, 32, 64, 96, 128):
            codes[0, i + 1] += 1
        codes[0, 130] -= 1
        return replace(q, codes=codes)

    d, _ = _diff(x, spec, kernel)
    relations, stated = relate(d)
    up = next(r for r in relations if r.name == "codes: ulp_up")
    assert (up.covered, up.total) == (4, 5)
    assert stated.tolist() == [True, True, True, True, False]
    assert not any(r.covered == 5 for r in relations)


def test_a_relation_name_reads_field_colon_kind_from_the_one_list_of_kinds():
    spec = RECIPES["mxfp8"].x_row
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    d, _ = _diff(x, spec, lambda q: replace(q, scales=torch.full_like(q.scales, 127)))
    (relation, *_), _ = relate(d)
    assert relation.name == "scales: constant 127" and relation.to_json()["name"] == relation.name
    assert relation.kind in KINDS


def test_one_relation_under_several_conditions_that_covers_every_differing_block_is_one_summary_line():
    from mxcheck.diagnose.relations import Condition, Relation, combine

    below = Relation("scale", "constant 1e-10", 5, 5, "blocks", Condition("amax_below", 1e-9, 3e-8, 5, ("float32",)))
    every = Relation("scale", "constant 1e-10", 3, 3, "blocks", Condition("every", matching=3, dtypes=("float32",)))
    (whole,) = combine([below, every], ("float32",), {("scale", "blocks"): 8})
    assert (whole.covered, whole.total, whole.comparisons) == (8, 8, 2)
    assert whole.line() == "scale: constant 1e-10 in 8 of the 8 blocks where the field differs; nothing else differs"
    # where they leave blocks, each keeps its condition
    assert len(combine([below, every], ("float32",), {("scale", "blocks"): 9})) == 2
