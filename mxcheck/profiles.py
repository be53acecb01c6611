"""Profiles: quantizers pinned to one implementation's exact bits, quirks included.

Three kinds share one vocabulary (``mxcheck.profile_base.ProfileBase``): MX
(``mxcheck.profile_mx.Profile``), NVFP4 and FP8 tensorwise (``mxcheck.profile_kinds``).
This module is the registry: the named MX implementations (``PROFILES``), every named
profile of every kind (``ALL_PROFILES``), profiles stated as data (a recipe file's inline
profile, a fit), the lookup (``get_profile``) and what pinning an ``OperandSpec`` to one
means (``pin_problem``, ``pinned_fields``). An ``OperandSpec`` pinned to a profile
(``profile=``) is quantized as that profile does. The kinds' classes are re-exported here,
the import path every caller uses.
"""

from __future__ import annotations

from dataclasses import fields

from mxcheck.profile_base import ProfileBase
from mxcheck.profile_kinds import FP8_PROFILES, NVFP4_PROFILES, FP8Profile, NVFP4Profile
from mxcheck.profile_mx import (
    EXPONENT_RANGES,
    EXPONENT_SOURCES,
    HALF_AWAY_SUMS,
    NAN_POLICIES,
    Profile,
)

__all__ = ["ALL_PROFILES", "EXPONENT_RANGES", "EXPONENT_SOURCES", "FP8_PROFILES", "HALF_AWAY_SUMS", "NAN_POLICIES",
           "NVFP4_PROFILES", "PROFILES", "PROFILE_KINDS", "QUIRK_FIELDS", "STATED_PROFILES", "AnyProfile",
           "FP8Profile", "NVFP4Profile", "Profile", "get_profile", "pin_problem", "pinned_fields",
           "register_profile"]

# ---- the profiles -------------------------------------------------------------------

_TORCHAO = "pytorch/ao 0.18.0 torchao/prototype/mx_formats/mx_tensor.py::to_mx"
_AITER_HIP = "ROCm/aiter csrc/kernels/quant_mxfp6_gemm.cu::quant_mxfp6_group @1a57ff4d"
_AITER_TRITON = "ROCm/aiter aiter/ops/gemm_op_a6w6.py::_quant_pack_kernel, quant_mxfp6_torch @08481f1b"
_MXFP6_NOTES = ("rotation h32 along the last axis; the HIP butterflies, the Triton bf16 dot and mxcheck "
                "sum in different orders, so bit-exactness needs the same order (aiter_mxfp6_scale_log2.md)",)
_AITER_MXFP6_INPUT = ("which packer runs (gemm_op_a6w6.py::quant_mxfp6_gemm @878d1dea): on gfx950 a bf16/fp16 "
                      "input takes the HIP kernel (this profile: cvt_scalef32_2xpk16_fp6, ties to even, fp32 "
                      "butterfly Hadamard); a float32 input, or AITER_MXFP6_QUANT_BACKEND=triton, takes the "
                      "Triton/torch packer (aiter.mxfp6.triton: floor(a*q + 0.5), ties away)",)

PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("ocp", source="OCP MX v1.0 floor rule (as quoted by torchao and microxcaling); mx_quantize defaults",
            notes=("a family: choose the element format per use",)),
    Profile("primus_turbo.mxfp4", "e2m1", scale_rule="even", inf_amax_byte=253, nan_policy="ignore",
            source="AMD-AGI/Primus-Turbo csrc/kernels/quantization/quantization_mxfp4.cu::compute_tile_scale @a6a16cdc",
            notes=("Inf amax: (0x7F800000 + 0x200000) >> 23 & 0x1FF = 0xFF -> 126 -> byte 253, never 255",
                   "fmaxf amax reductions drop NaN (primus_stack.md 1.2, code reading)",
                   "byte 0 acts as 2^-127 in v_cvt_scalef32_pk_fp4_f32 (inferred)")),
    Profile("aiter.mxfp6", "e2m3", rounding="rne", zero_scale=127, hadamard="h32",
            inf_amax_byte=254, nan_policy="ignore", source=_AITER_HIP,
            notes=("scale from exponent bits: exponent == 0 ? -127 : exponent == 0xFF ? 127 : exponent - 129",
                   "amax == 0 -> scale 0 (byte 127); fmaxf amax ignores NaN", *_AITER_MXFP6_INPUT,
                   *_MXFP6_NOTES)),
    Profile("aiter.mxfp6.triton", "e2m3", rounding="half_away", zero_scale=127, hadamard="h32",
            exponent_source="log2_fp32", amax_floor=1e-30, inf_amax_byte=254, nan_policy="zero_scale",
            source=_AITER_TRITON,
            notes=(*_AITER_MXFP6_INPUT, "floor(log2(max(amax, 1e-30))) - 2 in float32: one binade high at nextbelow(2^k), "
                   "byte 25 for 0 < amax < 1e-30",
                   "where(amax > 0, se, 0): a NaN amax gives byte 127 (torch path; Triton's tl.max "
                   "NaN handling not verified)", *_MXFP6_NOTES)),
    Profile("aiter.mxfp4.triton", "e2m1", scale_rule="even", rounding="half_away",
            source="amd-aiter 0.1.7.post2.dev18 aiter/utility/fp4_utils.py::_dynamic_mxfp4_quant_kernel (Triton)",
            notes=("scale: (amax bits + 0x200000) & 0xFF800000, floor(log2) - 2: the even rule",
                   "codes: ((e << 2 | m >> 21) + 1) >> 1 on the float32 bits: ties away from zero",
                   "byte = scale_e8m0_unbiased.to(tl.uint8) + 127 converts a negative float to unsigned; "
                   "on an NVIDIA H200 that saturates to 0, so every block with a negative exponent stores "
                   "byte 127 (references/vectors/aiter_triton_mxfp4_h200.pt); this profile gives the bytes "
                   "the kernel means (wrap-around), the H200 run is pinned by a test")),
    Profile("torchao.floor", subnormal_scale_clamp=2.0**-126, source=_TORCHAO,
            notes=("scale_fp32 = clamp(2^(b-127), min=F32_MIN_NORMAL): byte-0 blocks are divided by 2^-126",
                   "NaN blocks: byte 255, element bits left as the cast made them (mxcheck stores its own)")),
    Profile("torchao.rceil", scale_rule="rceil", exponent_source="log2_fp32", subnormal_scale_clamp=1.0,
            source=f"{_TORCHAO} -> _to_mx_rceil (CPU fallback)",
            notes=("ceil(log2(max_abs / max_pos)) in float32: one binade low at nextabove(max * 2^k)",
                   "rcp_fp32 = 1.0 where the byte is 0: those blocks' elements are not scaled",
                   "Inf -> 254 (isinf branch)")),
    Profile("torchao.ceil", scale_rule="ceil", subnormal_scale_clamp=2.0**-126, source=_TORCHAO,
            notes=("ScaleCalculationMode.CEIL from amax's float32 bits; byte-0 blocks divided by 2^-126 as FLOOR's",)),
    Profile("torchao.even", scale_rule="even", subnormal_scale_clamp=2.0**-126, source=_TORCHAO,
            notes=("ScaleCalculationMode.EVEN from amax's float32 bits; byte-0 blocks divided by 2^-126 as FLOOR's",)),
    Profile("torchao.mxfp8", "e4m3", subnormal_scale_clamp=2.0**-126, source=_TORCHAO,
            notes=("to_mx defaults: e4m3, ScaleCalculationMode.FLOOR",)),
    Profile("torchao.mxfp4", "e2m1", subnormal_scale_clamp=2.0**-126, source=_TORCHAO),
    Profile("te.mxfp8", "e4m3", scale_rule="rceil", rceil_reciprocal=True, inf_amax_byte=254,
            nan_policy="ignore",
            source="NVIDIA/TransformerEngine transformer_engine/common/cast/mxfp8/quantize_mxfp8.cuh, "
                   "util/ptx_arch_spec.cuh::float_to_e8m0 @d0067d0",
            notes=("cvt.rp.satfinite.ue8m0x2.f32: Inf -> 0xFE; fmaxf amax ignores NaN; NaN element -> 0x7F",
                   "exp2f_rcp(0) = 2^127: byte-0 blocks are exact")),
    Profile("torchao0.7.floor", exponent_source="log2_input", subnormal_scale_clamp=2.0**-126,
            source="pytorch/ao v0.7.0 @f04aec72 (and v0.8.0 @192eed5e) torchao/prototype/mx_formats/mx_tensor.py::to_mx",
            notes=("max_abs = amax(abs(data_hp)) in the input's dtype; floor(log2(max_abs + eps)) in that dtype: "
                   "for bf16 input log2 rounds to 8 bits (log2(255) = 8.0, one binade high), for float32 input "
                   "the float32 hazard of log2_fp32", "scale_fp clamped to F32_MIN_NORMAL, as torchao.floor")),
    Profile("torchao0.9.ceil", scale_rule="ceil", exponent_source="log2_input", subnormal_scale_clamp=2.0**-126,
            source="pytorch/ao v0.9.0 @14cfbc74 torchao/prototype/mx_formats/mx_tensor.py::to_mx "
                   "(ScaleCalculationMode.CEIL)",
            notes=("ceil(log2(max_abs + eps)) in the input's dtype: a float32 (or bf16) log2 that rounds to k "
                   "just above 2^k gives a scale one binade low", "later releases read the exponent bits")),
    Profile("microxcaling", exponent_source="log2_fp32", rounding="half_away", inf_amax_byte=255,
            half_away_sum="float32",
            source="microsoft/microxcaling mx/mx_ops.py::_quantize_mx, _shared_exponents @7bc4195",
            notes=("Python path (the project's golden reference), round='nearest' (half away)",
                   "floor(log2(amax)) in float32; log2(inf) > 127 -> NaN: an Inf block is all NaN",
                   "floor(|t| + 0.5) in float32 (t in quanta): t = nextbelow(0.5) rounds up (section 8 case 2)")),
)}


AnyProfile = Profile | NVFP4Profile | FP8Profile
ALL_PROFILES: dict[str, AnyProfile] = {**PROFILES, **NVFP4_PROFILES, **FP8_PROFILES}
"""Every named profile, MX first; ``get_profile`` looks names up here."""


PROFILE_KINDS: dict[str, type] = {"mx": Profile, "nvfp4": NVFP4Profile, "tensor": FP8Profile}
"""Each profile kind by the OperandSpec scaling it pins (the ``kind`` of a profile in a file)."""


STATED_PROFILES: dict[str, AnyProfile] = {}
"""Profiles stated as data (a recipe file's inline profile, a fit), by name; not in
``ALL_PROFILES`` (the registered implementations the catalogue tries), known to
``get_profile`` and ``OperandSpec(profile=)`` alike."""


def register_profile(p: AnyProfile) -> AnyProfile:
    """Make p known by its name (``get_profile``, ``OperandSpec(profile=)``): a profile
    stated as data. Stating the same profile again is a no-op; another profile under a known
    name is a ValueError."""
    if not isinstance(p, ProfileBase):
        raise TypeError(f"profile={p!r}; expected a Profile, NVFP4Profile or FP8Profile")
    have = ALL_PROFILES.get(p.name) or STATED_PROFILES.get(p.name)
    if have is not None and have != p:
        raise ValueError(f"profile {p.name!r} is already known with other fields; name it otherwise")
    STATED_PROFILES[p.name] = p
    return p


def _lookup(name: object) -> AnyProfile | None:
    return ALL_PROFILES.get(name) or STATED_PROFILES.get(name) if isinstance(name, str) else None


def get_profile(profile: str | AnyProfile, scaling: str | None = None) -> AnyProfile:
    """A profile by name (or the profile itself); ValueError listing the known names.
    ``scaling`` (e.g. "mx"): refuse a profile of another kind."""
    p = profile if isinstance(profile, ProfileBase) else _lookup(profile)
    if p is None:
        raise ValueError(f"profile {profile!r} is not known; known profiles: {', '.join(ALL_PROFILES)}")
    if scaling is not None and p.scaling != scaling:
        same = [n for n, q in ALL_PROFILES.items() if q.scaling == scaling]
        raise ValueError(f"profile {p.name!r} pins scaling {p.scaling!r}, not {scaling!r}; "
                         f"{scaling!r} profiles: {', '.join(same)}")
    return p


def pin_problem(spec) -> str:
    """What is wrong with pinning an OperandSpec to ``spec.profile``, or "" (the spec's own
    fields are checked already). Read by ``OperandSpec.__post_init__``."""
    name = spec.profile
    p = _lookup(name)
    if p is None:
        return f"profile={name!r} is not known; known profiles: {', '.join(ALL_PROFILES)}"
    if spec.scaling != p.scaling:
        same = [n for n, q in ALL_PROFILES.items() if q.scaling == spec.scaling] or ["none"]
        return (f"profile={name!r} pins scaling {p.scaling!r}, but scaling={spec.scaling!r}; set "
                f"scaling={p.scaling!r}, or pin a {spec.scaling!r} profile ({', '.join(same)})")
    if p.fmt is not None and p.fmt != spec.fmt:
        return (f"profile={name!r} is pinned to fmt={p.fmt!r}, but fmt={spec.fmt!r}; set fmt={p.fmt!r} "
                "or pin a profile of that format")
    for field, shape in (("block_2d", True), ("pad_to", None)):
        value = getattr(spec, field)
        if (value is True) if shape else (value is not None):
            return (f"{field}={value!r} with profile={name!r}: profiles quantize unpadded 1D blocks along the "
                    f"contraction axis; drop {field} or the profile")
    for field in p.spec_fields:
        have, want = getattr(spec, field), getattr(p, field)
        if have != want:
            return (f"{field}={have!r} disagrees with profile {name!r}, which has {field}={want!r}; set "
                    f"{field}={want!r} (Recipe.with_profile does) or drop the profile")
    for field, want in p.spec_defaults.items():
        if getattr(spec, field) != want:
            return (f"{field}={getattr(spec, field)!r} with profile={name!r}, which models {field}={want!r} "
                    "only; set it so or drop the profile")
    return ""


def pinned_fields(profile: str | AnyProfile) -> dict[str, object]:
    """The OperandSpec fields that pin a spec to the profile: ``profile=`` and the spec
    fields the profile repeats (scale rule, rounding, zero byte, rotation, ...)."""
    p = get_profile(profile)
    return {"profile": p.name, **{f: getattr(p, f) for f in p.spec_fields}}


QUIRK_FIELDS = tuple(f.name for f in fields(Profile) if f.name not in ("name", "source", "notes"))
