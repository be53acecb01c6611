"""Conventions released quantizers use, as profile options: each against an independent
computation (float64 / Fraction / ml_dtypes arithmetic written here, or torchao 0.18 run on
CPU), on inputs where the convention changes bits."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from mxcheck.divergence import divergence
from mxcheck.formats import decode_table, encode, get_format
from mxcheck.gemm import quantize_operand
from mxcheck.profiles import FP8Profile, NVFP4Profile, Profile, get_profile
from mxcheck.recipes import OPERANDS, OperandSpec, Recipe, get_recipe
from mxcheck.reference import encode_scalar
from mxcheck.scaling import fp8_quantize, mx_quantize, nvfp4_quantize
from tests._helpers import one_block

pytestmark = pytest.mark.emulated

F32 = np.float32


def f32(v: float) -> float:
    return float(F32(v))


def nextabove(v: float) -> float:
    return float(np.nextafter(F32(v), F32(np.inf)))


def bf16(v: float) -> float:
    return float(np.array(v, dtype=np.float64).astype(ml_dtypes.bfloat16))


# ------------------------------------------------------------------ rounding half_zero


def _ties(fmt_name: str) -> list[tuple[float, int]]:
    """(midpoint between two neighbouring finite codes, the code of the smaller magnitude),
    both signs, from the decode table in Fractions."""
    fmt = get_format(fmt_name)
    table = decode_table(fmt).tolist()
    pos = sorted((Fraction(v), c) for c, v in enumerate(table)
                 if math.isfinite(v) and v >= 0 and not (c & fmt.sign_mask))
    out = []
    for (lo, lo_code), (hi, _) in itertools.pairwise(pos):
        mid = (lo + hi) / 2
        out += [(float(mid), lo_code), (-float(mid), lo_code | fmt.sign_mask)]
    return out


@pytest.mark.parametrize("fmt", ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2"])
@pytest.mark.parametrize("saturate", [True, False], ids=["float_path", "int_path"])
def test_half_zero_rounds_every_tie_toward_zero_and_the_reference_agrees(fmt, saturate):
    ties = _ties(fmt)
    x = torch.tensor([v for v, _ in ties], dtype=torch.float64 if not saturate else torch.float32)
    want = [c for _, c in ties]
    assert encode(x, fmt, rounding="half_zero", saturate=saturate).tolist() == want
    assert [encode_scalar(v, fmt, "half_zero") for v, _ in ties] == want


@pytest.mark.parametrize("fmt", ["e2m1", "e4m3"])
def test_half_zero_rounds_off_tie_values_to_the_nearest_code(fmt):
    # a tie nudged one float32 ulp outward goes to the larger magnitude, as every nearest mode
    ties = _ties(fmt)[:-2]  # not the last gap, whose upper neighbour is max
    away = [float(np.nextafter(F32(v), F32(math.copysign(np.inf, v)))) for v, _ in ties]
    rne = encode(torch.tensor(away), fmt, rounding="rne")
    assert torch.equal(encode(torch.tensor(away), fmt, rounding="half_zero"), rne)
    assert [encode_scalar(v, fmt, "half_zero") for v in away] == rne.tolist()


# ------------------------------------------------------------------ MX: log2 in the input's dtype


@pytest.mark.parametrize("k", [3, 8, 20, -10, -30])
def test_torchao07_floor_takes_log2_of_a_bf16_amax_in_bf16(k):
    # to_mx @f04aec72: floor(log2(max_abs)) with max_abs bf16. The largest bf16 below 2^k,
    # (1 - 2^-8) * 2^k, has log2 k - 0.0056, which rounds to k in bf16 (8 bits): a byte one
    # binade above the exponent bits' k - 1. A float32 input of the same value keeps k - 1.
    amax = (1 - 2**-8) * 2.0**k
    fmt = get_format("e4m3")
    want_e = math.floor(bf16(math.log2(amax))) - fmt.emax
    assert want_e == k - fmt.emax  # the premise: bf16 log2 rounds up to k
    x = one_block(amax, -amax / 2)
    codes, scales = get_profile("torchao0.7.floor").quantize(x.to(torch.bfloat16), fmt)
    assert scales.item() == 127 + want_e
    want_codes = np.array([amax, -amax / 2]) / 2.0**want_e
    assert codes[0, :2].tolist() == want_codes.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).tolist()
    assert get_profile("torchao0.7.floor").quantize(x, fmt)[1].item() == 127 + k - 1 - fmt.emax


@pytest.mark.parametrize("k", [4, 9, 20, -6, -40])
def test_torchao09_ceil_takes_a_float32_log2_one_binade_low_above_pow2(k):
    # to_mx @14cfbc74 CEIL: ceil(log2(max_abs)) in float32. log2(nextabove(2^k)) is k + 1.7e-7,
    # which rounds to k in float32 for |k| >= 4, so ceil gives k where the exponent bits give
    # k + 1; the element nextabove(2^k) / 2^(k - 8) rounds to 256 in e4m3 (0x78), not 128 (0x70).
    amax = nextabove(2.0**k)
    fmt = get_format("e4m3")
    e = math.ceil(f32(math.log2(amax))) - fmt.emax
    assert e == k - fmt.emax
    x = one_block(amax, 2.0**k)
    codes, scales = get_profile("torchao0.9.ceil").quantize(x, fmt)
    assert (codes[0, :2].tolist(), scales.item()) == ([0x78, 0x78], 127 + e)
    assert mx_quantize(x, fmt, scale_rule="ceil").scales.item() == 127 + e + 1
    # at an exact power of two the float32 log2 is exact: both give k
    assert get_profile("torchao0.9.ceil").quantize(one_block(2.0**k), fmt)[1].item() == 127 + e


# ------------------------------------------------------------------ zero sign


@pytest.mark.parametrize(("policy", "want"), [
    ("source", [0x8, 0x0, 0x8, 0x0, 0xA]),
    ("negative_values", [0x0, 0x0, 0x8, 0x0, 0xA]),  # TE cast_to_fp4x2: (x >= -0.25) & (x < -0.0) -> 8
    ("never", [0x0, 0x0, 0x0, 0x0, 0xA]),
])
def test_zero_sign_policy_sets_the_sign_of_every_zero_code(policy, want):
    # e2m1 at scale 1 (amax 6): -0.0, +0.0, -0.1 and +0.1 round to zero; -1.0 is 0xA.
    x = one_block(-0.0, 0.0, -0.1, 0.1, -1.0, 6.0)
    codes, scales = Profile("p", "e2m1", zero_sign=policy).quantize(x)
    assert (codes[0, :5].tolist(), scales.item()) == (want, 127)
    nv = NVFP4Profile("p", zero_sign=policy).quantized(x[:, :16])
    assert nv.codes[0, :5].tolist() == want


def test_te_reference_nvfp4_writes_plus_zero_for_minus_zero_and_the_kernel_keeps_the_sign():
    x = one_block(-0.0, 6.0, -0.1)[:, :16]
    assert get_profile("te.nvfp4.reference").quantized(x).codes[0, :3].tolist() == [0x0, 0x7, 0x8]
    assert get_profile("te.nvfp4").quantized(x).codes[0, :3].tolist() == [0x8, 0x7, 0x8]


# ------------------------------------------------------------------ NVFP4 block scales and element scale


def _nvfp4_battery(gen: torch.Generator) -> torch.Tensor:
    """Rows of 16-blocks spread over 2^-30 .. 2^10 of the tensor amax (so many block scales
    fall below 2^-6), an all-zero block, a -0.0 block, e2m1 ties at scale 1, a tiny block."""
    x = torch.randn(32, 64, generator=gen) * torch.exp2(torch.randint(-30, 10, (32, 4), generator=gen)
                                                        .repeat_interleave(16, dim=1).float())
    x[0, :16] = 0.0
    x[1, :16] = -0.0
    x[2, :16] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0, 0, 0, 0, 0, 0])
    x[3, :16] = 2.0**-40
    x[4, 0] = 3 * 2.0**10  # the tensor amax
    return x


def test_torchao_nvfp4_profile_is_torchao_018_nvfp4_quantize_bit_for_bit(gen):
    from torchao.prototype.mx_formats.kernels import unpack_uint4
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize as ao_nvfp4
    from torchao.prototype.mx_formats.nvfp4_tensor import per_tensor_amax_to_scale

    x = _nvfp4_battery(gen)
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        q = get_profile("torchao.nvfp4").quantized(xd)
        ao_scales, ao_data = ao_nvfp4(xd, per_tensor_scale=per_tensor_amax_to_scale(xd.abs().amax()))
        assert torch.equal(q.block_scales, ao_scales.view(torch.uint8)), dtype
        assert torch.equal(q.codes, unpack_uint4(ao_data).reshape(x.shape)), dtype
    te = nvfp4_quantize(x)
    floored = te.block_scales < 0x08
    assert bool(floored.any()) and bool((q.block_scales[floored] == 0x08).all())  # E4M3_EPS = 2^-6


def _e2m1_rne(v: np.ndarray, sign_from_lt_zero: bool = False) -> list[int]:
    codes = np.clip(v, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    if sign_from_lt_zero:
        zero = (codes & 0x7) == 0
        codes = np.where(zero, np.where(v < 0, 0x8, 0x0), codes)
    return codes.tolist()


def _e4m3(v: np.ndarray) -> np.ndarray:
    return v.astype(F32).astype(ml_dtypes.float8_e4m3fn)


def _tie_blocks() -> torch.Tensor:
    """Blocks whose block amax B sets s; the other elements are e2m1 midpoints times
    fl32(s * ts) and their float32 neighbours, where dividing by the product and multiplying
    by (1/ts)/s round to different sides of the midpoint."""
    amax = 1000.0
    ts = f32(amax / 2688)
    rows = []
    for b in np.linspace(3.0, 997.0, 64, dtype=F32):
        s = float(_e4m3(np.array([f32(f32(b / 6) / ts)])).astype(F32)[0])
        p = f32(s * ts)
        mids = [f32(m * p) for m in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)]
        row = [float(b), mids[4]] + [float(np.nextafter(F32(m), F32(d))) for m in mids for d in (0, np.inf)]
        rows.append(row)
    x = torch.tensor(rows, dtype=torch.float32)
    x[0, 0] = amax
    return x


@pytest.mark.parametrize(("name", "divide"), [("torchao0.16.nvfp4", True), ("torchao.nvfp4", False)])
def test_torchao_nvfp4_element_scale_divides_by_the_product_or_multiplies_by_the_quotient(name, divide):
    # torchao 0.12-0.16: data_hp / (per_tensor_scale * s); 0.17+: data_hp * ((1 / per_tensor_scale) / s);
    # the expected codes are numpy float32 arithmetic, each operation rounded as torchao's.
    x = _tie_blocks()
    xs = x.numpy()
    ts = F32(F32(xs.max()) / F32(2688))
    s = _e4m3(np.clip((xs.max(1) / F32(6)).astype(F32) / ts, 2.0**-6, 448)).astype(F32)
    if divide:
        scaled = xs / (s * ts)[:, None]
    else:
        scaled = xs * ((F32(1) / ts) / s)[:, None]
    q = get_profile(name).quantized(x)
    assert q.block_scales[:, 0].tolist() == _e4m3(s).view(np.uint8).tolist()
    assert q.codes.tolist() == [_e2m1_rne(r) for r in scaled.astype(F32)]
    other = get_profile("torchao.nvfp4" if divide else "torchao0.16.nvfp4").quantized(x)
    assert int((other.codes != q.codes).sum()) > 0  # the input tells the two apart


def test_nvfp4_block_scale_quotient_and_product_round_as_torchao_and_modelopt_do():
    # torchao: (max_abs / 6) / per_tensor_scale; ModelOpt: max_abs / (6 * sf2): block amaxes
    # planted on (and a few ulps around) 6 * ts * an e4m3 midpoint, where the two float32
    # roundings cast to different e4m3 codes. Expected codes: numpy float32 and ml_dtypes.
    amax = F32(1000.0)
    ts = F32(amax / F32(2688))
    table = decode_table("e4m3").numpy()
    pos = np.unique(table[(table > 0) & np.isfinite(table)])
    vmax = np.array([F32(F32(m) * F32(6) * ts) for m in (pos[10:42] + pos[11:43]) / 2], dtype=F32)
    vmax = np.concatenate([vmax + F32(d) * np.spacing(vmax) for d in range(-3, 4)]).astype(F32)
    x = torch.zeros(len(vmax), 16)
    x[:, 0] = torch.from_numpy(vmax)
    x[0, 1] = float(amax)
    quotient = _e4m3((vmax / F32(6)).astype(F32) / ts).view(np.uint8)
    product = _e4m3(vmax / (F32(6) * ts)).view(np.uint8)
    assert int((quotient != product).sum()) > 0  # the input tells the two apart
    rows = np.arange(1, len(vmax))  # row 0 holds the tensor amax as well
    for name, want in (("torchao.nvfp4", quotient), ("modelopt.nvfp4", product)):
        got = get_profile(name).quantized(x).block_scales[:, 0].numpy()
        assert got[rows].tolist() == want[rows].tolist(), name


def test_modelopt_nvfp4_floors_block_scales_at_2_pow_minus_9_and_sets_zero_blocks_to_one(gen):
    # nvfp4_tensor.py @211c6b34: s = per_block_amax / (6 * sf2); s[s == 0] = 1.0; clamp(min=2^-9);
    # e4m3; x / (s * sf2); _cast_fp4 ties to even with sign bit x < 0.
    x = _nvfp4_battery(gen)
    xs = x.numpy()
    sf2 = F32(F32(np.abs(xs).max()) / F32(2688))
    s = (np.abs(xs).reshape(32, 4, 16).max(-1) / (F32(6) * sf2)).astype(F32)
    s = np.maximum(np.where(s == 0, F32(1), s), F32(2.0**-9))
    s8 = _e4m3(s)
    scaled = (xs.reshape(32, 4, 16) / (s8.astype(F32) * sf2)[..., None]).astype(F32).reshape(32, 64)
    q = get_profile("modelopt.nvfp4").quantized(x)
    assert q.block_scales.tolist() == s8.view(np.uint8).tolist()
    assert q.codes.tolist() == [_e2m1_rne(r, sign_from_lt_zero=True) for r in scaled]
    assert q.block_scales[0, 0].item() == q.block_scales[1, 0].item() == 0x38  # zero blocks: 1.0
    assert q.block_scales[3, 0].item() == 0x01  # 2^-40 block: floored at 2^-9


# ------------------------------------------------------------------ FP8 tensorwise scale in bf16


def test_torchao05_float8_computes_the_scale_and_the_scaled_input_in_bf16():
    # float8_utils.py @ae8384ba: amax in bf16, 448 / clamp(amax, 1e-12) as reciprocal then
    # times 448, each rounded to bf16; tensor * scale stays bf16, then clamp and cast.
    vals = np.array([v for v in np.arange(-3.0, 3.0, 2**-6)], dtype=np.float64)
    x = torch.tensor(vals, dtype=torch.float32).to(torch.bfloat16).reshape(1, -1)
    amax = float(x.abs().max())
    scale = bf16(bf16(1 / amax) * 448)
    scaled = (x.float().numpy().astype(np.float64) * scale).astype(ml_dtypes.bfloat16).astype(np.float64)
    want = np.clip(scaled, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    q = get_profile("torchao0.5.float8").quantized(x, "e4m3")
    assert q.scale.item() == scale and q.codes.numpy().tolist() == want.tolist()
    float32 = fp8_quantize(x, "e4m3", scale_formula="primus_turbo")
    assert float32.scale.item() != scale and int((float32.codes != q.codes).sum()) > 0


# ------------------------------------------------------------------ quantize_operand with a profile


@pytest.mark.parametrize(("spec", "profile"), [
    (OperandSpec("e4m3", "mx", profile="torchao0.7.floor"), "torchao0.7.floor"),
    (OperandSpec("e2m1", "nvfp4", block_size=16, profile="torchao.nvfp4"), "torchao.nvfp4"),
    (OperandSpec("e4m3", "tensor", scale_formula="primus_turbo", profile="torchao0.5.float8"), "torchao0.5.float8"),
], ids=["mx", "nvfp4", "fp8"])
def test_quantize_operand_with_a_profile_returns_the_profiles_bits(spec, profile, gen):
    x = (torch.randn(16, 64, generator=gen) * torch.exp2(torch.randint(-8, 8, (16, 1), generator=gen).float()))
    x[0, :32] = (1 - 2**-8) * 64.0  # a bf16 amax whose bf16 log2 rounds up
    x[1, :16] = 0.0
    x = x.to(torch.bfloat16)
    q = quantize_operand(x, spec)
    plain = quantize_operand(x, replace(spec, profile=None))
    want = get_profile(profile).quantized(x, spec.fmt)
    assert type(q) is type(plain)
    for field in ("codes", "scales", "block_scales", "tensor_scale", "amax", "scale", "scale_inv"):
        if hasattr(want, field):
            assert torch.equal(getattr(q, field), getattr(want, field)), field
    assert any(not torch.equal(getattr(q, f), getattr(plain, f)) for f in ("codes", "scales", "block_scales",
                                                                         "scale") if hasattr(q, f))
    if spec.scaling == "mx":
        for field in ("fmt", "block_size", "axis", "shape", "scale_rule", "rounding", "block_2d", "zero_scale"):
            assert getattr(q, field) == getattr(plain, field), field


# ------------------------------------------------------------------ pinning recipes


def test_get_recipe_name_at_profile_pins_every_operand():
    r = get_recipe("mxfp8@torchao.floor")
    assert r.name == "mxfp8@torchao.floor"
    assert {(r.spec(op).profile, r.spec(op).scale_rule, r.spec(op).fmt) for op in OPERANDS} == {
        ("torchao.floor", "floor", "e4m3")}  # the profile's floor replaces mxfp8's rceil
    mixed = Recipe("mixed", x_row=OperandSpec("e2m1", "mx"), w_row=OperandSpec("e4m3", "tensor"))
    assert [op for op in OPERANDS if mixed.with_profile("torchao.mxfp4").spec(op).profile] == ["x_row"]


@pytest.mark.parametrize(("name", "match"), [
    ("mxfp9@torchao.floor", r"recipe='mxfp9@torchao.floor': 'mxfp9' is not a known recipe; did you mean 'mxfp8'\?; expected one of \["),
    ("mxfp8@nvidia", r"recipe='mxfp8@nvidia': 'nvidia' is not a known profile; known profiles: ocp, "),
    ("fp8@torchao.floor", r"recipe fp8 has no operand of scaling 'mx' for profile torchao.floor to pin; "
                          r"its operands: x_row=tensor"),
    ("mxfp4@primus_turbo.mxfp4", r"recipe mxfp4 operand x_row: OperandSpec: pad_to=128 with "
                                 r"profile='primus_turbo.mxfp4'.*drop pad_to or the profile"),
    ("mxfp8@torchao.mxfp4", r"operand x_row: OperandSpec: profile='torchao.mxfp4' is pinned to fmt='e2m1', "
                            r"but fmt='e4m3'; set fmt='e2m1'"),
])
def test_a_bad_pinned_recipe_name_says_which_part_is_wrong(name, match):
    with pytest.raises(ValueError, match=match):
        get_recipe(name)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"profile": "nvidia"}, r"profile='nvidia' is not known; known profiles: ocp, "),
    ({"profile": "torchao.nvfp4"}, r"profile='torchao.nvfp4' pins scaling 'nvfp4', but scaling='mx'; "
                                   r"set scaling='nvfp4', or pin a 'mx' profile \(ocp, "),
    ({"profile": "te.mxfp8", "fmt": "e5m2"}, r"profile='te.mxfp8' is pinned to fmt='e4m3', but fmt='e5m2'; "
                                             r"set fmt='e4m3'"),
    ({"profile": "torchao.floor", "scale_rule": "rceil"},
     r"scale_rule='rceil' disagrees with profile 'torchao.floor', which has scale_rule='floor'; "
     r"set scale_rule='floor' \(Recipe.with_profile does\) or drop the profile"),
    ({"profile": "aiter.mxfp6", "fmt": "e2m3", "zero_scale": 127, "hadamard": "h32", "rounding": "half_away"},
     r"rounding='half_away' disagrees with profile 'aiter.mxfp6', which has rounding='rne'"),
    ({"profile": "torchao.floor", "block_2d": True}, r"block_2d=True with profile='torchao.floor': profiles "
                                                     r"quantize unpadded 1D blocks"),
    ({"profile": "torchao.floor", "pad_to": 64}, r"pad_to=64 with profile='torchao.floor'"),
    ({"profile": "torchao0.5.float8", "scaling": "tensor", "scale_formula": "primus_turbo", "margin": 1},
     r"margin=1 with profile='torchao0.5.float8', which models margin=0 only"),
])
def test_a_bad_operand_pin_raises_naming_the_field_both_values_and_the_fix(kwargs, match):
    spec = {"fmt": "e4m3", "scaling": "mx"} | kwargs
    with pytest.raises(ValueError, match=rf"^OperandSpec: {match}"):
        OperandSpec(**spec)


@pytest.mark.parametrize(("cls", "kwargs", "match"), [
    (NVFP4Profile, {"block_scale": "max"}, r"block_scale='max'; expected one of \['te', 'quotient', 'product', 'factor_times_input_quotient'\]"),
    (NVFP4Profile, {"element_scale": "x"}, r"element_scale='x'"),
    (NVFP4Profile, {"block_scale_min": 0.0}, r"block_scale_min=0.0; expected None or a float in \(0, 448\]"),
    (NVFP4Profile, {"zero_sign": "minus"}, r"zero_sign='minus'; expected one of \['source', "),
    (FP8Profile, {"scale_arithmetic": "input_reciprocal"}, r"scale_arithmetic='input_reciprocal' evaluates "
                                                           r".*needs scale_formula='primus_turbo', got 'te'"),
    (FP8Profile, {"rounding": "sr"}, r"rounding='sr'; expected one of \['half_away', "),
    (NVFP4Profile, {"block_scale_rounding": "sr"}, r"block_scale_rounding='sr'; expected one of \['half_away', "),
    (FP8Profile, {"hadamard": "h32"}, r"hadamard='h32'; FP8 tensorwise profiles take no rotation"),
    (Profile, {"exponent_range": "saturate"}, r"exponent_range='saturate'; expected one of \['clamp', 'wrap', "
                                              r"'unsigned'\]"),
])
def test_bad_nvfp4_fp8_and_log2_fields_raise_naming_the_field(cls, kwargs, match):
    with pytest.raises(ValueError, match=rf"^profile 'bad': {match}"):
        cls("bad", **kwargs)


def test_divergence_takes_mx_profiles_only():
    with pytest.raises(ValueError, match=r"profile 'torchao.nvfp4' pins scaling 'nvfp4', not 'mx'; 'mx' profiles: ocp"):
        divergence("torchao.nvfp4", "ocp")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_an_fp8_profile_that_truncates_gives_the_largest_code_not_above_each_value(fmt):
    # float64 truth: every magnitude of the format (decode table), and the float32 product the
    # cast truncates (x * scale rounded once, as every FP8 quantizer forms it)
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(5))
    q = FP8Profile("trunc", rounding="trunc").quantized(x, fmt)
    scaled = (x * q.scale).double().abs().clamp(max=get_format(fmt).max)
    values = decode_table(fmt, dtype=torch.float64)
    grid = values[torch.isfinite(values) & (values >= 0)].unique()
    want = grid[torch.searchsorted(grid, scaled, right=True) - 1]
    got = values[q.codes.to(torch.int64)].abs()
    assert torch.equal(got, want)
    assert not torch.equal(q.codes, FP8Profile("rne").quantized(x, fmt).codes)  # it is not RNE
