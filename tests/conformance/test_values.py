"""Fake-quant backends (``fake_quantize``) are judged on values: bit for bit against the
oracle's dequantized values in the kernel's dtype, NaN equal to NaN, causes named on values,
and linears through the reference Function on the kernel's values."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
import torch

import mxcheck
from mxcheck.assertions import NumericsError
from mxcheck.conformance import basic, edge_shape_outcome, run_checks
from mxcheck.conformance._common import linear_of
from mxcheck.conformance.verdict import LOST_MARGIN_DB
from mxcheck.functions import quant_linear
from mxcheck.gemm import quantize_operand
from mxcheck.plugin import needs
from mxcheck.recipes import get_recipe
from mxcheck.report.markdown import worst
from mxcheck.report.recorder import Numerics

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


# ------------------------------------------------------------------ the fair contract (issue 41)

with needs("ml_dtypes"):
    import ml_dtypes

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _witness_factors(q) -> tuple[np.ndarray, np.ndarray, float]:
    """(e2m1 value, ue4m3 block scale per element, amax) from the bytes, decoded by the witnesses."""
    s = q.block_scales.cpu().numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return E2M1[q.codes.cpu().numpy()], np.repeat(s, 16, axis=-1), float(q.amax)


class ExactProduct(OracleValues):
    """The oracle's codes and scales, dequantized as the exact product e2m1 * s * amax / 2688
    rounded once to float32 (float64 holds the product exactly), with the decoded block
    scale s * amax / 2688 below ``threshold`` taken as 0 (the seeded bug: an absolute
    epsilon on the block scale, which zeroes every block of a small tensor)."""

    name = "exact-product"

    def __init__(self, threshold: float = 0.0) -> None:
        super().__init__()
        self.threshold = threshold

    def values(self, x, spec):
        e, s, amax = _witness_factors(quantize_operand(x, spec))
        with np.errstate(invalid="ignore", over="ignore"):  # 0 * Inf at an Inf amax is NaN, as the oracle's
            decoded = s * amax / 2688.0
            decoded = np.where(np.abs(decoded) < self.threshold, 0.0, decoded)
            return torch.from_numpy((e * decoded).astype(np.float32))


class TorchaoOrder(OracleValues):
    """The oracle's codes and scales in torchao 0.18's float32 order (nvfp4_tensor.py
    get_hp_scales, dequantize): e2m1 * (s * (amax / 2688))."""

    name = "torchao-order"

    def values(self, x, spec):
        e, s, amax = _witness_factors(quantize_operand(x, spec))
        with np.errstate(invalid="ignore", over="ignore"):
            ts = np.float32(amax) / np.float32(2688.0)
            return torch.from_numpy(e.astype(np.float32) * (s.astype(np.float32) * ts))


class OneByteOff(OracleValues):
    """The oracle's tensor with one element code (or one block scale) one step up in
    magnitude in the block holding the tensor's amax, dequantized by the oracle."""

    name = "one-byte-off"

    def __init__(self, field: str) -> None:
        super().__init__()
        self.field = field

    def values(self, x, spec):
        q = quantize_operand(x, spec)
        row = int(x.abs().float().nan_to_num(0.0).amax(dim=1).argmax())
        if self.field == "codes":
            codes = q.codes.clone()
            col = int((codes[row] & 0x7).argmin())  # the smallest magnitude of that row: a step up stays a code
            codes[row, col] += 1
            return replace(q, codes=codes).dequantize()
        scales = q.block_scales.clone()
        scales[row, 0] = torch.clamp(scales[row, 0] + 1, max=0x7E)
        return replace(q, block_scales=scales).dequantize()


def test_an_nvfp4_kernel_dequantizing_as_the_exact_product_rounded_once_passes_nvfp4_1x16():
    # Issue 41: this backend failed 10 of 65 comparisons against the oracle's float32 order.
    assert basic.check_quantize(ExactProduct(), get_recipe("nvfp4-1x16"), torch.Generator().manual_seed(0)) is None


def test_an_nvfp4_kernel_dequantizing_in_torchaos_float32_order_passes(monkeypatch):
    _only(monkeypatch, "magnitude", (torch.float32, torch.bfloat16))
    backend = TorchaoOrder()
    assert basic.check_quantize(backend, get_recipe("nvfp4-1x16"), torch.Generator().manual_seed(0)) is None
    # the order differs from the oracle's somewhere on these inputs: the pass is the judge's
    x = basic.magnitude_tensor(torch.Generator().manual_seed(0), 32, 128, torch.float32, 3.0)
    spec = get_recipe("nvfp4-1x16").x_row
    got, want = backend.values(x, spec), quantize_operand(x, spec).dequantize()
    assert not torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("field", ["codes", "block_scales"])
def test_one_element_code_or_one_block_scale_off_still_fails_on_values(monkeypatch, field):
    _only(monkeypatch, "magnitude", (torch.float32,))
    with pytest.raises(NumericsError, match=r"fake_quantize of recipe nvfp4-1x16, backend one-byte-off: \d+ of"):
        basic.check_quantize(OneByteOff(field), get_recipe("nvfp4-1x16"), torch.Generator().manual_seed(0))


def test_an_absolute_threshold_on_the_block_scale_fails_with_the_lost_tensor_line_first():
    with pytest.raises(NumericsError) as e:
        basic.check_quantize(ExactProduct(threshold=1e-5), get_recipe("nvfp4-1x16"), torch.Generator().manual_seed(0))
    lines = str(e.value).splitlines()
    assert re.match(r"x_row loses the tensor at amax \S+ \(\w+\): SNR 0\.0 dB, oracle \d+\.\d dB, ([\d,]+) of \1 values 0",
                    lines[0]), lines[0]
    assert re.match(r"\d+ of \d+ quantize inputs lose signal", lines[1]), lines[1]


def test_a_values_backend_that_loses_the_tensor_leaves_a_failed_snr_record(monkeypatch):
    _only(monkeypatch, "magnitude", (torch.float32,))
    records = []
    numerics = Numerics(records.append, "test_x", backend="exact-product")
    with pytest.raises(NumericsError) as info:
        basic.check_quantize(ExactProduct(threshold=1e-5), get_recipe("nvfp4-1x16"), torch.Generator().manual_seed(0),
                             numerics)
    lost = [r for r in records if r.kind == "snr" and not r.passed]
    assert lost and all(r.threshold_db == r.extra["oracle_snr_db"] - LOST_MARGIN_DB for r in lost)
    assert re.match(r"x_row loses the tensor at amax", worst(records).message), worst(records).message
    assert str(info.value).splitlines()[0] == worst(records).message


class EvenAtE2m1Width(OracleValues):
    """MXFP8 e4m3 values whose block exponent is the even rule at e2m1's mantissa width: amax
    rounded to 2 significant bits (float32 bits + 2^21), then floored (a released library's
    MXFP8, issue 41). Written from the rule, not from the catalogue."""

    name = "even-at-e2m1-width"

    def values(self, x, spec):
        blocks = x.float().reshape(x.shape[0], -1, 32)
        amax = blocks.abs().amax(dim=-1, keepdim=True)
        bits = (amax.view(torch.int32) + (1 << 21)) & 0x7F800000
        e = torch.clamp((bits >> 23) - 127 - 8, -127, 127).float()  # e4m3's emax is 8
        scaled = mxcheck.cast(blocks / torch.exp2(e), "e4m3")
        return (scaled * torch.exp2(e)).reshape(x.shape)


def test_values_attribution_heads_with_the_exact_fit_and_the_summary_adds_up(monkeypatch):
    # The ceil rule also reproduces every block whose amax rounds up, and changes blocks the
    # kernel gets right; the first cover used to name it.
    _only(monkeypatch, "magnitude", (torch.float32,))
    with pytest.raises(NumericsError) as e:
        basic.check_quantize(EvenAtE2m1Width(), get_recipe("ocp-mxfp8-e4m3"), torch.Generator().manual_seed(0))
    text = str(e.value)
    cause = text.splitlines()[text.splitlines().index("cause:") + 1]
    assert "even scale rule at 1-bit mantissa width" in cause, text
    assert "ceil scale rule" not in cause
    summed = re.match(r"  ([\d,]+) of the ([\d,]+) differing blocks examined", cause)
    per = re.findall(r"^  ([\d,]+) of ([\d,]+) differing blocks are reproduced by: even scale rule at 1-bit",
                     text, flags=re.M)
    assert per and summed
    assert int(summed[1].replace(",", "")) == sum(int(n.replace(",", "")) for n, _ in per)
    assert int(summed[2].replace(",", "")) == sum(int(m.replace(",", "")) for _, m in per)


def test_dump_writes_every_failing_values_comparison_with_the_codes_the_values_say(tmp_path, monkeypatch):
    from mxcheck.diagnose import load_dump
    from mxcheck.diagnose.dump import DUMP_ENV

    monkeypatch.setenv(DUMP_ENV, str(tmp_path))
    _only(monkeypatch, "magnitude", (torch.float32,))
    with pytest.raises(NumericsError) as e:
        basic.check_quantize(OneByteOff("codes"), get_recipe("nvfp4-1x16"), torch.Generator().manual_seed(0))
    records = load_dump(tmp_path)
    assert len(records) == int(re.search(r": (\d+) of \d+ comparisons of values differ", str(e.value))[1])
    for r in records:
        assert r["check"].startswith("fake_quantize-nvfp4-1x16") and len(r["blocks"]) == 1
        (row,) = r["rows"].tolist()
        # the one code stepped up, read back from the values under the oracle's scales
        changed = (r["kernel"]["codes"][0] != r["oracle"]["codes"][0]).nonzero().flatten().tolist()
        assert len(changed) == 1
        col = changed[0]
        assert int(r["kernel"]["codes"][0, col]) == int(r["oracle"]["codes"][0, col]) + 1, (row, col)


class NaNIgnored(OracleValues):
    """NVFP4 values of x with its NaNs read as 0 (an amax that skips NaN, as fmaxf does):
    every value of an input holding a NaN differs from the oracle's NaN."""

    name = "nan-ignored"

    def values(self, x, spec):
        return quantize_operand(torch.nan_to_num(x, nan=0.0, posinf=float("inf"), neginf=float("-inf")),
                                spec).dequantize()


def test_an_nvfp4_values_backend_differing_on_a_nan_input_fails_with_counts_not_a_crash(monkeypatch):
    # Issue 41: a catalogue behaviour builds an NVFP4 tensor with block scale 0xFF, whose
    # dequantization raised IndexError inside the attribution.
    _only(monkeypatch, "one-nan", (torch.float32,))
    with pytest.raises(NumericsError, match=r"backend nan-ignored: \d+ of \d+ comparisons of values differ"):
        basic.check_quantize(NaNIgnored(), get_recipe("nvfp4-1x16"), torch.Generator().manual_seed(0))


def test_an_edge_shape_values_difference_is_attributed_as_the_quantize_checks_are():
    from mxcheck.conformance.edges import EDGE_SHAPES

    shape = next(name for name, (m, n, k, _) in EDGE_SHAPES.items() if k % 32 == 0 and m > 1)
    with pytest.raises(NumericsError) as e:
        edge_shape_outcome(CeilRule(), get_recipe("ocp-mxfp8-e4m3"), shape, torch.Generator().manual_seed(0))
    text = str(e.value)
    assert re.search(r"fake_quantize of recipe ocp-mxfp8-e4m3 at M=\d+ N=\d+ K=\d+: 1 of 1 comparisons of values differ",
                     text), text
    assert re.search(r"^  ([\d,]+) of \1 differing blocks are reproduced by: ceil scale rule", text, flags=re.M), text
