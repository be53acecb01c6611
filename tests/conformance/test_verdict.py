"""The tensor-level verdict of check_quantize and the input families it runs on."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.known_bad import KNOWN_BAD
from mxcheck.conformance import basic
from mxcheck.conformance.inputs import FAMILIES, families_table, magnitude_tensor, sweep_amaxes
from mxcheck.conformance.verdict import LOST_MARGIN_DB, TensorVerdict, tensor_verdict
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import RECIPES
from mxcheck.report.html import render_html
from mxcheck.report.markdown import render_markdown, worst
from mxcheck.report.recorder import Numerics
from mxcheck.report.schema import Report

pytestmark = pytest.mark.emulated

NVFP4 = RECIPES["nvfp4"].x_row


def test_a_kernel_that_returns_zero_codes_loses_the_tensor(gen):
    """Zero output: the error is the signal, so the SNR is exactly 0 dB (the definition, not
    the code under test); the oracle keeps NVFP4's ~20 dB (DESIGN.md anchors: > 10 dB)."""
    x = magnitude_tensor(gen, 32, 128, torch.float32, 5e-5)
    ours = quantize_operand(x, NVFP4)
    v = tensor_verdict(x, NVFP4, ours, replace(ours, codes=torch.zeros_like(ours.codes)), operand="x_row")
    assert v.kernel_db == 0.0 and v.oracle_db > 10 and not v.passed
    assert re.fullmatch(r"x_row loses the tensor at amax 5\.0e-05 \(float32\): SNR 0\.0 dB, oracle \d+\.\d dB, "
                        r"4,096 of 4,096 values 0", v.line()), v.line()


def test_the_oracle_keeps_its_own_tensor(gen):
    x = magnitude_tensor(gen, 32, 128, torch.bfloat16, 4.6)
    ours = quantize_operand(x, NVFP4)
    v = tensor_verdict(x, NVFP4, ours, ours, operand="w_row")
    assert v.passed and v.kernel_db == v.oracle_db and v.line().startswith("w_row keeps the tensor at amax 4.6e+00")


def test_a_kernel_a_little_under_the_oracle_is_not_losing_the_tensor():
    """One code per row moved by one step costs far less than the margin."""
    x = magnitude_tensor(torch.Generator().manual_seed(0), 32, 128, torch.float32, 1.0)
    ours = quantize_operand(x, NVFP4)
    codes = ours.codes.clone()
    codes[:, 0] ^= 1  # the last mantissa bit of one element per row
    v = tensor_verdict(x, NVFP4, ours, replace(ours, codes=codes), operand="x_row")
    assert v.kernel_db < v.oracle_db and v.passed, v.line()


def test_specials_are_judged_on_their_finite_values_and_a_nan_everywhere_loses_them(gen):
    """A NaN input: the oracle's finite values are compared (MX: the NaN's block is NaN,
    OCP MX 6.3); a kernel whose every block scale is NaN (the NaN spread over the tensor)
    has an infinite error there."""
    spec = RECIPES["mxfp8"].x_row
    x = magnitude_tensor(gen, 32, 128, torch.float32, 4.6)
    x[3, 7] = math.nan
    ours = quantize_operand(x, spec)
    v = tensor_verdict(x, spec, ours, ours, operand="x_row")
    assert v.passed and math.isfinite(v.oracle_db) and v.compared == x.numel() - 32  # the NaN's block
    nan = tensor_verdict(x, spec, ours, replace(ours, scales=torch.full_like(ours.scales, 255)), operand="x_row")
    assert nan.kernel_db == -math.inf and not nan.passed and nan.nonfinite == nan.compared, nan.line()


def test_an_all_zero_input_has_nothing_to_lose():
    x = torch.zeros(32, 128)
    ours = quantize_operand(x, NVFP4)
    v = tensor_verdict(x, NVFP4, ours, replace(ours, block_scales=ours.block_scales + 1), operand="x_row")
    assert math.isnan(v.oracle_db) and v.passed


def test_an_input_the_oracle_loses_too_is_not_the_kernels_loss():
    """Where the oracle's own values keep nothing (every finite value 0: 0 dB against truth,
    as a tensorwise scale from an Inf amax gives), a kernel returning NaN there differs in
    its bits, which the bitwise comparison judges, but loses nothing the recipe keeps; the
    same NaN kernel beside an oracle that keeps 20 dB loses the tensor."""
    both_lose = TensorVerdict("x_row", torch.float32, 4.6, kernel_db=-math.inf, oracle_db=0.0, compared=4096,
                              zeros=0, nonfinite=4096)
    assert both_lose.passed, both_lose.line()
    kernel_loses = replace(both_lose, oracle_db=20.4)
    assert not kernel_loses.passed and "loses the tensor" in kernel_loses.line()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("recipe", ["nvfp4", "fp8", "mxfp8"])
def test_the_magnitude_sweep_spans_the_dtype_and_leaves_each_per_tensor_formula_range(recipe, dtype):
    """From the smallest subnormal to near the dtype's max (float16: to its max, 65504, which
    no tiled family reaches); for a per-tensor scale, an amax where C / amax overflows the
    dtype and one where amax / C is subnormal there."""
    spec, fi = RECIPES[recipe].x_row, torch.finfo(dtype)
    amaxes = sweep_amaxes(spec, dtype)
    assert amaxes[0] == fi.tiny * fi.eps and fi.max / 2 < amaxes[-1] <= fi.max
    assert (amaxes[-1] == 65504.0) == (dtype == torch.float16)  # IEEE binary16's largest finite
    assert any(math.frexp(a)[0] != 0.5 for a in amaxes)  # not only powers of two
    c = {"nvfp4": 2688.0, "fp8": 448.0, "mxfp8": None}[recipe]
    if c is not None:
        assert any(c / a > fi.max for a in amaxes) and any(fi.tiny * fi.eps < a / c < fi.tiny for a in amaxes)
    for (t_dtype, amax, t) in FAMILIES["magnitude"].tensors(torch.Generator().manual_seed(0), spec, 0, 0):
        assert t.dtype == t_dtype and float(t.abs().max()) == amax


def test_the_families_table_lists_every_family():
    table = families_table()
    for name in FAMILIES:
        assert f"| {name} |" in table


def test_the_lost_tensor_line_heads_the_failure_and_the_reports(gen, monkeypatch):
    """The lost-tensor verdict is a failed SNR record (kernel SNR against the oracle's less
    the margin): the worst margin of the report, its message in Markdown and HTML."""
    monkeypatch.setattr(basic, "QUANTIZE_INPUTS", {"magnitude": FAMILIES["magnitude"]})
    records = []
    numerics = Numerics(records.append, "test_x", backend="bad-nvfp4-scale-threshold")
    backend = KNOWN_BAD["bad-nvfp4-scale-threshold"]()
    backend.input_dtypes = (torch.float32,)
    with pytest.raises(NumericsError) as info:
        basic.check_quantize(backend, RECIPES["nvfp4"], gen, numerics)
    first = str(info.value).splitlines()[0]
    assert first.startswith("x_row loses the tensor at amax 5.0e-05 (float32): SNR 0.0 dB"), first
    lost = [r for r in records if r.kind == "snr" and not r.passed]
    assert lost and all(r.threshold_db == r.extra["oracle_snr_db"] - LOST_MARGIN_DB for r in lost)
    report = Report(records=records)
    assert re.match(r"[xw]_row loses the tensor at amax", worst(records).message), worst(records).message
    assert first in render_markdown(report) and first in render_html(report)
