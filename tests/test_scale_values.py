"""MX block scales that are not powers of two (``mxcheck.diagnose.scale_values``): the values
each behaviour gives, worked out by hand with numpy float32/float16 arithmetic (the released
code's steps), and brevitas' own quantizer reproduced bit for bit where brevitas is installed."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from mxcheck.conformance.values_judge import values_agree
from mxcheck.diagnose import CATALOGUE
from mxcheck.diagnose.compare import _element_diffs, compared_fields
from mxcheck.gemm import quantize_operand
from mxcheck.profiles import Profile
from mxcheck.recipes import OperandSpec

pytestmark = pytest.mark.emulated

E4M3 = OperandSpec("e4m3", "mx")
E2M1 = OperandSpec("e2m1", "mx")
FLOOR = CATALOGUE["mx_scale_floor_after_pow2"].run
IN_DTYPE = CATALOGUE["mx_scale_in_input_dtype"].run
DIVIDED = CATALOGUE["mx_scale_divided_by_0.75"].run
FP8_DIVIDE = CATALOGUE["fp8_divide_by_amax_over_max"].run
FP8 = OperandSpec("e4m3", "tensor")


def blocks(*rows: tuple[float, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One 32-element block per row, the given values first, zeros after."""
    x = torch.zeros(len(rows), 32, dtype=torch.float64)
    for i, values in enumerate(rows):
        x[i, : len(values)] = torch.tensor(values, dtype=torch.float64)
    return x.to(dtype)


def values_of(behaviour, x: torch.Tensor, spec: OperandSpec) -> torch.Tensor:
    q = behaviour(x, spec, quantize_operand(x, spec))
    assert q is not None
    return q.dequantize()


def test_a_float32_block_under_2_pow_minus_33_is_quantized_on_the_floor_scale():
    # s = max(2^floor(log2 1e-11), 1e-10) / 2^8 = float32(1e-10) / 256 (2^-37 < 1e-10); 1e-11 / s
    # = 25.6 in float32, e4m3 RNE on [16, 32) (step 2): 26; value 26 * s in float32. A block of
    # 1e-20 is 1.3e-7 steps of s: under e4m3's smallest subnormal 2^-9, so 0. A block of 1.0
    # keeps its power-of-two scale 2^-8 (its values are the oracle's).
    s = np.float32(1e-10) / np.float32(256)
    q = np.float32(np.float32(1e-11) / s)
    assert q == np.float32(25.6)
    x = blocks((1e-11, -5e-12), (1e-20,), (1.0, 0.3))
    got = values_of(FLOOR, x, E4M3)
    assert got[0, 0].item() == float(np.float32(26) * s)
    assert got[0, 1].item() == float(np.float32(-13) * s)  # 5e-12 / s = 12.8 -> 13 (step 1 on [8, 16))
    assert got[1].count_nonzero() == 0
    oracle = quantize_operand(x, E4M3).dequantize()
    assert torch.equal(got[2], oracle[2])
    assert got[0, 0].item() != oracle[0, 0].item()  # the oracle keeps 1e-11 on the 2^-44 grid


def test_float16_arithmetic_makes_zero_and_underflowing_blocks_nan():
    # float16(1e-10) = 0: a zero block's scale is max(2^-119 -> 0, 0) / 2^8 = 0 and 0 / 0 is NaN.
    # amax 2^-17: 2^-17 / 2^8 = 2^-25 rounds to 0 in float16 (a tie, to even): NaN. amax 2^-16:
    # 2^-24 is float16's smallest subnormal, kept: the oracle's values.
    assert np.float16(1e-10) == 0 and np.float16(2.0**-25) == 0 and np.float16(2.0**-24) == 2.0**-24
    x = blocks((), (2.0**-17,), (2.0**-16, 2.0**-18), dtype=torch.float16)
    for behaviour in (FLOOR, IN_DTYPE):
        got = values_of(behaviour, x, E4M3)
        assert bool(got[:2].isnan().all()), behaviour
        assert torch.equal(got[2], quantize_operand(x, E4M3).dequantize()[2])


def test_without_a_floor_float32_and_bf16_scales_change_nothing():
    x = blocks((1e-11,), (3.0, 1e-30))
    assert IN_DTYPE(x, E4M3, quantize_operand(x, E4M3)) is None
    assert IN_DTYPE(x.to(torch.bfloat16), E4M3, quantize_operand(x.to(torch.bfloat16), E4M3)) is None


def test_a_scale_divided_by_0_75_puts_the_block_on_a_grid_four_thirds_coarser():
    # amax 4: OCP floor scale 2^(2 - 2) = 1, s = float32(1 / 0.75) = 1.3333334; 4 / s = 3.0 -> e2m1 3
    # (exact), 1 / s = 0.75 -> the tie between 0.5 and 1.0, to even: 1.0; values k * s in float32.
    s = np.float32(1.0) / np.float32(0.75)
    assert np.float32(4) / s == np.float32(3.0) and np.float32(1) / s == np.float32(0.75)
    got = values_of(DIVIDED, blocks((4.0, 1.0, -2.0)), E2M1)
    assert got[0, :3].tolist() == [float(np.float32(3) * s), float(s), float(np.float32(-1.5) * s)]


def test_fp8_divided_by_amax_over_max_in_float16_rounds_the_quotient_and_the_scale_there():
    # s = float16(3) / float16(448) = 0.006694793701171875 (float16); 1.0 / s = 149.375 in float16,
    # e4m3 RNE on [128, 256) (step 16): 144; 144 * s = 0.9638671875 in float16. The oracle's
    # 1.0 * (448 / 3) = 149.33 -> 144, times 3 / 448 in float32 -> float16: 0.96435546875.
    s = np.float16(3.0) / np.float16(448.0)
    assert float(s) == 0.006694793701171875 and float(np.float16(1.0) / s) == 149.375
    x = torch.tensor([[3.0, 1.0, -0.0]], dtype=torch.float16)
    got = values_of(FP8_DIVIDE, x, FP8).to(torch.float16)
    assert got[0, 1].item() == float(np.float16(np.float16(144.0) * s)) == 0.9638671875
    assert quantize_operand(x, FP8).dequantize().to(torch.float16)[0, 1].item() == 0.96435546875


def test_fp8_divided_by_amax_over_max_makes_an_inf_tensor_and_a_float16_zero_tensor_nan():
    # Inf / 448 = Inf: x / Inf = 0 and 0 * Inf is NaN; float16(1e-10) = 0: 0 / (0 / 448) is NaN
    for x in (torch.tensor([[1.0, float("inf"), 2.0]]), torch.zeros(2, 4, dtype=torch.float16)):
        assert bool(values_of(FP8_DIVIDE, x, FP8).isnan().all())


@pytest.mark.parametrize("key", ["mx_scale_floor_after_pow2", "mx_scale_divided_by_0.75"])
def test_a_non_power_of_two_scale_never_matches_a_codes_kernel(key):
    # the result has no E8M0 scales: on the codes path its fields cannot be compared
    x = blocks((1e-11,), (4.0, 1.0))
    q = CATALOGUE[key].run(x, E2M1, quantize_operand(x, E2M1))
    assert isinstance(_element_diffs(q, quantize_operand(x, E2M1), compared_fields(quantize_operand(x, E2M1))), str)


# ---- brevitas' own code (skipped where brevitas is not installed) --------------------------


def _brevitas_values(x: torch.Tensor, bits: int, ebits: int, mbits: int) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from brevitas.nn import QuantIdentity
        from brevitas.quant.mx_quant_ocp import MXFloat8e4m3Act
        quant = MXFloat8e4m3Act.let(bit_width=bits, exponent_bit_width=ebits, mantissa_bit_width=mbits)
        with torch.no_grad():
            return QuantIdentity(act_quant=quant, group_dim=-1, return_quant_tensor=True).eval()(x).value


@pytest.mark.parametrize(("fmt", "widths"), [("e4m3", (8, 4, 3)), ("e5m2", (8, 5, 2)), ("e2m1", (4, 2, 1))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_brevitas_mx_quantizer_is_the_floor_after_pow2_on_its_log2_profile(fmt, widths, dtype):
    """brevitas 0.13.4 (core/scaling/runtime.py:237, core/restrict_val.py:56-59): its values
    are this behaviour applied to the profile with a log2 in the input's dtype, bit for bit, on
    blocks under 2^-33 (float32, bf16), zero and tiny float16 blocks, and ordinary blocks."""
    pytest.importorskip("brevitas")
    x = blocks((1e-11, -3e-12, 7e-13), (1e-20, 2e-21), (), (2.0**-17, 1e-6), (0.75, -0.3, 1.5), (255.0, 3.0),
               dtype=dtype)
    spec = OperandSpec(fmt, "mx")
    got = _brevitas_values(x, *widths)
    q = Profile("log2-input", exponent_source="log2_input").quantized(x, fmt)
    model = FLOOR(x, spec, q)
    assert model is not None
    assert bool(values_agree(got, model).all()), (got, model.dequantize())


def _brevitas_per_tensor(x: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from brevitas import quant
        from brevitas.nn import QuantLinear
        layer = QuantLinear(x.shape[1], x.shape[0], bias=False, weight_quant=quant.Fp8e4m3OCPWeightPerTensorFloat,
                            dtype=x.dtype)
        with torch.no_grad():
            layer.weight.copy_(x)
            return layer.quant_weight().value


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("amax", [1e-8, 0.123, 3.0, 6e4])
def test_brevitas_fp8_per_tensor_is_the_divide_by_amax_over_max(dtype, amax):
    """brevitas 0.13.4 Fp8e4m3OCPWeightPerTensorFloat (quant/float_base.py:24-48,
    core/quant/float.py:69-79): its values are this behaviour's, bit for bit."""
    pytest.importorskip("brevitas")
    x = (torch.linspace(-1, 1, 4 * 64, dtype=torch.float64).reshape(4, 64) ** 3 * amax).to(dtype)
    got = _brevitas_per_tensor(x)
    model = FP8_DIVIDE(x, FP8, quantize_operand(x, FP8))
    model = quantize_operand(x, FP8) if model is None else model
    assert bool(values_agree(got, model).all())
