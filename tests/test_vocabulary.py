"""The vocabulary from released libraries: each new convention and failure gives the bits
worked out by hand here (from the released code's arithmetic), not by the code under test."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mxcheck.diagnose.failures import _fp8_eps_floor, _zero_block_byte
from mxcheck.diagnose.precision import (
    mx_divide_by_underflowed_pow2,
    mx_subnormal_amax_float16,
    mx_zero_block_nan_float16,
    nvfp4_encode_factor,
)
from mxcheck.gemm import quantize_operand
from mxcheck.profile_kinds import ENCODE_FACTORS
from mxcheck.profiles import Profile
from mxcheck.recipes import RECIPES, OperandSpec

pytestmark = pytest.mark.emulated

E4M3_MX = OperandSpec("e4m3", "mx")


def one_block(*values: float, dtype: torch.dtype = torch.float32, size: int = 32) -> torch.Tensor:
    x = torch.zeros(1, size, dtype=dtype)
    x[0, : len(values)] = torch.tensor(values, dtype=torch.float64).to(dtype)
    return x


def test_floor_half_in_float32_rounds_a_quarter_quantum_below_the_tie_up():
    # e2m1 at scale 2^0 (amax 4: floor(log2 4) - emax 2 = 0); e2m1's quantum below 1 is 0.5,
    # so 0.25 - 2^-26 is t = 0.5 - 2^-25 quanta; t + 0.5 = 1 - 2^-25 is a float32 tie between
    # 1 - 2^-24 and 1.0, rounded to 1.0 (even): floor gives 1 quantum, code 0x1 (0.5). Exact
    # half-away gives 0x0. 0.25 is a tie (0x1 away from zero); 0.25 - 2^-24 sums exactly: 0x0.
    x = one_block(4.0, 0.25 - 2**-26, 0.25, 0.25 - 2**-24, -(0.25 - 2**-26))
    summed = Profile("t", rounding="half_away", half_away_sum="float32").quantize(x, "e2m1")[0][0, :5]
    exact = Profile("t", rounding="half_away").quantize(x, "e2m1")[0][0, :5]
    assert summed.tolist() == [0x6, 0x1, 0x1, 0x0, 0x9]
    assert exact.tolist() == [0x6, 0x0, 0x1, 0x0, 0x8]


def test_floor_half_in_the_inputs_dtype_rounds_a_bf16_below_tie_up():
    # microxcaling on bf16 (tools/user_trial/microxcaling_adapter.py): bf16 0x3dff = 0.12451171875
    # at scale 2^-1 (amax 2: 1 - 2) is t = 0.498046875 = 0.5 - 2^-9 quanta; in bf16, t + 0.5 =
    # 1 - 2^-9 ties between 1 - 2^-8 and 1.0 and rounds to 1.0: code 0x1. In float32 it is exact: 0x0.
    x = one_block(2.0, 0.12451171875, dtype=torch.bfloat16)
    assert x[0, 1].view(torch.int16).item() == 0x3DFF
    profile = Profile("t", rounding="half_away", half_away_sum="input")
    assert profile.quantize(x, "e2m1")[0][0, 1].item() == 0x1
    assert Profile("t", rounding="half_away", half_away_sum="float32").quantize(x, "e2m1")[0][0, 1].item() == 0x0


def test_half_away_sum_needs_ties_away():
    with pytest.raises(ValueError, match=r"half_away_sum='float32'.*needs rounding='half_away'"):
        Profile("t", half_away_sum="float32")
    with pytest.raises(ValueError, match=r"half_away_sum='float64'; expected one of \['exact', 'float32', 'input'\]"):
        Profile("t", rounding="half_away", half_away_sum="float64")


@pytest.mark.parametrize("amax", [4.59375, 0.7, 3.0e-3, 123.456, 1.0e-20])
def test_nvfp4_reciprocal_encode_factor_is_2688_times_the_float32_reciprocal(amax):
    a = np.float32(amax)
    want = np.float32(2688) * (np.float32(1) / a)  # numpy's float32 arithmetic, as the kernel writes it
    s_enc, ts = ENCODE_FACTORS["reciprocal"](torch.tensor(amax, dtype=torch.float32))
    assert s_enc.item() == float(want)
    assert ts.item() == float(a / np.float32(2688))


def test_the_reciprocal_factor_differs_from_the_quotient_on_the_measured_amax():
    # amax 4.59375 (bf16 4.6, the magnitude family's): 2688 / amax and 2688 * (1 / amax) are
    # one float32 ulp apart (numpy), the difference the element ties then show.
    a = np.float32(4.59375)
    quotient, product = np.float32(2688) / a, np.float32(2688) * (np.float32(1) / a)
    assert product != quotient and abs(int(product.view(np.int32)) - int(quotient.view(np.int32))) == 1


def test_an_uncapped_encode_factor_is_inf_below_7_9e_36_and_its_decode_scale_0():
    s_enc, ts = ENCODE_FACTORS["uncapped"](torch.tensor(5.0e-36))
    assert math.isinf(s_enc.item()) and ts.item() == 0.0
    x = torch.zeros(16, 32)
    x[0, 0] = 5.0e-36
    q = nvfp4_encode_factor("uncapped")(x, RECIPES["nvfp4"].x_row, quantize_operand(x, RECIPES["nvfp4"].x_row))
    assert q.tensor_scale.item() == 0.0
    # block 0: vec_max * (Inf / 6) capped at FLT_MAX -> ue4m3 448 (0x7E); a zero block: 0 * Inf = NaN (0x7F)
    assert q.block_scales[0, :2].tolist() == [0x7E, 0x7F]


def test_the_float16_fallback_gives_scale_1_only_where_2688_over_amax_overflows_float16():
    spec = RECIPES["nvfp4"].x_row
    run = nvfp4_encode_factor("te", 65504.0)
    for amax, fallback in ((0.03, True), (0.05, False)):  # 2688 / 0.03 = 89600 > 65504; / 0.05 = 53760
        x = torch.zeros(16, 32)
        x[0, 0] = amax
        q = run(x, spec, quantize_operand(x, spec))
        assert (q.tensor_scale.item() == 1.0) is fallback, amax


def test_a_float16_block_whose_amax_is_subnormal_stores_byte_127_and_zero_codes():
    # amax 2^-15 is a float16 subnormal (0x0200): the oracle's byte is -15 - 8 + 127 = 104
    x = one_block(2.0**-15, 2.0**-16, dtype=torch.float16)
    oracle = quantize_operand(x, E4M3_MX)
    assert oracle.scales.item() == 104
    q = mx_subnormal_amax_float16(x, E4M3_MX, oracle)
    assert q.scales.item() == 127 and not q.codes.any()


def test_x_over_an_underflowed_float16_power_of_two_gives_nan_codes():
    # amax 2^-20: byte -20 - 8 + 127 = 99, 2^-28 is 0 in float16: x / 0 = Inf -> e4m3 NaN 0x7F,
    # -x / 0 -> 0xFF, 0 / 0 = NaN (code 0x7F or 0xFF, by the NaN's sign)
    x = one_block(2.0**-20, -(2.0**-21), dtype=torch.float16)
    q = mx_divide_by_underflowed_pow2(x, E4M3_MX, quantize_operand(x, E4M3_MX))
    assert q.scales.item() == 99
    assert q.codes[0, :2].tolist() == [0x7F, 0xFF]
    assert bool(((q.codes[0, 2:] & 0x7F) == 0x7F).all())


def test_an_all_zero_float16_block_becomes_a_nan_block():
    x = torch.zeros(1, 64, dtype=torch.float16)
    x[0, 40] = 1.0
    q = mx_zero_block_nan_float16(x, E4M3_MX, quantize_operand(x, E4M3_MX))
    assert q.scales.tolist() == [[0xFF, 127 - 8]]  # block 0 NaN; block 1: amax 1, 0 - 8 + 127
    assert bool((q.codes[0, :32] == 0x7F).all())


def test_torchaos_eps_floor_gives_a_zero_row_scale_inv_2_pow_minus_48():
    # 448 / 1e-12 = 4.48e14, rounded down to a power of two: 2^48; scale_inv 2^-48 = 0x27800000
    spec = RECIPES["fp8-rowwise"].x_row
    x = torch.ones(2, 128)
    x[1] = 0.0
    oracle = quantize_operand(x, spec)
    q = _fp8_eps_floor(x, spec, oracle)
    assert q.scale_inv.view(torch.int32).flatten().tolist() == [oracle.scale_inv.view(torch.int32).flatten()[0].item(),
                                                                 0x27800000]


def test_a_zero_block_byte_moves_only_all_zero_blocks():
    x = torch.zeros(1, 64)
    x[0, 3] = 1.0
    q = _zero_block_byte(85)(x, E4M3_MX, quantize_operand(x, E4M3_MX))
    assert q.scales.tolist() == [[119, 85]]
