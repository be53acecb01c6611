"""Fake-quant backends (``fake_quantize``) are judged on values: bit for bit against the
oracle's dequantized values in the kernel's dtype, NaN equal to NaN, causes named on values,
and linears through the reference Function on the kernel's values."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.conformance import basic, run_checks
from mxcheck.conformance._common import linear_of
from mxcheck.functions import quant_linear
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import get_recipe

pytestmark = pytest.mark.emulated


class OracleValues:
    """The oracle's dequantized values, returned in x's dtype (``dtype=None``) or float32."""

    name = "oracle-values"

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype, self.calls = dtype, []

    def available(self):
        return True, ""

    def supports(self, recipe):
        return True, ""

    def values(self, x, spec):
        return quantize_operand(x, spec).dequantize()

    def fake_quantize(self, x, spec, *, state=None):
        self.calls.append((spec.fmt, spec.scaling, tuple(x.shape)))
        return self.values(x, spec).to(self.dtype or x.dtype)


class OtherNaNs(OracleValues):
    """Every NaN with the sign bit set and another payload: not part of the contract."""

    def values(self, x, spec):
        v = super().values(x, spec)
        return torch.where(v.isnan(), torch.tensor(-0x3FFFFF, dtype=torch.int32).view(torch.float32), v)


class TruncatingCast(OracleValues):
    """float32 values cut to bfloat16 by dropping the low 16 bits (round toward zero)."""

    def fake_quantize(self, x, spec, *, state=None):
        bits = self.values(x, spec).view(torch.int32) & -0x10000
        return bits.view(torch.float32).to(torch.bfloat16)


class CeilRule(OracleValues):
    def values(self, x, spec):
        return quantize_operand(x, replace(spec, scale_rule="ceil")).dequantize()


def _only(monkeypatch, family, dtypes):
    monkeypatch.setattr(basic, "QUANTIZE_INPUTS", {family: replace(basic.QUANTIZE_INPUTS[family], dtypes=dtypes)})


def test_the_oracles_values_pass_whatever_the_payload_and_sign_of_their_nans(monkeypatch):
    _only(monkeypatch, "inf-nan", (torch.float32, torch.bfloat16))
    backend = OtherNaNs()
    assert basic.check_quantize(backend, get_recipe("nvfp4-1x16"), torch.Generator().manual_seed(0)) is None
    assert len(backend.calls) == 4  # x_row and w_row, in float32 and bfloat16
    exact = OracleValues()
    one = exact.fake_quantize(torch.tensor([[float("nan")] + [1.0] * 15]), get_recipe("nvfp4-1x16").x_row)
    assert one.isnan().all()  # NVFP4: a NaN anywhere makes every value NaN, as the contract says


def test_a_cast_to_bf16_that_truncates_fails_and_the_failure_states_the_cast_the_oracle_makes(monkeypatch):
    # FP8 tensorwise values (e4m3 * amax / 448) are bf16 values only where the tensor scale is
    # a power of two; the magnitude family's tensor amaxes (4.6, 0.9 * max, ...) are not, so
    # the cast's rounding shows there.
    _only(monkeypatch, "magnitude", (torch.bfloat16,))
    recipe = get_recipe("fp8-tensorwise")
    assert basic.check_quantize(OracleValues(), recipe, torch.Generator().manual_seed(0)) is None
    with pytest.raises(NumericsError) as e:
        basic.check_quantize(TruncatingCast(), recipe, torch.Generator().manual_seed(0))
    head = str(e.value).splitlines()[0]
    assert re.match(r"fake_quantize of recipe fp8-tensorwise, backend oracle-values: \d+ of \d+ comparisons", head), head
    assert "cast to the kernel's dtype with round-to-nearest-even, any NaN equal to any NaN" in head


def test_a_wrong_scale_rule_fails_on_values_and_the_behaviour_is_named(monkeypatch):
    _only(monkeypatch, "bf16", (torch.float32,))
    with pytest.raises(NumericsError) as e:
        basic.check_quantize(CeilRule(), get_recipe("ocp-mxfp8-e4m3"), torch.Generator().manual_seed(0))
    lines = str(e.value).splitlines()
    assert lines[1] == "cause:"
    assert "differing blocks examined are reproduced by: ceil scale rule" in lines[2]
    assert any("kernel 0x" in line and "| oracle 0x" in line for line in lines)


@pytest.mark.parametrize(("returned", "match"), [
    (torch.float64, r"fake_quantize returned torch.float64 \[256, 512\], expected \[256, 512\] in bfloat16 or "
                    r"float32"),
    ("shape", r"fake_quantize returned torch.bfloat16 \[256, 256\], expected \[256, 512\]")])
def test_values_in_another_dtype_or_shape_fail_naming_both(monkeypatch, returned, match):
    _only(monkeypatch, "bf16", (torch.bfloat16,))

    class Wrong(OracleValues):
        def fake_quantize(self, x, spec, *, state=None):
            v = super().fake_quantize(x, spec)
            return v.double() if returned is torch.float64 else v[:, :256]
    with pytest.raises(NumericsError, match=match):
        basic.check_quantize(Wrong(), get_recipe("ocp-mxfp8-e4m3"), torch.Generator().manual_seed(0))


def test_a_fake_quant_backends_linear_quantizes_all_six_copies_with_its_fake_quantize():
    backend = OracleValues(torch.float32)
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(64, 96, generator=gen), torch.randn(32, 96, generator=gen), torch.randn(32, generator=gen)
    recipe = get_recipe("nvfp4-1x16")
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
    y = linear_of(backend)(*leaves, recipe)
    y.backward(torch.ones_like(y))
    # x_row [M, K], w_row [N, K], g_row [M, N], w_col [K, N], g_col [N, M], x_col [K, M]
    assert [c[2] for c in backend.calls] == [(64, 96), (32, 96), (64, 32), (96, 32), (32, 64), (96, 64)]
    # the oracle's values in every copy: the reference Function's own outputs, bit for bit
    ref = [t.clone().requires_grad_(True) for t in (x, w, b)]
    ry = quant_linear(*ref, recipe)
    ry.backward(torch.ones_like(ry))
    for got, want in ((y, ry), (leaves[0].grad, ref[0].grad), (leaves[1].grad, ref[1].grad)):
        assert torch.equal(got, want)


def test_checks_that_need_codes_say_why_on_a_fake_quant_backend():
    out = run_checks(OracleValues(), get_recipe("ocp-mxfp8-e4m3"), names=["poison_padding", "gemm"])
    assert out == {"poison_padding": "skipped: needs codes (quantize) or a gemm that reads padded operands: the "
                                     "backend returns values (fake_quantize), which have no padding",
                   "gemm": "skipped: backend has no gemm"}


def test_quant_linear_takes_a_quantizer_or_none_and_names_anything_else():
    x, w = torch.ones(4, 32), torch.ones(8, 32)
    with pytest.raises(TypeError, match=r"layer linear: quantize=3 \(int\); expected a callable quantize\(x, spec"):
        quant_linear(x, w, None, "nvfp4-1x16", quantize=3)
