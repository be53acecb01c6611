"""The conventions AMD Quark's residuals named (amd-quark 0.12.post1 and 0.13): an MX scale held as
a float in the input's dtype (``Profile.scale_storage``), an FP8 dequantization scale amax / 448
divided in the input's dtype (``FP8Profile.descale``), NVFP4 zero scales filled with float32 eps
(``NVFP4Profile.zero_scale_fill``). Expected bits are worked out in the comments; where Quark is
installed (the survey's venvs), its own fake quantizers are held to the same bits."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from mxcheck.conformance.accuracy import CASES, run_case
from mxcheck.profiles import FP8Profile, NVFP4Profile, Profile

pytestmark = pytest.mark.emulated

EPS = 2.0**-23  # torch.finfo(torch.float32).eps, Quark's stand-in for a 0 scale


def _bits(t: torch.Tensor) -> list[int]:
    return t.float().contiguous().view(torch.int32).flatten().tolist()


# ---- MX: scale_storage="input_dtype" ------------------------------------------------------------

def test_a_float32_block_below_2_to_the_minus_127_keeps_its_finer_float_scale():
    # amax 3 * 2^-129 (float32 subnormal, bits 0x00300000): the floor rule gives e = -127 - 2
    # (a subnormal amax reads as 2^-127, e2m1 emax 2) = -129. E8M0 clamps to 2^-127: 0.75 ties
    # to even, 1.0 -> 2^-127 (0x00400000). As a float 2^-129: 3 exactly -> 3 * 2^-129 (0x00300000).
    x = torch.full((1, 32), 3 * 2.0**-129)
    oracle = Profile("ocp", scale_rule="floor").quantized(x, "e2m1").dequantize()
    held = Profile("quark", scale_rule="floor", scale_storage="input_dtype").quantized(x, "e2m1")
    assert _bits(oracle[0, :1]) == [0x00400000]
    assert _bits(held.dequantize()[0, :1]) == [0x00300000]
    assert held.scales.tolist() == [[0]]  # the byte is E8M0's clamp of the same exponent


def test_a_float16_block_whose_scale_underflows_is_divided_by_eps():
    # float16 block of 2^-24 (its smallest subnormal): floor gives e = -24 - 2 = -26 (e2m1);
    # 2^-26 is 0 in float16, so the scale is eps 2^-23: 2^-24 / 2^-23 = 0.5 -> e2m1 0.5, value
    # 2^-24 (0x33800000). (E8M0's 2^-26 gives 4 -> 2^-24 too: float16's grid is this coarse.)
    x = torch.full((1, 32), 2.0**-24, dtype=torch.float16)
    held = Profile("quark", scale_rule="floor", scale_storage="input_dtype").quantized(x, "e2m1")
    assert float(held.decode_scales[0, 0]) == EPS
    assert _bits(held.dequantize()[0, :1]) == [0x33800000]


def test_a_bfloat16_block_below_2_to_the_minus_125_comes_back_as_zeros():
    # bf16 block of 2^-130 (a bf16 subnormal): e = -127 (a subnormal amax reads as 2^-127 from its
    # bits) - 8 = -135; 2^-135 is below bf16's smallest subnormal 2^-133: 0, so eps 2^-23; then
    # 2^-130 / 2^-23 = 2^-107 rounds to e4m3 0: value +0. E8M0 clamps to 2^-127: 2^-3 -> e4m3
    # 0.125, value 2^-130 (float32 subnormal 2^19 * 2^-149: 0x00080000).
    x = torch.full((1, 32), 2.0**-130, dtype=torch.bfloat16)
    oracle = Profile("ocp", scale_rule="floor").quantized(x, "e4m3").dequantize()
    held = Profile("quark", scale_rule="floor", scale_storage="input_dtype").quantized(x, "e4m3").dequantize()
    assert _bits(oracle[0, :1]) == [0x00080000]
    assert _bits(held[0, :1]) == [0]


@pytest.mark.parametrize(("fields", "match"), [
    ({"scale_storage": "float"}, r"scale_storage='float'; expected one of \['e8m0', 'input_dtype'\]"),
    ({"scale_storage": "input_dtype", "subnormal_scale_clamp": 1.0}, "takes no subnormal_scale_clamp")])
def test_a_bad_scale_storage_names_the_field_and_what_is_accepted(fields, match):
    with pytest.raises(ValueError, match=match):
        Profile("p", **fields)


# ---- FP8: descale="quotient_input" ------------------------------------------------------------

def test_an_fp8_tensor_is_divided_by_amax_over_448_in_its_own_dtype():
    # bf16 [0.5, 0.3]: amax 0.5, s = 0.5 / 448 in bf16 = 2^-1 / (7 * 2^6) = 2^-7 / 7
    # = 0.00111607 -> bf16 0.0011138916015625 (0x3a920000, 146/128 * 2^-10). 0.3 (bf16
    # 0.30078125) / s = 270.03 -> bf16 270 -> e4m3 256 (spacing 32 above 256: 270 is nearer 256);
    # value 256 * s = 0.28515625 (0x3e920000). The oracle's scale 448 / 0.5 = 896: 0.30078125 *
    # 896 = 269.5 -> e4m3 256, value 256 / 896 = 0.2857142984867096 (0x3e924925).
    x = torch.tensor([[0.5, 0.3]], dtype=torch.bfloat16)
    held = FP8Profile("quark", descale="quotient_input").quantized(x, "e4m3")
    assert _bits(held.scale_inv) == [0x3A920000]
    assert _bits(held.dequantize()[0, 1:]) == [0x3E920000]
    assert _bits(FP8Profile("te").quantized(x, "e4m3").dequantize()[0, 1:]) == [0x3E924925]


def test_an_fp8_tensor_with_an_inf_is_all_nan_under_the_quotient_descale():
    # amax Inf: s = Inf, x / Inf = 0 (Inf / Inf = NaN), value 0 * Inf = NaN: every value NaN.
    x = torch.tensor([[1.0, float("inf"), -2.0]])
    assert bool(FP8Profile("quark", descale="quotient_input").quantized(x, "e4m3").dequantize().isnan().all())


def test_a_bad_descale_names_the_field_and_what_is_accepted():
    with pytest.raises(ValueError, match=r"descale='x'; expected one of \['reciprocal', 'quotient_input'\]"):
        FP8Profile("p", descale="x")
    with pytest.raises(ValueError, match="takes scale_arithmetic='float32' and multiply_dtype='float32'"):
        FP8Profile("p", descale="quotient_input", multiply_dtype="input")


# ---- NVFP4: zero_scale_fill ------------------------------------------------------------

QUARK_NVFP4 = {"block_scale": "quotient", "element_scale": "divide_product", "zero_sign": "never"}


def test_an_all_zero_nvfp4_tensor_quantizes_to_zeros_with_the_eps_fill():
    # amax 0: ts = 0 / 2688 = 0 -> eps; vec_max / 6 = 0 -> eps; block scale eps / eps = 1.0
    # (ue4m3 0x38); elements 0 / (1 * eps) = 0: every value +0. Without the fill: 0 / 0, NaN.
    x = torch.zeros(2, 32)
    filled = NVFP4Profile("quark", **QUARK_NVFP4, zero_scale_fill=EPS).quantized(x)
    assert filled.block_scales.unique().tolist() == [0x38]
    assert _bits(filled.dequantize()) == [0] * 64
    assert bool(NVFP4Profile("q", **QUARK_NVFP4).quantized(x).dequantize().isnan().all())


def test_a_block_whose_scale_rounds_to_zero_keeps_the_signs_of_its_codes_at_eps():
    # tensor amax 336 (ts = 0.125); block amax 8e-7: (8e-7 / 6) / 0.125 = 1.07e-6 rounds to ue4m3 0.
    # Its elements are divided by eps instead: -8e-7 / 2^-23 = -6.7 -> e2m1 -6, value -6 * 0 = -0;
    # -2e-8 / 2^-23 = -0.17 -> e2m1 0 (+0, -0 lost), value +0.
    x = torch.zeros(1, 32)
    x[0, 0] = 336.0
    x[0, 16], x[0, 17] = -8e-7, -2e-8
    v = NVFP4Profile("quark", **QUARK_NVFP4, zero_scale_fill=EPS).quantized(x).dequantize()
    assert _bits(v[0, 16:18]) == [-(2**31), 0]


def test_the_eps_fill_needs_a_block_scale_that_reads_ts():
    with pytest.raises(ValueError, match="needs one of them, got block_scale='te'"):
        NVFP4Profile("p", zero_scale_fill=EPS)


# ---- the cause-accuracy cases modelled on them ---------------------------------------------

@pytest.mark.parametrize("name", ["bad-mx-float-scale", "seeded-fp8-descale-input-dtype",
                                  "seeded-nvfp4-zero-scale-eps"])
def test_each_quark_modelled_case_is_headed_by_its_true_cause(name):
    case = next(c for c in CASES if c.name == name)
    outcome = run_case(case, quick=True)
    assert outcome.failed and outcome.headline == (case.truth,), outcome


# ---- Quark's own code on one block (skipped where amd-quark is not installed) ---------------------

_QUARK = importlib.util.find_spec("quark") is not None
needs_quark = pytest.mark.skipif(not _QUARK, reason="amd-quark not installed (the survey's venvs hold 0.12.post1, 0.13)")


def _quark_values(spec_name: str, x: torch.Tensor, **kwargs: object) -> torch.Tensor:
    os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")
    from quark.torch.quantization.config import config
    from quark.torch.quantization.tensor_quantize import FakeQuantizeBase

    spec = getattr(config, spec_name)(**kwargs)
    with torch.no_grad():
        return FakeQuantizeBase.get_fake_quantize(spec.to_quantization_spec())(x.clone())


def _quark_nvfp4(x: torch.Tensor) -> torch.Tensor:
    from mxcheck.backends.quark_backend import QuarkBackend
    from mxcheck.recipes import get_recipe

    return QuarkBackend().fake_quantize(x, get_recipe("nvfp4-1x16").x_row)  # a fresh two-stage module


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.dtype == want.dtype and torch.equal(got.view(torch.int16 if got.element_size() == 2 else torch.int32),
                                                   want.view(torch.int16 if want.element_size() == 2 else torch.int32))


@needs_quark
@pytest.mark.parametrize(("spec_name", "fmt", "zero_sign", "value", "dtype"), [
    ("OCP_MXFP4Spec", "e2m1", "never", 3 * 2.0**-129, torch.float32),
    ("OCP_MXFP8E4M3Spec", "e4m3", "source", 2.0**-130, torch.bfloat16),
    ("OCP_MXFP8E4M3Spec", "e4m3", "source", 1e-7, torch.float16)], ids=["fp4-f32", "fp8-bf16", "fp8-f16"])
def test_quarks_mx_floor_mode_is_the_float_scale_in_the_input_dtype(spec_name, fmt, zero_sign, value, dtype):
    g = torch.Generator().manual_seed(7)
    x = (torch.rand(2, 32, generator=g) * 2 - 1).mul(value / 0.99).to(dtype)
    want = _quark_values(spec_name, x, ch_axis=-1, scale_calculation_mode="floor")
    p = Profile("quark", scale_rule="floor", exponent_source="log2_input", scale_storage="input_dtype",
                zero_sign=zero_sign)
    assert _same_bits(p.quantized(x, fmt).dequantize().to(dtype), want)


@needs_quark
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_quarks_fp8_per_tensor_is_the_quotient_descale_in_the_input_dtype(dtype):
    x = (torch.randn(4, 64, generator=torch.Generator().manual_seed(3)) * 4.6).to(dtype)
    want = _quark_values("FP8E4M3PerTensorSpec", x, observer_method="min_max", is_dynamic=True)  # a fresh module
    assert _same_bits(FP8Profile("quark", descale="quotient_input").quantized(x, "e4m3").dequantize().to(dtype), want)


@needs_quark
@pytest.mark.parametrize("case", ["zeros", "underflowing-block", "tiny-tensor"])
def test_quarks_nvfp4_scheme_is_the_eps_fill(case):
    x = torch.zeros(2, 32)
    if case == "underflowing-block":
        x[0, 0], x[0, 16:20] = 336.0, torch.tensor([-8e-7, 1.7e-9, -2.2e-8, 4e-7])
    elif case == "tiny-tensor":
        x[1, 3] = 1.4e-45  # the smallest float32 subnormal: ts = 1.4e-45 / 2688 = 0
    want = _quark_nvfp4(x)
    got = NVFP4Profile("quark", **QUARK_NVFP4, zero_scale_fill=EPS).quantized(x).dequantize()
    assert _same_bits(got, want)
