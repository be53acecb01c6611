"""compressed-tensors' NVFP4, FP8 and MX arithmetic as catalogue behaviours: the bits worked
out here from the released code's arithmetic (numpy and ml_dtypes as witnesses), the
library's own bits where it is installed (0.20.1), and the seeded cases that
``mxcheck accuracy`` counts, each headed by its behaviour."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from mxcheck.backends.known_bad import KNOWN_BAD
from mxcheck.conformance.accuracy import CASES, run_case
from mxcheck.diagnose.failures import FAILURES
from mxcheck.gemm import quantize_operand
from mxcheck.profile_kinds import ENCODE_FACTORS, FP8Profile, NVFP4Profile
from mxcheck.profiles import Profile
from mxcheck.recipes import OperandSpec

pytestmark = pytest.mark.emulated

_NP = {torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16, torch.float32: np.float32}
OVERFLOW = next(b for b in FAILURES if b.key == "mx_overflow_scale_byte_127")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy().astype(_NP[t.dtype])


def _draw(dtype: torch.dtype, amax: float, rows: int = 16, cols: int = 64) -> torch.Tensor:
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(7))
    return (x * (amax / x.abs().max())).to(dtype)


@pytest.mark.parametrize(("dtype", "amax", "s_enc"), [
    (torch.bfloat16, 4.59375, 584.0),  # bf16(1 / 4.59375) = 0.2177734375, * 2688 = 585.375; bf16's step there is 4
    (torch.float16, 0.03, 1.0),  # 2688 / 0.03 = 89600 overflows float16: Inf, replaced by 1
    (torch.float32, 5.0e-36, 1.0),  # 5.4e38 overflows float32 (the oracle caps it at FLT_MAX)
    (torch.float32, 0.0, 1.0),  # max(0, tiny) = 1.2e-38: 2688 / tiny overflows
    (torch.float32, math.nan, 1.0),  # NaN replaced by 1
    (torch.float32, math.inf, 0.0),  # 2688 / Inf = 0 is finite: kept, so the decode scale is Inf
])
def test_the_input_dtype_encode_factor_is_2688_over_amax_in_that_dtype(dtype, amax, s_enc):
    got, ts = ENCODE_FACTORS["input_dtype"](torch.tensor(amax, dtype=torch.float32), dtype)
    assert got.item() == s_enc
    assert ts.item() == (math.inf if s_enc == 0 else float(np.float32(1) / np.float32(s_enc)))


def test_a_negative_value_scaled_to_minus_zero_gets_a_positive_zero_code():
    # an Inf amax: S_enc = 2688 / Inf = 0, so every finite element is x / (s / 0) = x / Inf = -0
    # for x < 0; ModelOpt's _cast_fp4 (weight < 0) and compressed-tensors' cast_to_fp4 (sign(x),
    # here 0) both read the scaled value's sign: code 0x0, where x's own sign would give 0x8
    x = torch.zeros(1, 32)
    x[0, :3] = torch.tensor([math.inf, -1.0, 2.0])
    x[0, 16:18] = torch.tensor([-3.0, 0.5])
    q = NVFP4Profile("t", zero_sign="negative_values", encode_factor="input_dtype",
                     element_scale="divide_product").quantized(x)
    assert math.isinf(q.tensor_scale.item())
    assert q.codes[0, 1:3].tolist() == [0x0, 0x0] and q.codes[0, 16:18].tolist() == [0x0, 0x0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_input_quotient_block_scale_rounds_amax_over_6_to_the_inputs_dtype_first(dtype):
    # calculate_qparams: global_scale * (max_val_pos / 6), the quotient in x's dtype
    x = _draw(dtype, 5.0, 64, 256)
    p = NVFP4Profile("t", encode_factor="input_dtype", block_scale="factor_times_input_quotient")
    q = p.quantized(x)
    vec_max = np.abs(_np(x)).reshape(64, -1, 16).max(-1)
    # generate_gparam's 2688 / amax is torch's float / tensor: the reciprocal, then times 2688, in x's dtype
    s_enc = np.float32((_NP[dtype](1) / np.abs(_np(x)).max()) * _NP[dtype](2688))
    want = (s_enc * (vec_max / _NP[dtype](6)).astype(np.float32)).astype(ml_dtypes.float8_e4m3fn)
    assert q.block_scales.numpy().tolist() == want.view(np.uint8).tolist()
    if dtype is torch.bfloat16:  # bf16's rounding of amax / 6 moves some bytes (float16's, on none of these)
        te = NVFP4Profile("t", encode_factor="input_dtype").quantized(x)
        assert not torch.equal(te.block_scales, q.block_scales)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_input_quotient_fp8_scale_is_amax_over_448_in_the_inputs_dtype(dtype):
    x = _draw(dtype, 3.7)
    x[0, :3] = torch.tensor([-0.0, -1e-30, 0.0]).to(dtype)
    q = FP8Profile("t", scale_arithmetic="input_quotient").quantized(x, "e4m3")
    xs = _np(x)
    scale_inv = np.abs(xs).max() / _NP[dtype](448)
    assert q.scale_inv.item() == float(np.float32(scale_inv))
    scaled = (xs / scale_inv + _NP[dtype](0)).astype(np.float32)  # + the zero point: -0 becomes +0
    want = scaled.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert q.codes.numpy().tolist() == want.tolist()
    assert q.codes[0, :3].tolist() == [0x00, 0x00 if dtype is torch.float16 else 0x80, 0x00]


def test_an_fp8_product_that_underflows_its_dtype_to_minus_zero_gets_a_positive_zero_code():
    # float16 -2^-24 * (448 / 60000) = -4.5e-10 is -0 in float16 (-2^-14 gives -4.6e-7, an e4m3
    # -0): "negative values" reads the value encoded, as the NVFP4 profile does (x's own sign
    # would give 0x80)
    x = torch.tensor([[60000.0, -(2.0**-24), -(2.0**-14)] + [0.0] * 29], dtype=torch.float16)
    q = FP8Profile("t", zero_sign="negative_values", multiply_dtype="input").quantized(x, "e4m3")
    assert q.codes[0, 1].item() == 0x00 and q.codes[0, 2].item() == 0x80


def test_an_fp8_zero_tensor_gets_the_dtypes_eps_as_its_scale():
    for dtype, eps in ((torch.float32, 2.0**-23), (torch.bfloat16, 2.0**-7), (torch.float16, 2.0**-10)):
        q = FP8Profile("t", scale_arithmetic="input_quotient").quantized(torch.zeros(4, 32, dtype=dtype), "e4m3")
        assert q.scale_inv.item() == eps and not q.codes.any()


@pytest.mark.parametrize(("dtype", "amax", "fmt"), [
    (torch.bfloat16, 3.1e38, "e2m1"),  # rounded up past 2^128
    (torch.float16, 59000.0, "e2m1"),  # 1.8 * 2^15 rounds up to 2^16: Inf in float16
    (torch.float32, math.inf, "e4m3"),
])
def test_an_mx_block_whose_scale_overflows_its_dtype_stores_byte_127_and_zero_codes(dtype, amax, fmt):
    x = torch.zeros(1, 64, dtype=dtype)
    x[0, :3] = torch.tensor([amax, -1.5, 2.0]).to(dtype)
    x[0, 32:34] = torch.tensor([4.0, -3.0]).to(dtype)  # a block far from the top: left as it is
    spec = OperandSpec(fmt, "mx", scale_rule="even")
    oracle = quantize_operand(x, spec)
    q = OVERFLOW.run(x, spec, oracle)
    assert q.scales[0].tolist() == [127, oracle.scales[0, 1].item()]
    assert not q.codes[0, :32].any() and torch.equal(q.codes[0, 32:], oracle.codes[0, 32:])


def test_a_block_one_binade_below_the_overflow_is_left_alone():
    x = torch.zeros(1, 32, dtype=torch.float16)
    x[0, 0] = 40000.0  # 1.22 * 2^15 rounds (even rule, e2m1 width) to 2^15: finite in float16
    spec = OperandSpec("e2m1", "mx", scale_rule="even")
    assert OVERFLOW.run(x, spec, quantize_operand(x, spec)) is None


# ---- the seeded cases: each named by its true cause ------------------------------------------


def test_zero_negative_gives_every_exact_zero_the_negative_zero_code():
    # ModelOpt MXFP4 cast_fp4: sign_bit = (2 - sign(x)) // 2, 1 for x = +-0 and x < 0, 0 for x > 0;
    # at scale 2^0 (amax 4): 0.01 and -0.01 round to zero codes 0x0 and 0x8, +0 and -0 to 0x8
    x = torch.zeros(1, 32)
    x[0, :5] = torch.tensor([4.0, 0.0, -0.0, -0.01, 0.01])
    codes, scales = Profile("t", zero_sign="zero_negative").quantize(x, "e2m1")
    assert scales.tolist() == [[127]] and codes[0, :5].tolist() == [0x6, 0x8, 0x8, 0x8, 0x0]
    assert codes[0, 5:].eq(0x8).all()


@pytest.mark.parametrize("name", ["seeded-nvfp4-input-dtype-factor", "seeded-nvfp4-input-dtype-block-quotient",
                                  "seeded-fp8-input-dtype-quotient", "bad-mx-overflow-byte-127",
                                  "seeded-mx-zero-negative"])
def test_a_compressed_tensors_case_is_headed_by_its_true_cause(name):
    case = next(c for c in CASES if c.name == name)
    outcome = run_case(case, quick=True)
    assert outcome.failed and outcome.headline == (case.truth,), outcome


def test_the_overflow_backend_is_known_bad():
    assert "bad-mx-overflow-byte-127" in KNOWN_BAD
