"""The diagnosis never crashes on what a kernel writes: any byte in a scale or code field
(0x00 to 0xff, whether or not the format has that code) and any float32 bit pattern in a
float field (NaN payloads, Inf, subnormals, negative scales) goes through the failure text
(the bitwise counts and the tensor-level verdict) and the JSON, Markdown and HTML reports,
counted and shown. The same holds for a values kernel: any float32, bf16 or fp16 bit pattern
in its values goes through the judge, the attribution, the verdict and the reports."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxcheck.assertions import NumericsError
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.conformance import CHECKS
from mxcheck.conformance.values import (
    ValuesDiff,
    attribute_values,
    infer_codes,
    oracle_values,
    values_report,
)
from mxcheck.conformance.verdict import tensor_verdict, values_verdict
from mxcheck.diagnose import quantize as diagnose_quantize
from mxcheck.diagnose.catalogue import QUANTIZE_BEHAVIOURS
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import RECIPES
from mxcheck.report import Record, Report
from mxcheck.report.html import render_html
from mxcheck.report.markdown import render_markdown

pytestmark = pytest.mark.emulated

# One quantized tensor type each: MX (E8M0 bytes), NVFP4 (ue4m3 bytes and a float32 tensor
# scale), FP8 tensorwise, rowwise and blockwise (float32 scale_inv).
RECIPE_NAMES = ("mxfp4", "mxfp8", "nvfp4", "fp8", "fp8-rowwise", "fp8-block")
_X = torch.randn(4, 128, generator=torch.Generator().manual_seed(3)).bfloat16().float()
_X[1, 7], _X[2, 100], _X[3, 120] = float("nan"), float("inf"), 0.0  # NaN and Inf blocks too


@st.composite
def kernel_fields(draw: st.DrawFn) -> tuple[str, str, object, object]:
    """(recipe, field, oracle, kernel): the oracle's tensor with one field overwritten at a
    few places by any byte (uint8 fields) or any float32 bit pattern (float fields)."""
    recipe = draw(st.sampled_from(RECIPE_NAMES))
    oracle = quantize_operand(_X, RECIPES[recipe].x_row)
    name = draw(st.sampled_from(diagnose_quantize.compared_fields(oracle)))
    field = getattr(oracle, name)
    n = field.numel()
    where = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=6, unique=True))
    if field.dtype == torch.uint8:
        values = torch.tensor(draw(st.lists(st.integers(0, 255), min_size=len(where), max_size=len(where))),
                              dtype=torch.uint8)
    else:  # every float32 bit pattern: NaN payloads of either sign, Inf, subnormals, negatives
        bits = draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=len(where), max_size=len(where)))
        values = torch.tensor(bits, dtype=torch.int32).view(torch.float32)
    changed = field.clone().reshape(-1)
    changed[torch.tensor(where)] = values.to(field.dtype)
    return recipe, name, oracle, replace(oracle, **{name: changed.reshape(field.shape)})


@settings(max_examples=40)
@given(case=kernel_fields())
def test_any_field_value_is_counted_shown_and_reported(case):
    recipe, name, oracle, kernel = case
    d = diagnose_quantize.compare_quantized(_X, RECIPES[recipe].x_row, oracle, kernel, operand="x_row",
                                            label="any bytes")
    diagnose_quantize.attribute(d, QUANTIZE_BEHAVIOURS)
    text = diagnose_quantize.report([d], 1, f"quantize of recipe {recipe}")
    verdict = tensor_verdict(_X, RECIPES[recipe].x_row, oracle, kernel, operand="x_row")
    text = "\n".join([verdict.line(), text]) if verdict is not None else text
    counted = {c.field: c.differ for c in d.counts}
    if counted.get(name):
        assert f"x_row.{name} (any bytes): {counted[name]:,} of " in text
        # the kernel's value is shown beside the oracle's, decoded or named as outside the format
        assert ("code kernel 0x" if name == "codes" else f"{name}: kernel ") in text
    record = Record(test_id=f"test_any_bytes[{recipe}-{name}]", backend="any-bytes", recipe=recipe,
                    layer=f"x_row.{name}", direction="quantize", kind="bitwise", bit_equal=False,
                    passed=False, message=text)
    report = Report(records=[record])
    assert Report.loads(json.dumps(report.to_json())).records[0].message == text
    first = text.splitlines()[0]
    assert first in render_markdown(report).replace("\\", "")
    assert "x_row." + name in render_html(report)


class _NanScaleSigned(EmulatedBackend):
    """Stores an NVFP4 NaN block scale as 0xff, a float32 NaN with the sign bit set (x86's
    default NaN) cast to a signed e4m3 byte, where ue4m3's NaN is 0x7f."""

    name = "nan-scale-0xff"

    def quantize(self, x, spec, **kw):
        q = super().quantize(x, spec, **kw)
        return replace(q, block_scales=torch.where(q.block_scales == 0x7F, 0xFF, q.block_scales).to(torch.uint8))


def test_an_nvfp4_kernel_writing_0xff_nan_scales_gets_counts_and_its_cause():
    with pytest.raises(NumericsError) as info:
        CHECKS["quantize"](_NanScaleSigned(), RECIPES["nvfp4"], torch.Generator().manual_seed(0))
    message = str(info.value)
    assert "x_row.block_scales (inf-nan input): 8,192 of 8,192 blocks differ" in message
    assert "are reproduced by: an NVFP4 NaN block scale stored as 0xff" in message
    assert "block_scales: kernel 0xff (not a ue4m3 code: ue4m3 has 128; as e4m3 nan) | oracle 0x7f (nan)" in message


# ------------------------------------------------------------------ values (fake_quantize)

VALUE_DTYPES = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


@st.composite
def kernel_values(draw: st.DrawFn) -> tuple[str, object, torch.Tensor]:
    """(recipe, oracle, values): the oracle's values in float32, bf16 or fp16 with a few
    elements overwritten by any bit pattern of that dtype (NaN payloads, Inf, subnormals)."""
    recipe = draw(st.sampled_from(RECIPE_NAMES))
    oracle = quantize_operand(_X, RECIPES[recipe].x_row)
    dtype = draw(st.sampled_from(list(VALUE_DTYPES)))
    values = oracle.dequantize().to(dtype).reshape(-1).clone()
    where = draw(st.lists(st.integers(0, values.numel() - 1), min_size=1, max_size=6, unique=True))
    width = torch.finfo(dtype).bits
    bits = draw(st.lists(st.integers(-(2 ** (width - 1)), 2 ** (width - 1) - 1), min_size=len(where),
                         max_size=len(where)))
    values[torch.tensor(where)] = torch.tensor(bits, dtype=VALUE_DTYPES[dtype]).view(dtype)
    return recipe, oracle, values.reshape(_X.shape)


@settings(max_examples=40)
@given(case=kernel_values())
def test_any_value_bit_pattern_is_judged_attributed_and_reported(case):
    recipe, oracle, got = case
    spec = RECIPES[recipe].x_row
    d = ValuesDiff("x_row", "any values", spec, _X, oracle, oracle_values(oracle, got.dtype), got)
    attribute_values(d, QUANTIZE_BEHAVIOURS)
    text = values_report([d], 1, f"fake_quantize of recipe {recipe}")
    verdict = values_verdict(_X, spec, oracle, got, operand="x_row")
    assert verdict is not None
    text = "\n".join([verdict.line(), text])
    n = int(d.differ.sum())
    assert f"x_row (any values): {n:,} of {got.numel():,} values differ" in text
    assert infer_codes(got, oracle).shape == got.shape
    record = Record(test_id=f"test_any_values[{recipe}]", backend="any-values", recipe=recipe,
                    layer="x_row.values", direction="quantize", kind="bitwise", bit_equal=False,
                    passed=False, message=text)
    report = Report(records=[record])
    assert Report.loads(json.dumps(report.to_json())).records[0].message == text
    assert text.splitlines()[0] in render_markdown(report).replace("\\", "")
    assert "x_row.values" in render_html(report)
