"""Profiles: each implementation's quirk on a planted block, expected bits written out with
their source, and torchao 0.18's to_mx as the witness for torchao.floor / torchao.rceil."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from mxcheck.divergence import battery, divergence
from mxcheck.formats import get_format
from mxcheck.hadamard import apply_hadamard
from mxcheck.profiles import PROFILES, Profile, get_profile
from mxcheck.scaling.mx import mx_quantize
from tests._helpers import one_block, torchao_to_mx

pytestmark = pytest.mark.emulated

OCP_ELEMENTS = ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2")
RANDOM_CLASSES = ("normal", "normal_scaled", "heavy_tail", "bf16")


def quantize(profile: str, x: torch.Tensor, fmt: str | None = None, *, rotate: bool = False):
    """(codes of the first 4 elements, scale byte) of a one-block input; AITER's h32 rotation
    is left out unless asked, so the planted amax is the one the scale step sees."""
    p = get_profile(profile)
    p = p if rotate else replace(p, hadamard=None)
    codes, scales = p.quantize(x, fmt)
    return codes[0, :4].tolist(), scales[0, 0].item()


def nextbelow(v: float) -> float:
    return float(np.nextafter(np.float32(v), np.float32(0)))


def nextabove(v: float) -> float:
    return float(np.nextafter(np.float32(v), np.float32(np.inf)))


# ------------------------------------------------------------------ the table of profiles


def test_profiles_cover_the_implementations_the_issue_names():
    assert {"ocp", "primus_turbo.mxfp4", "aiter.mxfp6", "aiter.mxfp6.triton", "torchao.floor",
            "torchao.rceil", "te.mxfp8", "torchao.mxfp8"} <= set(PROFILES)
    for name, p in PROFILES.items():
        assert p.name == name and p.source, name


def test_a_profile_where_no_quirk_fires_is_mx_quantize(gen):
    # Random normals have a finite, non-zero amax far from 2^k: no quirk applies, so every
    # profile is mx_quantize with its rule, rounding and zero byte (composition, no copy).
    x = torch.randn(16, 64, generator=gen) * 3
    for p in PROFILES.values():
        p = replace(p, hadamard=None)
        fmt = p.fmt or "e4m3"
        codes, scales = p.quantize(x, fmt)
        q = mx_quantize(x, fmt, scale_rule=p.scale_rule, rounding=p.rounding, zero_scale=p.zero_scale)
        assert torch.equal(codes, q.codes) and torch.equal(scales, q.scales), p.name


@pytest.mark.parametrize("fmt", OCP_ELEMENTS)
def test_ocp_profile_is_mx_quantize_on_the_whole_battery(fmt):
    for name, x in battery(get_format(fmt)).items():
        codes, scales = PROFILES["ocp"].quantize(x, fmt)
        q = mx_quantize(x, fmt)
        assert torch.equal(codes, q.codes) and torch.equal(scales, q.scales), name


# ------------------------------------------------------------------ Primus-Turbo MXFP4


def test_primus_turbo_even_scale_takes_amax_7_a_binade_up():
    # primus_stack.md 1.2, compute_tile_scale: 7.0 = 1.75 * 2^2 rounds to 2^3 at one mantissa
    # bit, scale 2^(3-2) = 2 (byte 128): 3.5 -> 4 (RNE tie), 3.25 -> 3, 1.5, -0.5.
    # OCP floor: scale 2^0 (byte 127), 7 and 6.5 saturate to 6.
    x = one_block(7.0, 6.5, 3.0, -1.0)
    assert quantize("primus_turbo.mxfp4", x) == ([0x6, 0x5, 0x3, 0x9], 128)
    assert quantize("ocp", x, "e2m1") == ([0x7, 0x7, 0x5, 0xA], 127)


def test_primus_turbo_maps_an_inf_amax_to_byte_253_never_255():
    # compute_tile_scale: ((0x7F800000 + 0x200000) >> 23) & 0x1FF = 0xFF -> 255 - 129 = 126,
    # clamp [-127, 128], + 127 = 253. Inf saturates to +-6; 1.0 * 2^-126 rounds to 0.
    assert quantize("primus_turbo.mxfp4", one_block(math.inf, 1.0, -math.inf)) == ([0x7, 0x0, 0xF, 0x0], 253)


def test_primus_turbo_amax_ignores_nan():
    # fmaxf reductions drop NaN (primus_stack.md 1.2): the scale comes from 1.0 (even: 2^-2,
    # byte 125), 1.0 * 4 = 4.0 is code 0x6; the NaN element has no e2m1 code: 0.
    assert quantize("primus_turbo.mxfp4", one_block(math.nan, 1.0)) == ([0x0, 0x6, 0x0, 0x0], 125)


# ------------------------------------------------------------------ AITER MXFP6


def test_aiter_hip_zero_block_is_byte_127_and_inf_amax_is_byte_254():
    # quant_mxfp6_gemm.cu: amax == 0 -> scale 0 (byte 127); exponent == 0xFF -> 127 (byte 254),
    # where the floor rule's arithmetic gives 128 - 2 (byte 253). Inf saturates to 7.5 (0x1F).
    assert quantize("aiter.mxfp6", one_block()) == ([0, 0, 0, 0], 127)
    assert quantize("aiter.mxfp6", one_block(math.inf, 1.0)) == ([0x1F, 0, 0, 0], 254)
    assert quantize("ocp", one_block(math.inf, 1.0), "e2m3")[1] == 253


def test_aiter_hip_amax_ignores_nan():
    # fmaxf(local_amax, fabsf(NaN)) keeps local_amax: scale from 3.0 (floor 1 - 2, byte 126),
    # 3.0 * 2 = 6.0 = 1.5 * 2^2 is e2m3 code 0x1C.
    assert quantize("aiter.mxfp6", one_block(math.nan, 3.0)) == ([0x0, 0x1C, 0, 0], 126)


@pytest.mark.parametrize("k", [-20, -3, 4, 10, 20])
def test_aiter_triton_log2_scale_is_one_binade_high_at_nextbelow_pow2(k):
    # aiter_mxfp6_scale_log2.md: HIP reads exponent bits (floor = k - 1, byte 127 + k - 3);
    # Triton/torch floor(log2) in float32 returns k (byte 127 + k - 2). The element
    # nextbelow(2^k) then saturates to 7.5 (0x1F) under HIP and rounds half away to 4.0 (0x18).
    amax = nextbelow(2.0**k)
    assert math.floor(torch.log2(torch.tensor(amax)).item()) == k  # the float32 hazard itself
    assert quantize("aiter.mxfp6", one_block(amax)) == ([0x1F, 0, 0, 0], 127 + k - 3)
    assert quantize("aiter.mxfp6.triton", one_block(amax)) == ([0x18, 0, 0, 0], 127 + k - 2)


def test_aiter_triton_floors_amax_at_1e_minus_30():
    # _quant_pack_kernel: log2(max(amax, 1e-30)): floor(-99.66) - 2 = -102 (byte 25), so a
    # block of amax 2^-110 rounds to zero. HIP: -110 - 2 (byte 15), 2^-110 / 2^-112 = 4 (0x18).
    assert quantize("aiter.mxfp6.triton", one_block(2.0**-110)) == ([0, 0, 0, 0], 25)
    assert quantize("aiter.mxfp6", one_block(2.0**-110)) == ([0x18, 0, 0, 0], 15)


def test_aiter_triton_nan_block_takes_the_zero_block_byte():
    # quant_mxfp6_torch: where(amax > 0, scale_exp, 0) and NaN > 0 is False: byte 127, and
    # 3.0 is encoded at scale 1 (1.5 * 2^1, code 0x14).
    assert quantize("aiter.mxfp6.triton", one_block(math.nan, 3.0)) == ([0x0, 0x14, 0, 0], 127)


@pytest.mark.parametrize("name", ["aiter.mxfp6", "aiter.mxfp6.triton"])
def test_aiter_profiles_rotate_with_h32_before_the_scale_step(name, gen):
    x = torch.randn(4, 64, generator=gen)
    p = PROFILES[name]
    assert p.hadamard == "h32"
    rotated = replace(p, hadamard=None).quantize(apply_hadamard(x, "h32"))
    for got, want in zip(p.quantize(x), rotated, strict=True):
        assert torch.equal(got, want)


def test_aiter_hip_and_triton_differ_only_at_ties_nextbelow_pow2_tiny_amax_and_nan():
    # The HIP packer (bf16/fp16 input on gfx950) rounds ties to even, the Triton/torch packer
    # (float32 input) away from zero (gemm_op_a6w6.py @ 878d1dea, vendor_audit.md): the
    # tie classes ("ties", and "bf16", whose short mantissas land on midpoints) differ too.
    report = divergence("aiter.mxfp6", "aiter.mxfp6.triton")
    differing = {c.name for c in report.classes if c.scale_diff or c.code_diff}
    assert differing == {"ties", "bf16", "amax_below_pow2", "tiny", "nan"}  # 1e-30 floor and NaN policy aside
    ties = next(c for c in report.classes if c.name == "ties")
    assert ties.code_diff > 0 and ties.scale_diff == 0
    below = next(c for c in report.classes if c.name == "amax_below_pow2")
    assert below.scale_diff > below.blocks // 2  # k in [-20, 20]: log2 rounds for |k| >= 3 or so
    for c in report.classes:
        if c.name in RANDOM_CLASSES and c.name != "bf16":  # bf16 inputs hit midpoints (above)
            assert (c.scale_diff, c.code_diff) == (0, 0), c.name


# ------------------------------------------------------------------ torchao (witness: to_mx)

@pytest.mark.parametrize("rule", ["floor", "rceil"])
@pytest.mark.parametrize("fmt", OCP_ELEMENTS)
def test_torchao_profiles_match_to_mx_on_the_whole_battery(fmt, rule):
    # Includes the byte-0 blocks (class tiny) and amax = nextabove(max * 2^k) (amax_above_max).
    # In a NaN block (byte 255) torchao leaves whatever its cast made; mxcheck stores its own.
    profile = PROFILES[f"torchao.{rule}"]
    for name, x in battery(get_format(fmt)).items():
        codes, scales = profile.quantize(x, fmt)
        ao_scales, ao_codes, _ = torchao_to_mx(x, fmt, rule)
        assert torch.equal(scales, ao_scales), (name, int((scales != ao_scales).sum()))
        keep = (scales != 255).repeat_interleave(32, dim=-1)
        assert torch.equal(codes[keep], ao_codes[keep]), (name, int((codes[keep] != ao_codes[keep]).sum()))


def test_torchao_floor_divides_byte_zero_blocks_by_2_pow_minus_126():
    # to_mx: scale_fp32 = clamp(2^(0 - 127), min=F32_MIN_NORMAL): 2^-126 -> 1.0 (0x38) and
    # 2^-127 -> 0.5 (0x30), where OCP's 2^-127 gives 2.0 (0x40) and 1.0 (0x38).
    x = one_block(2.0**-126, 2.0**-127)
    assert quantize("torchao.mxfp8", x) == ([0x38, 0x30, 0, 0], 0)
    assert quantize("ocp", x, "e4m3") == ([0x40, 0x38, 0, 0], 0)
    assert torchao_to_mx(x, "e4m3", "floor")[1][0, :2].tolist() == [0x38, 0x30]


def test_torchao_rceil_leaves_byte_zero_blocks_unscaled():
    # _to_mx_rceil: rcp_fp32 = 1.0 where the byte is 0, so 2^-126 stays 2^-126 and rounds to
    # 0; TE's exp2f_rcp(0) = 2^127 gives 2.0 (0x40).
    x = one_block(2.0**-126)
    assert quantize("torchao.rceil", x, "e4m3") == ([0, 0, 0, 0], 0)
    assert quantize("te.mxfp8", x) == ([0x40, 0, 0, 0], 0)
    assert torchao_to_mx(x, "e4m3", "rceil")[1][0, 0].item() == 0


def test_torchao_rceil_log2_scale_is_one_binade_low_at_nextabove_max_pow2():
    # amax = nextabove(448 * 2^10): descale = nextabove(2^10), whose float32 log2 is 10.0,
    # so ceil gives 10 (byte 137) and 458752.03 / 2^10 saturates to 448 (0x7E). Exact RCEIL
    # (TE): 11 (byte 138), 224.00002 -> 224 (0x76).
    x = one_block(nextabove(448.0 * 2**10))
    assert quantize("torchao.rceil", x, "e4m3") == ([0x7E, 0, 0, 0], 137)
    assert quantize("te.mxfp8", x) == ([0x76, 0, 0, 0], 138)
    scales, codes, _ = torchao_to_mx(x, "e4m3", "rceil")
    assert (codes[0, 0].item(), scales.item()) == (0x7E, 137)


# ------------------------------------------------------------------ TransformerEngine MXFP8


def test_te_and_torchao_rceil_saturate_an_inf_amax_to_254():
    # TE float_to_e8m0 (cvt.rp.satfinite): Inf -> 0xFE; torchao 0.18's isinf branch too. A
    # NOSAT conversion would give 0xFF (section 8 case 7): inf_amax_byte=255 models it.
    x = one_block(math.inf, 1.0)
    assert quantize("te.mxfp8", x) == ([0x7E, 0, 0, 0], 254)
    assert quantize("torchao.rceil", x, "e4m3") == ([0x7E, 0, 0, 0], 254)
    assert torchao_to_mx(x, "e4m3", "rceil")[0].item() == 254
    assert replace(PROFILES["te.mxfp8"], inf_amax_byte=255).quantize(x)[1].item() == 255


def test_te_amax_ignores_nan_and_the_nan_element_keeps_its_sign():
    # fmaxf amax skips NaN: amax 448 -> descale 1 -> byte 127; cvt.rn.satfinite NaN -> 0x7F | sign.
    x = one_block(math.nan, 448.0, -math.nan)
    assert quantize("te.mxfp8", x) == ([0x7F, 0x7E, 0xFF, 0], 127)


def test_te_reciprocal_multiply_changes_no_scale_byte_of_any_mx_format():
    # Pinned: amax * fl32(1/max) and the correctly rounded amax / max round up to the same
    # power of two for every float32 amax within 16 ulps of max * 2^k (k over all of float32,
    # where a difference could only arise) and around the byte-0/byte-1 edge (descale 2^-127).
    for fmt in OCP_ELEMENTS:
        f = get_format(fmt)
        centres = [np.float32(f.max * 2.0**k) for k in range(-150, 128) if f.max * 2.0**k < 2.0**128]
        centres = [c for c in centres if c > 0]
        bits = np.concatenate([np.arange(-16, 17) + np.array([c]).view(np.int32)[0] for c in centres])
        amax = torch.from_numpy(bits.astype(np.int32)).view(torch.float32)
        amax = amax[torch.isfinite(amax) & (amax > 0)]
        x = torch.zeros(len(amax), 32)
        x[:, 0] = amax
        te = Profile("te", fmt, scale_rule="rceil", rceil_reciprocal=True)
        assert torch.equal(te.quantize(x)[1], replace(te, rceil_reciprocal=False).quantize(x)[1]), fmt


# ------------------------------------------------------------------ microxcaling


def test_microxcaling_log2_scale_and_half_away_at_nextbelow_16():
    # reference_emulators.md 1a: e2m1 amax 15.999999: microxcaling scale 2^2 (byte 129),
    # 3.9999998 -> 4 (0x6, dequant 16); OCP byte 128, 7.9999995 saturates to 6 (0x7, dequant 12).
    x = one_block(nextbelow(16.0))
    assert quantize("microxcaling", x, "e2m1") == ([0x6, 0, 0, 0], 129)
    assert quantize("ocp", x, "e2m1") == ([0x7, 0, 0, 0], 128)


def test_microxcaling_inf_block_is_all_nan():
    # _quantize_mx: log2(inf) > scale_emax -> NaN shared exponent: the whole block is NaN.
    assert quantize("microxcaling", one_block(math.inf, 1.0), "e4m3") == ([0x7F, 0x7F, 0x7F, 0x7F], 255)


# ------------------------------------------------------------------ one row per profile


@pytest.mark.parametrize(("name", "fmt", "byte"), [
    ("ocp", "e2m1", 253), ("ocp", "e4m3", 247),  # floor arithmetic on Inf's field: 128 - emax
    ("primus_turbo.mxfp4", None, 253), ("aiter.mxfp6", None, 254), ("aiter.mxfp6.triton", None, 254),
    ("torchao.floor", "e2m1", 253), ("torchao.rceil", "e4m3", 254), ("te.mxfp8", None, 254),
    ("microxcaling", "e2m1", 255),
])
def test_inf_amax_byte_of_each_profile(name, fmt, byte):
    assert quantize(name, one_block(1.0, -math.inf), fmt)[1] == byte


@pytest.mark.parametrize(("name", "fmt", "byte"), [
    ("ocp", "e4m3", 255), ("torchao.mxfp8", None, 255), ("microxcaling", "e2m1", 255),  # block NaN
    ("te.mxfp8", None, 119),  # rceil of the finite 1.0: ceil(log2(1/448)) = -8
    ("primus_turbo.mxfp4", None, 125), ("aiter.mxfp6", None, 125),  # floor/even of 1.0: -2
    ("aiter.mxfp6.triton", None, 127),  # NaN amax fails amax > 0: the zero-block byte
])
def test_nan_policy_of_each_profile(name, fmt, byte):
    assert quantize(name, one_block(math.nan, 1.0), fmt)[1] == byte


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"fmt": "e8m0"}, "fmt='e8m0'"),
    ({"scale_rule": "round"}, "scale_rule='round'"),
    ({"rounding": "sr"}, "rounding='sr'"),
    ({"exponent_source": "log10"}, "exponent_source='log10'"),
    ({"exponent_range": "wrap2"}, "exponent_range='wrap2'"),
    ({"amax_floor": 1e-30}, "amax_floor=1e-30"),
    ({"inf_amax_byte": 256}, "inf_amax_byte=256"),
    ({"nan_policy": "drop"}, "nan_policy='drop'"),
    ({"rceil_reciprocal": True}, "rceil_reciprocal=True"),
    ({"subnormal_scale_clamp": 3.0}, "subnormal_scale_clamp=3.0"),
    ({"zero_scale": 255}, "zero_scale=255"),
])
def test_bad_profile_fields_raise_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=rf"profile 'bad': .*{match}"):
        Profile("bad", **kwargs)


def test_family_needs_a_format_and_a_pinned_profile_refuses_another():
    with pytest.raises(ValueError, match="'ocp' is a family: pass fmt"):
        PROFILES["ocp"].quantize(one_block(1.0))
    with pytest.raises(ValueError, match="pinned to e4m3, got fmt='e5m2'"):
        PROFILES["te.mxfp8"].quantize(one_block(1.0), "e5m2")


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"profile 'nvidia' is not known; known profiles: ocp, "):
        get_profile("nvidia")


def test_exponent_range_wrap_stores_the_unclamped_biased_exponent_modulo_256():
    # amax 1.5 * 2^-126 in e2m1 (emax 2, OCP MX v1.0): floor(log2 amax) - emax = -128, one
    # below E8M0's range; clamped it is byte 0, stored unclamped (-128 + 127) mod 256 = 255.
    amax = 1.5 * 2.0**-126
    x = torch.zeros(2, 32)
    x[0, 3], x[1, 7] = amax, 1.0  # row 1: an in-range block, the same either way
    want = (math.floor(math.log2(amax)) - 2 + 127) % 256
    clamped = Profile("clamp").quantize(x, "e2m1")
    wrapped = Profile("wrap", exponent_range="wrap").quantize(x, "e2m1")
    assert (int(clamped[1][0, 0]), int(wrapped[1][0, 0])) == (0, want)
    assert torch.equal(wrapped[1][1], clamped[1][1])
    assert torch.equal(wrapped[0], clamped[0])  # the codes use the clamped exponent
