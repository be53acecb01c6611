"""FP8 current scaling against float64 arithmetic + ml_dtypes casts, a transcription of TE's
blockwise reference, and torchao's float8 scale helpers (witness where they agree, pinned
where they do not)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mxcheck
from mxcheck.plugin import needs
from mxcheck.scaling.fp8 import FP8_FORMATS, fp8_quantize
from mxcheck.thresholds import quantize_floor

with needs("ml_dtypes"):
    import ml_dtypes

pytestmark = pytest.mark.emulated

ML_DTYPES = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
}
TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FLT_MAX = float(np.finfo(np.float32).max)


def f32_bits(t) -> np.ndarray:
    return np.asarray(t, dtype=np.float32).view(np.uint32)


def fp8_max(fmt: str) -> float:
    return float(ml_dtypes.finfo(ML_DTYPES[fmt]).max)


# ------------------------------------------------------------------ independent witnesses


def te_scale(amax: float, fmax: float, *, margin=0, power_of_2=False, eps=0.0, inf_value=FLT_MAX) -> float:
    """TE compute_scale_from_amax in Python float64 (recipe_common.cuh).

    A float64 quotient of two float32 values rounded once to float32 equals the float32
    quotient (53 >= 2 * 24 + 2: double rounding of a division is innocuous). The power of
    two is taken with frexp, not with TE's bit mask.
    """
    amax = float(np.float32(amax))
    if amax < float(np.float32(eps)):
        amax = float(np.float32(eps))
    if math.isinf(amax) or math.isnan(amax) or amax == 0:
        return 1.0
    with np.errstate(over="ignore"):
        scale = float(np.float32((fmax * 2.0**-margin) / amax))
    if math.isinf(scale):
        scale = inf_value
    if power_of_2:
        _, e = math.frexp(scale)
        scale = math.ldexp(1.0, e - 1)
    return scale


def ml_dtypes_codes(x32: np.ndarray, scale: np.ndarray, fmt: str) -> np.ndarray:
    """Codes of clamp(x * scale) through a float32 multiply and an ml_dtypes cast."""
    prod = (x32.astype(np.float32) * np.asarray(scale, dtype=np.float32)).astype(np.float32)
    m = fp8_max(fmt)
    return np.clip(prod, -m, m).astype(ML_DTYPES[fmt]).view(np.uint8)


def sample(gen: torch.Generator, shape, dtype=torch.float32, spread=8) -> torch.Tensor:
    """Gaussian rows at magnitudes 2**k, k in [-spread, spread], with heavy-tailed entries."""
    x = torch.randn(shape, generator=gen)
    x = x / torch.rand(shape, generator=gen).clamp(min=0.05)
    mag = torch.exp2(torch.randint(-spread, spread + 1, (*shape[:-1], 1), generator=gen).float())
    return (x * mag).to(dtype)


# ------------------------------------------------------------------ every code


@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_every_finite_code_round_trips_at_unit_scale(fmt):
    # amax = fp8 max gives scale exactly 1.0, so each value must come back as its own code.
    codes = torch.arange(256, dtype=torch.uint8)
    values = mxcheck.decode(codes, fmt)
    keep = values.isfinite()
    q = fp8_quantize(values[keep], fmt)
    assert q.scale.item() == 1.0
    assert torch.equal(q.codes, codes[keep])
    assert torch.equal(q.dequantize().view(torch.int32), values[keep].view(torch.int32))


# ------------------------------------------------------------------ tensorwise and rowwise

TE_OPTIONS = [
    {},
    {"power_of_2": True},
    {"margin": 2},
    {"eps": 1.0},
]


@pytest.mark.parametrize("options", TE_OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_tensorwise_te_matches_float64_scale_and_ml_dtypes_codes(fmt, dtype, options, gen):
    for _ in range(4):
        x = sample(gen, (3, 17, 24), dtype)
        q = fp8_quantize(x, fmt, **options)
        amax = float(x.float().abs().max())
        scale = te_scale(amax, fp8_max(fmt), **options)
        assert q.scale.shape == q.scale_inv.shape == ()
        assert f32_bits(q.scale.item()) == f32_bits(scale)
        assert f32_bits(q.scale_inv.item()) == f32_bits(np.float32(1.0) / np.float32(scale))
        expected = ml_dtypes_codes(x.float().numpy(), np.float32(scale), fmt)
        np.testing.assert_array_equal(q.codes.numpy(), expected)


@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_tensorwise_primus_turbo_matches_float32_quotient(fmt, gen):
    x = sample(gen, (64, 48))
    q = fp8_quantize(x, fmt, scale_formula="primus_turbo")
    # Primus-Turbo quant_utils.cuh: q_max / fmax(amax, 1e-12), both float32.
    scale = np.float32(fp8_max(fmt)) / max(np.float32(x.abs().max()), np.float32(1e-12))
    assert f32_bits(q.scale.item()) == f32_bits(scale)
    np.testing.assert_array_equal(q.codes.numpy(), ml_dtypes_codes(x.numpy(), scale, fmt))


@pytest.mark.parametrize("options", TE_OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_rowwise_te_matches_float64_scale_per_row(fmt, options, gen):
    x = sample(gen, (40, 96), spread=30)
    x[3] = 0.0  # amax 0: scale 1.0
    x[7] = 0.0
    x[7, 5] = 1e-44  # float32 subnormal amax: 448 / amax overflows, scale -> FLT_MAX
    q = fp8_quantize(x, fmt, granularity="row", **options)
    assert q.scale_inv.shape == q.scale.shape == (40, 1)
    row_amax = x.abs().amax(dim=1)
    expected = np.array([te_scale(float(a), fp8_max(fmt), **options) for a in row_amax], dtype=np.float32)
    np.testing.assert_array_equal(f32_bits(q.scale[:, 0].numpy()), f32_bits(expected))
    np.testing.assert_array_equal(q.codes.numpy(), ml_dtypes_codes(x.numpy(), expected[:, None], fmt))
    np.testing.assert_array_equal(f32_bits(q.scale_inv[:, 0].numpy()), f32_bits(np.float32(1) / expected))


# ------------------------------------------------------------------ blockwise: TE reference


def te_reference_scale_from_amax(x_dtype, amax, quant_dtype, *, eps, pow_2_scales):
    """Transcription of tests/pytorch/references/quantize_scale_calc.py::scale_from_amax_tensor
    (NVIDIA/TransformerEngine @ 3580212c7d86bb0c2a0b697d7eeebe348a544966)."""
    fp8_max_value = torch.finfo(quant_dtype).max
    amax = torch.max(amax, torch.tensor(eps))
    scale = torch.div(fp8_max_value, amax)
    scale = torch.where(scale == torch.inf, torch.finfo(x_dtype).max, scale)
    if pow_2_scales:
        _, exp = torch.frexp(scale)
        exp = exp - 1
        scale = torch.ldexp(torch.ones_like(scale), exp)  # TE: ldexp(unity, exp, out=scale)
        scale = torch.where(amax == float("inf"), 0.0, scale)
    scale = torch.where(amax == 0, 1.0, scale)
    return scale, torch.reciprocal(scale)


def te_reference_blockwise(x, quant_dtype, tile, *, pow_2_scales, eps):
    """Transcription of tests/pytorch/references/blockwise_quantizer_reference.py
    (_quantize_vectorwise_reference, _quantize_square_block_tiling; NVIDIA/TransformerEngine
    @ 1400f7a07693e64260a7ff5045a142879bd978dd), for shapes that tile exactly."""
    m, k = x.shape
    dtype_max = torch.finfo(quant_dtype).max
    if tile == (1, 128):
        x_tiled = x.reshape(m, k // 128, 128)
        amax = torch.abs(x_tiled).amax(dim=-1).float()
        scale, scale_inv = te_reference_scale_from_amax(x.dtype, amax, quant_dtype, eps=eps, pow_2_scales=pow_2_scales)
        qx = x_tiled * scale.reshape(m, k // 128, 1)
    else:
        x_tiled = x.reshape(m // 128, 128, k // 128, 128)
        amax = torch.abs(x_tiled.transpose(-3, -2)).reshape(m // 128, k // 128, 128 * 128).amax(dim=-1).float()
        scale, scale_inv = te_reference_scale_from_amax(x.dtype, amax, quant_dtype, eps=eps, pow_2_scales=pow_2_scales)
        qx = x_tiled * scale.reshape(m // 128, 1, k // 128, 1)
    qx = torch.clamp(qx, min=-dtype_max, max=dtype_max).to(dtype=quant_dtype)
    return qx.reshape(m, k).view(torch.uint8), scale_inv


@pytest.mark.parametrize("eps", [0.0, 0.5])
@pytest.mark.parametrize("pow2", [False, True], ids=["fp32scale", "pow2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("granularity", ["block1x128", "block128x128"])
def test_blockwise_matches_te_reference_transcription(granularity, fmt, dtype, pow2, eps, gen):
    x = sample(gen, (256, 384), torch.float32, spread=12)
    x[:128, 128:256] = 0.0  # an all-zero tile: scale 1.0
    x[128:, 256:] = 0.0
    x[130, 300] = 2.0**-125  # tiny tile amax: 448 / amax is Inf -> the *input dtype's* max
    x = x.to(dtype)
    tile = (1, 128) if granularity == "block1x128" else (128, 128)
    q = fp8_quantize(x, fmt, granularity=granularity, power_of_2=pow2, eps=eps)
    ref_codes, ref_scale_inv = te_reference_blockwise(x, TORCH_FP8[fmt], tile, pow_2_scales=pow2, eps=eps)
    expected_shape = (256, 3) if tile == (1, 128) else (2, 3)
    assert q.scale_inv.shape == expected_shape
    assert torch.equal(q.scale_inv.view(torch.int32), ref_scale_inv.view(torch.int32))
    assert torch.equal(q.codes, ref_codes)


def test_blockwise_inf_scale_becomes_the_input_dtype_max():
    # compute_scale_from_types<IType, OType> passes TypeInfo<IType>::max_finite_value; the
    # tensor path (current_scaling.cu) passes FLT_MAX. bf16 max = 0x7F7F0000.
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    x[0, 0] = 2.0**-125
    q_block = fp8_quantize(x, granularity="block1x128")
    q_tensor = fp8_quantize(x)
    assert f32_bits(q_block.scale[0, 0].item()) == 0x7F7F0000
    assert f32_bits(q_tensor.scale.item()) == 0x7F7FFFFF


# ------------------------------------------------------------------ torchao float8


def torchao_float8_utils():
    with needs("torchao"):
        from torchao.float8 import float8_utils
    return float8_utils


def amax_rows(amaxes: torch.Tensor) -> torch.Tensor:
    """(N, 4) rows whose row amax is each given value."""
    x = amaxes[:, None] * torch.tensor([[1.0, -0.5, 0.25, -1.0]])
    return x


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_te_scale_agrees_with_torchao_amax_to_scale_on_ordinary_amax(fmt, gen):
    ao = torchao_float8_utils()
    amax = torch.exp2(torch.empty(4096).uniform_(-30, 30, generator=gen)).float()
    q = fp8_quantize(amax_rows(amax), fmt, granularity="row")
    ao_scale = ao.amax_to_scale(amax, TORCH_FP8[fmt])
    assert torch.equal(q.scale[:, 0].view(torch.int32), ao_scale.view(torch.int32))
    p = fp8_quantize(amax_rows(amax), fmt, granularity="row", scale_formula="primus_turbo")
    assert torch.equal(p.scale[:, 0].view(torch.int32), ao_scale.view(torch.int32))
    # Power-of-two scales agree except at nextbelow(2^k) (pinned below); random amax avoids it.
    q2 = fp8_quantize(amax_rows(amax), fmt, granularity="row", power_of_2=True)
    ao2 = ao.amax_to_scale(amax, TORCH_FP8[fmt], round_scales_to_power_of_2=True)
    assert torch.equal(q2.scale[:, 0].view(torch.int32), ao2.view(torch.int32))


def test_pinned_amax_zero_te_scale_one_vs_torchao_448e12():
    # reference_emulators.md section 8 item 16: TE returns 1.0 for amax 0; torchao divides by
    # EPS = 1e-12 in float64 (4.48e14); Primus-Turbo by float32(1e-12) (fmax(amax, eps)).
    ao = torchao_float8_utils()
    x = torch.zeros(4, 8)
    ao_scale = ao.amax_to_scale(torch.tensor(0.0), torch.float8_e4m3fn)
    assert f32_bits(ao_scale.item()) == f32_bits(np.float32(448.0 / 1e-12))
    assert fp8_quantize(x).scale.item() == 1.0
    pt = fp8_quantize(x, scale_formula="primus_turbo").scale.item()
    assert f32_bits(pt) == f32_bits(np.float32(448.0) / np.float32(1e-12))
    assert torch.equal(fp8_quantize(x).codes, torch.zeros(4, 8, dtype=torch.uint8))


def test_pinned_power_of_2_at_nextafter_28_te_8_vs_torchao_16():
    # reference_emulators.md section 8 item 17: 448 / 28.000002 = 15.999999 (float32);
    # TE masks the mantissa (exact floor) -> 8; torchao exp2(floor(log2(s))) with a float32
    # log2 that rounds to 4.0 -> 16, and then 28.000002 * 16 = 448.00003 saturates.
    ao = torchao_float8_utils()
    amax = float(np.nextafter(np.float32(28.0), np.float32(np.inf)))
    x = torch.tensor([amax, 1.0, -3.0, 0.0])
    q = fp8_quantize(x, power_of_2=True)
    assert q.scale.item() == 8.0
    assert q.codes[0].item() == 0x76  # 224 = 1.75 * 2^7
    assert q.dequantize()[0].item() == 28.0
    ao_scale = ao.amax_to_scale(torch.tensor(amax), torch.float8_e4m3fn, round_scales_to_power_of_2=True)
    assert ao_scale.item() == 16.0


# ------------------------------------------------------------------ TE / Primus-Turbo edge cases

TINY = 2.0**-149  # float32's least subnormal: 448 / TINY overflows
# (name, x, kwargs, expected scale) -- expectations from recipe_common.cuh by hand:
EDGE_CASES = [
    ("zero_amax", [0.0, -0.0], {}, 1.0),
    ("inf_amax", [1.0, math.inf], {}, 1.0),
    ("nan_amax", [1.0, math.nan], {}, 1.0),
    ("overflowing_scale_is_flt_max", [TINY], {}, FLT_MAX),
    ("flt_max_masked_to_2_127", [TINY], {"power_of_2": True}, 2.0**127),
    ("eps_floors_amax", [0.5], {"eps": 2.0}, 224.0),  # 448 / 2
    ("eps_applies_before_the_zero_check", [0.0], {"eps": 1.0}, 448.0),
    ("margin_3", [7.0], {"margin": 3}, 8.0),  # 448 / 8 / 7
    ("power_of_2_floor", [3.0], {"power_of_2": True}, 128.0),  # 149.33 -> 128
    ("e5m2_max", [7.0], {"fmt": "e5m2"}, 8192.0),  # 57344 / 7
    ("primus_zero", [0.0], {"scale_formula": "primus_turbo"}, float(np.float32(448) / np.float32(1e-12))),
    ("primus_nan_is_eps", [math.nan], {"scale_formula": "primus_turbo"}, float(np.float32(448) / np.float32(1e-12))),
    ("primus_inf_gives_zero", [math.inf], {"scale_formula": "primus_turbo"}, 0.0),
]


@pytest.mark.parametrize(("x", "kwargs", "expected"), [c[1:] for c in EDGE_CASES], ids=[c[0] for c in EDGE_CASES])
def test_scale_edge_cases(x, kwargs, expected):
    kwargs = dict(kwargs)
    fmt = kwargs.pop("fmt", "e4m3")
    q = fp8_quantize(torch.tensor(x), fmt, **kwargs)
    assert f32_bits(q.scale.item()) == f32_bits(expected)
    assert f32_bits(q.scale_inv.item()) == f32_bits(np.float32(1.0) / np.float32(expected) if expected else np.inf)


def test_nan_and_inf_elements_saturate_or_stay_nan():
    q = fp8_quantize(torch.tensor([1.0, math.nan, math.inf, -math.inf]))
    # scale 1.0 (amax NaN); satfinite: +-Inf -> +-448 (0x7E / 0xFE), NaN -> 0x7F.
    assert q.codes.tolist() == [0x38, 0x7F, 0x7E, 0xFE]


# ------------------------------------------------------------------ dequantize and SNR

# Measured on 256x256 standard normal data, all granularities: e4m3 and e4m3fnuz 31.5-31.9 dB,
# e5m2 and e5m2fnuz 25.5-25.8 dB; the floors are DESIGN.md's 25 / 20 dB anchors.
SNR_FLOOR = {fmt: quantize_floor(f"fp8/{fmt}") for fmt in ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz")}


@pytest.mark.parametrize("granularity", ["tensor", "row", "block1x128", "block128x128"])
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_dequantize_is_value_times_scale_inv_and_beats_snr_floor(fmt, granularity, gen, numerics):
    # False failure per run < 1e-300: z >= 171 over 60 seeds (mxcheck.false_failure, "fp8").
    x = torch.randn(256, 256, generator=gen)
    q = fp8_quantize(x, fmt, granularity=granularity)
    values = torch.from_numpy(q.codes.numpy().view(ML_DTYPES[fmt]).astype(np.float32))
    s = q.scale_inv
    if granularity.startswith("block"):
        rows = 1 if granularity == "block1x128" else 128
        s = s.repeat_interleave(rows, 0).repeat_interleave(128, 1)
    assert torch.equal(q.dequantize().view(torch.int32), (values * s).view(torch.int32))
    numerics.context(recipe=f"fp8-{fmt}", layer=f"{granularity} randn 256x256", direction="quantize",
                     m=256, k=256).snr(q.dequantize(), x.double(), SNR_FLOOR[fmt])


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"fmt": "e2m1"}, ValueError, r"not an FP8 format.*e4m3"),
        ({"fmt": "ue4m3"}, ValueError, r"not an FP8 format"),
        ({"fmt": "bogus"}, ValueError, r"not a known format"),
        ({"granularity": "col"}, ValueError, r"granularity='col'.*block128x128"),
        ({"scale_formula": "torchao"}, ValueError, r"scale_formula='torchao'.*primus_turbo"),
        ({"margin": -1}, ValueError, r"margin=-1"),
        ({"margin": 1.5}, TypeError, r"margin must be an int"),
        ({"eps": -1e-3}, ValueError, r"eps=-0.001"),
        ({"eps": math.nan}, ValueError, r"eps=nan"),
        ({"power_of_2": 1}, TypeError, r"power_of_2 must be a bool"),
        ({"scale_formula": "primus_turbo", "margin": 1}, ValueError, r"does not use \['margin'\]"),
        ({"scale_formula": "primus_turbo", "power_of_2": True}, ValueError, r"does not use \['power_of_2'\]"),
    ],
)
def test_bad_arguments_raise(kwargs, error, match):
    kwargs = dict(kwargs)
    fmt = kwargs.pop("fmt", "e4m3")
    with pytest.raises(error, match=match):
        fp8_quantize(torch.ones(4, 128), fmt, **kwargs)


@pytest.mark.parametrize(
    ("x", "granularity", "error", "match"),
    [
        (torch.ones(4, 128, dtype=torch.int32), "tensor", TypeError, r"x.dtype=torch.int32"),
        (torch.ones(4, 128, dtype=torch.float64), "tensor", TypeError, r"convert float64"),
        ([1.0, 2.0], "tensor", TypeError, r"must be a torch.Tensor"),
        (torch.ones(2, 4, 128), "row", ValueError, r"needs a 2D \(M, K\) tensor"),
        (torch.ones(128), "block1x128", ValueError, r"needs a 2D"),
        (torch.ones(4, 100), "block1x128", ValueError, r"x dim 1 \(K\).*length 100.*block size 128"),
        (torch.ones(64, 128), "block128x128", ValueError, r"x dim 0 \(M\).*length 64"),
        (torch.ones(0, 128), "row", ValueError, r"non-empty"),
    ],
)
def test_bad_inputs_raise(x, granularity, error, match):
    with pytest.raises(error, match=match):
        fp8_quantize(x, granularity=granularity)
