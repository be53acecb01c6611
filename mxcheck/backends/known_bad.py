"""Backends with one seeded bug each: the conformance suite must fail every one of them.

Each wraps the emulated backend and breaks one thing the way real kernels have broken.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, ClassVar

import torch

from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.diagnose.accumulation import HOPPER_FAST_ACCUMULATION
from mxcheck.formats import FloatFormat, decode, decode_table, encode_bits, get_format
from mxcheck.profiles import FP8Profile, NVFP4Profile, Profile
from mxcheck.scaling import fp8 as _fp8
from mxcheck.scaling import mx as _mx
from mxcheck.scaling import nvfp4 as _nvfp4
from mxcheck.scaling import rules as _rules

__all__ = ["KNOWN_BAD"]


class NibbleSwap(EmulatedBackend):
    """Reads packed fp4 with the high nibble first (torchao before 2025-10, issue #2939)."""

    name = "bad-nibble-swap"

    def gemm(self, a, b, **kw):
        if getattr(getattr(a, "fmt", None), "bits", None) == 4:  # packed two codes per byte
            codes = a.codes.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
            a = replace(a, codes=codes)
        return super().gemm(a, b, **kw)


class WrongScaleRule(EmulatedBackend):
    """Quantizes MX operands with OCP floor whatever the recipe says (even, rceil)."""

    name = "bad-scale-rule"

    def quantize(self, x, spec):
        return super().quantize(x, replace(spec, scale_rule="floor") if spec.scaling == "mx" else spec)


class StaleWeight(EmulatedBackend):
    """Caches the first weight it sees, as a quantized-weight cache keyed on the wrong thing."""

    name = "bad-stale-weight"

    def __init__(self) -> None:
        self._cached: torch.Tensor | None = None

    def linear(self, x, weight, bias, recipe):
        if self._cached is None or self._cached.shape != weight.shape:
            self._cached = weight.detach().clone()
        return super().linear(x, self._cached, bias, recipe)


class Bf16Fallback(EmulatedBackend):
    """Silently runs the linear in bf16: trains fine, quantizes nothing (Primus PR #1010)."""

    name = "bad-bf16-fallback"

    def linear(self, x, weight, bias, recipe):
        y = torch.nn.functional.linear(x.bfloat16(), weight.bfloat16(), None if bias is None else bias.bfloat16())
        return y.to(recipe.out_dtype)


class NanToZero(EmulatedBackend):
    """Flushes NaN inputs to zero before quantizing (hides a diverging run)."""

    name = "bad-nan-to-zero"

    def linear(self, x, weight, bias, recipe):
        return super().linear(torch.nan_to_num(x, nan=0.0), weight, bias, recipe)


class DropsBias(EmulatedBackend):
    """Forgets the bias (and so its gradient)."""

    name = "bad-drops-bias"

    def linear(self, x, weight, bias, recipe):
        y = super().linear(x, weight, None, recipe)
        return y + 0 * bias.sum() if bias is not None else y


@contextlib.contextmanager
def _patched(targets: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Inside: each (owner, name) holds the given replacement; restored on exit."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    try:
        for owner, name, new in targets:
            setattr(owner, name, new)
        yield
    finally:
        for owner, name, old in saved:
            setattr(owner, name, old)


class _SeededBug(EmulatedBackend):
    """Runs quantize and linear inside ``bug()``: the oracle with one thing swapped where
    a kernel would have it (the oracle's quantizers take rounding as data only for MX, so
    the element encoders that every quantizer calls are wrapped instead)."""

    def bug(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def quantize(self, x, spec, **kw):
        with self.bug():
            return super().quantize(x, spec, **kw)

    def linear(self, x, weight, bias, recipe, **kw):
        with self.bug():
            return super().linear(x, weight, bias, recipe, **kw)


def _element_rounding(swap: dict[str, str]) -> contextlib.AbstractContextManager[None]:
    """Element codes rounded with swap[rounding] (block scales keep theirs: only the
    element formats, never ue4m3 or E8M0, go through the swap)."""
    def wrap(encode: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def swapped(x: torch.Tensor, fmt: FloatFormat, rounding: str = "rne", *args: Any, **kw: Any) -> torch.Tensor:
            if fmt.name != "ue4m3":
                rounding = swap.get(rounding, rounding)
            return encode(x, fmt, rounding, *args, **kw)
        return swapped
    return _patched([(_mx, "encode_bits_float", wrap(_mx.encode_bits_float)),
                     (_nvfp4, "encode_bits", wrap(_nvfp4.encode_bits)),
                     (_fp8, "encode_bits", wrap(_fp8.encode_bits))])


class HalfAwayForRne(_SeededBug):
    """Rounds element ties away from zero where the recipe says RNE, and to even where it
    says half-away (AITER MXFP6: the Triton packer rounds half away, the HIP packer RNE)."""

    name = "bad-half-away"

    def bug(self):
        return _element_rounding({"rne": "half_away", "half_away": "rne"})


class TruncForRne(_SeededBug):
    """Truncates element codes toward zero where the recipe says RNE or half-away (a cvt
    with the wrong rounding-mode suffix)."""

    name = "bad-trunc"

    def bug(self):
        return _element_rounding({"rne": "trunc", "half_away": "trunc"})


def _log2_rule(rule: str) -> Callable[[torch.Tensor, FloatFormat], torch.Tensor]:
    """The scale rule computed with a float32 ``log2`` (microxcaling's Python path, gfloat on
    float32 arrays): log2 of nextbelow(2**k) rounds to k, a binade too high."""
    def exponent(amax: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
        right = _RULES[rule](amax, fmt)
        if rule == "rceil":
            e = torch.ceil(torch.log2((amax.double() / fmt.max).float()))
        elif rule == "even":  # the bumped amax, then floor(log2) of its value (not its field)
            bumped = (amax.view(torch.int32) + (1 << (22 - fmt.mbits))).view(torch.float32)
            e = torch.floor(torch.log2(bumped)) - fmt.emax
        else:
            e = (torch.ceil if rule == "ceil" else torch.floor)(torch.log2(amax)) - fmt.emax
        # Only finite, non-zero amaxes go through log2 (zero, Inf and NaN keep their policy).
        ok = torch.isfinite(amax) & (amax > 0) & torch.isfinite(e)
        return torch.where(ok, e.clamp(-1000, 1000).to(right.dtype), right)
    return exponent


_RULES = dict(_rules.SCALE_RULES)


class Float32Log2Scale(_SeededBug):
    """Takes the MX block exponent from a float32 ``log2`` of the amax instead of its bits."""

    name = "bad-log2-scale"

    def bug(self):
        return _patched([(_rules, "SCALE_RULES", {r: _log2_rule(r) for r in _RULES})])


class GarbageUnlessKMod256(EmulatedBackend):
    """Returns garbage, with no error, when K % 256 != 0 (aiter#4176: gemm_a4w4, relative
    error 1e3 to 1e7); its linear runs the reference Function on that GEMM, as adapters do."""

    name = "bad-k-mod-256"

    def gemm(self, a, b, **kw):
        out = super().gemm(a, b, **kw)
        k = (a.shape if hasattr(a, "shape") else a.codes.shape)[-1]
        return out.flip(-1) * 1e3 if k % 256 else out

    def linear(self, x, weight, bias, recipe):
        from mxcheck.functions import quant_linear  # noqa: PLC0415

        return quant_linear(x, weight, bias, recipe, gemm=self.gemm)


# ---- scales held in too narrow a type: bugs that lose whole tensors ------------------------
# Each is invisible on the tiled inputs (tensor amax 336 / 0.875: every per-tensor scale a
# power of two, no gradient magnitudes) and caught by the magnitude families.


class _QuantizeBug(EmulatedBackend):
    """Runs quantize inside ``bug(x)`` (patches that may depend on the input's dtype)."""

    def bug(self, x: torch.Tensor) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def quantize(self, x, spec, **kw):
        with self.bug(x):
            return super().quantize(x, spec, **kw)


class NVFP4ScaleThreshold(EmulatedBackend):
    """Treats an NVFP4 block scale under an absolute threshold as missing: the decoded
    scale S = fp32(s) * tensor_scale becomes ``S if S >= 1e-5 else 1.0`` before the
    elements are divided by it, so a gradient-magnitude tensor quantizes to all zeros."""

    name = "bad-nvfp4-scale-threshold"
    threshold = 1e-5

    def quantize(self, x, spec, **kw):
        q = super().quantize(x, spec, **kw)
        if spec.scaling != "nvfp4":
            return q
        # S = fp32(s) * tensor_scale; where S < threshold the kernel divides by 1 instead
        # (elsewhere it keeps the oracle's elements: only the threshold is the bug).
        s = decode_table("ue4m3")[q.block_scales.to(torch.int64)] * q.tensor_scale
        small = (s < self.threshold).repeat_interleave(16, dim=-1)
        e2m1 = get_format("e2m1")
        unscaled = encode_bits(torch.clamp(x.to(torch.float32), -e2m1.max, e2m1.max), e2m1, "rne", True)  # x / 1.0
        return replace(q, codes=torch.where(small, unscaled, q.codes))


def _nvfp4_encode_scale_in(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """TE's S_enc = 2688 / amax evaluated in ``dtype``; a non-finite (or zero) result falls
    back to 1, as a kernel's ``if not isfinite(s): s = 1`` does."""
    def s_enc(amax: torch.Tensor) -> torch.Tensor:
        s = torch.tensor(448.0 * 6.0, dtype=dtype) / amax.to(dtype)
        return torch.where(torch.isfinite(s) & (s != 0), s, torch.ones_like(s)).to(torch.float32)
    return s_enc


class NVFP4EncodeScaleInInputDtype(_QuantizeBug):
    """Computes NVFP4's per-tensor encode factor 2688 / amax in the input's dtype: in float16
    it overflows for amax < 0.041 and falls back to 1, so every block scale underflows."""

    name = "bad-nvfp4-encode-input-dtype"

    def bug(self, x):
        return _patched([(_nvfp4, "_global_encode_scale", _nvfp4_encode_scale_in(x.dtype))])


class NVFP4EncodeScaleBf16(_QuantizeBug):
    """Holds NVFP4's per-tensor encode factor in bf16 (exact only when amax is 2688 / 2^k)."""

    name = "bad-nvfp4-encode-bf16"

    def bug(self, x):
        exact = _nvfp4._global_encode_scale
        return _patched([(_nvfp4, "_global_encode_scale",
                          lambda amax: exact(amax).to(torch.bfloat16).to(torch.float32))])


class NVFP4BlockScaleBf16(_QuantizeBug):
    """Computes NVFP4 block scales in bf16: the float32 block scale is rounded to bf16, then
    to ue4m3 (a double rounding that moves a few blocks' scale by one code)."""

    name = "bad-nvfp4-block-scale-bf16"

    def bug(self, x):
        exact = _nvfp4._encode_block_scales
        return _patched([(_nvfp4, "_encode_block_scales",
                          lambda s, rounding="rne": exact(s.to(torch.bfloat16).to(torch.float32), rounding))])


class MXScaleFloat16(_QuantizeBug):
    """Casts the MX block scale 2^e to float16: below 2^-24 it underflows to 0 and is
    replaced by 1, so such a block stores byte 127 and its elements go unscaled (codes 0)."""

    name = "bad-mx-scale-float16"

    def bug(self, x):
        exact = _mx.scale_bytes

        def scale_bytes(*args: Any, **kw: Any) -> torch.Tensor:
            b = exact(*args, **kw)
            as_fp16 = torch.exp2(b.to(torch.float64) - 127).to(torch.float16)
            return torch.where((as_fp16 == 0) & (b != 255), torch.tensor(127, dtype=b.dtype), b)
        return _patched([(_mx, "scale_bytes", scale_bytes)])


class FP8DoubleRoundBf16(_QuantizeBug):
    """An FP8 per-tensor quantizer that rounds twice: x * scale to bf16, then to FP8."""

    name = "bad-fp8-double-round"

    def bug(self, x):
        exact = _fp8.encode_bits

        def encode(v: torch.Tensor, fmt: FloatFormat, *args: Any, **kw: Any) -> torch.Tensor:
            return exact(v.to(torch.bfloat16).to(v.dtype), fmt, *args, **kw)
        return _patched([(_fp8, "encode_bits", encode)])


# ---- conventions a fit must recover, one or several per backend ---------------


def _even_at(mbits: int) -> Callable[[torch.Tensor, FloatFormat], torch.Tensor]:
    """The even scale rule rounding the amax to ``mbits`` mantissa bits whatever the element
    format (a library that keeps e2m1's constant for its 8-bit MX formats)."""
    def exponent(amax: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
        field = ((amax.view(torch.int32) + (1 << (22 - mbits))) >> 23) & 0xFF
        return field - 127 - fmt.emax
    return exponent


class EvenRuleAtE2M1Width(_SeededBug):
    """Every MX operand with the even scale rule at e2m1's 1-bit mantissa, whatever the
    recipe's rule and element format (measured in a released library's MXFP8: headlined
    "rceil" before the fit)."""

    name = "bad-even-mantissa"

    def bug(self):
        return _patched([(_rules, "SCALE_RULES", {**_RULES, "even": _even_at(1)})])

    def quantize(self, x, spec, **kw):
        return super().quantize(x, replace(spec, scale_rule="even") if spec.scaling == "mx" else spec, **kw)


class _ProfileBug(EmulatedBackend):
    """Quantizes operands of ``scaling`` as the spec's own profile with ``fields`` changed
    (conventions a fit must recover), others as the oracle."""

    scaling = ""
    fields: ClassVar[dict[str, Any]] = {}

    def quantize(self, x, spec, **kw):
        if spec.scaling != self.scaling or spec.block_2d or spec.profile is not None:
            return super().quantize(x, spec, **kw)
        if spec.scaling == "mx":
            p = Profile(self.name, **{"block_size": spec.block_size, "scale_rule": spec.scale_rule,
                                      "rounding": spec.rounding, "zero_scale": spec.zero_scale,
                                      "hadamard": spec.hadamard, **self.fields})
        elif spec.scaling == "nvfp4":
            p = NVFP4Profile(self.name, **{"rounding": spec.rounding, "hadamard": spec.hadamard, **self.fields})
        else:
            p = FP8Profile(self.name, **{"scale_formula": spec.scale_formula, **self.fields})
        return p.quantized(x, spec.fmt)


class NVFP4EpsBlockScale(_ProfileBug):
    """NVFP4 block scales stored as 0 (zero blocks, underflows) become 0.125 (a released NVFP4 library)."""

    name, scaling, fields = "bad-nvfp4-eps-scale", "nvfp4", {"underflow_block_scale": 0.125}


class NVFP4NonfiniteAmaxScaleOne(_ProfileBug):
    """A NaN or Inf NVFP4 tensor amax falls back to per-tensor scale 1 (a released NVFP4 library)."""

    name, scaling, fields = "bad-nvfp4-nonfinite-scale-1", "nvfp4", {"nonfinite_tensor_scale": 1.0}


class NVFP4Bf16Scales(_ProfileBug):
    """NVFP4 scale arithmetic in bfloat16. Not in KNOWN_BAD: the quantize check's NVFP4
    inputs put the tensor amax at 2688 * 2^k (a bf16-exact per-tensor scale), so only other
    inputs show it (tests/test_fit.py)."""

    name, scaling, fields = "bad-nvfp4-bf16-scales", "nvfp4", {"scale_dtype": "bfloat16"}


class ThreeConventions(_ProfileBug):
    """MX with the even rule, every zero code +0 and Inf blocks at byte 254: three
    conventions at once (a released QAT library's MX)."""

    name, scaling, fields = "bad-three-conventions", "mx", {"scale_rule": "even", "zero_sign": "never",
                                                            "inf_amax_byte": 254}


class _Log2InInputDtype(_ProfileBug):
    name, scaling, fields = "log2-in-input-dtype", "mx", {"exponent_source": "log2_input"}


class _FakeQuantBug:
    """A seeded fake-quant kernel (``fake_quantize`` only: values in the input's dtype), on the
    CPU, for every recipe (those it has no bug for get the oracle's values)."""

    name = ""

    def available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, recipe: Any) -> tuple[bool, str]:
        return True, ""


class Float16Log2Overflow(_FakeQuantBug):
    """A fake-quant MX kernel (values only, in the input's dtype) whose block exponent is a
    log2 in the input's dtype: a float16 log2(65504) rounds to 16, the scale is a binade
    high and 65504 dequantizes to 65536, +Inf in float16, where the oracle's is 57344 (a
    released MX library (measured, not named)). Only a float16 block amax near 65504 shows it."""

    name = "bad-fp16-log2-overflow"

    def fake_quantize(self, x: torch.Tensor, spec: Any, *, state: Any = None) -> torch.Tensor:
        quantizer = _Log2InInputDtype() if x.dtype == torch.float16 else EmulatedBackend()
        return quantizer.quantize(x, spec, state=state).dequantize().to(x.dtype)


class _MXValuesAtScale(_FakeQuantBug):
    """A fake-quant MX kernel (values only, in the input's dtype) that takes the oracle's
    power-of-two block scale 2^e, changes it with ``scale_of`` (in float32, where the result
    need not be a power of two), and returns x / s rounded to the element format
    (saturating) times s; other specs get the oracle's values."""

    def scale_of(self, pow2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def fake_quantize(self, x: torch.Tensor, spec: Any, *, state: Any = None) -> torch.Tensor:
        q = EmulatedBackend().quantize(x, spec, state=state)
        if spec.scaling != "mx" or spec.block_2d or spec.hadamard is not None or q.codes.shape != x.shape:
            return q.dequantize().to(x.dtype)
        pow2 = torch.exp2(q.scales.to(torch.float32) - 127)
        s = self.scale_of(pow2).repeat_interleave(spec.block_size, dim=-1)
        codes = encode_bits(x.float() / s, q.fmt, spec.rounding, True)
        return (decode_table(q.fmt)[codes.to(torch.int64)] * s).to(x.dtype)


class MXScaleFlooredAt1e10(_MXValuesAtScale):
    """An MX block scale floored at 1e-10 after the power-of-two rule: max(2^e, 1e-10) on the
    scale itself (brevitas floors 2^floor(log2 amax) before the division by 2^emax:
    ``mx_scale_floor_after_pow2``), not a power of two, for every block whose scale falls
    below it (e4m3: amax below 2^-25), whose small values then round to 0. No catalogue
    behaviour is this clamp: the cause is the field relation on the block scale."""

    name = "bad-mx-scale-floor-1e-10"

    def scale_of(self, pow2):
        return torch.clamp(pow2, min=torch.tensor(1e-10, dtype=torch.float32))


class MXScaleOverThreeFifths(_MXValuesAtScale):
    """An MX block scale divided by 0.6 (2^e / 0.6 in float32, 5/3 of the power of two): every
    value lies on the element grid at a scale that is not a power of two, and no catalogue
    behaviour says so (the catalogue's ``mx_scale_divided_by_0.75`` is another ratio): the
    cause is the field relation on the block scale."""

    name = "bad-mx-scale-over-0.6"

    def scale_of(self, pow2):
        return pow2 / 0.6
_SCALES_IN_THE_EPILOGUE = {"tensor", "row", "delayed"}  # FP8 scalings a wgmma leaves to the epilogue


class FastAccumulation(EmulatedBackend):
    """FP8 GEMMs accumulated as Hopper's tensor cores do with fast accumulation (no float32
    promotion; torch._scaled_mm(use_fast_accum=True), measured on an H100). Only FP8
    tensorwise and rowwise recipes: the model needs the scales in the epilogue."""

    name = "bad-fast-accumulation"

    def supports(self, recipe: Any) -> tuple[bool, str]:
        scalings = {recipe.x_row.scaling, recipe.w_row.scaling}
        if not scalings <= _SCALES_IN_THE_EPILOGUE:
            return False, (f"{self.name}: recipe {recipe.name} scales its forward operands {sorted(scalings)}; "
                           f"FP8 scalings {sorted(_SCALES_IN_THE_EPILOGUE)} only")
        return True, ""

    def gemm(self, a, b, *, out_dtype=torch.bfloat16, bias=None):
        out = HOPPER_FAST_ACCUMULATION(a, b, out_dtype=torch.float32)
        return (out if bias is None else out + bias.float()).to(out_dtype)


class InfBlockByte127(EmulatedBackend):
    """A block holding an Inf stores scale byte 127 with every code 0 (a released NVFP4 library)."""

    name = "bad-inf-block-127"

    def quantize(self, x, spec, **kw):
        q = super().quantize(x, spec, **kw)
        if spec.scaling != "mx" or spec.block_2d or q.codes.shape != x.shape:
            return q
        inf = torch.isinf(x).unflatten(-1, (-1, spec.block_size)).any(-1)
        codes = torch.where(inf.repeat_interleave(spec.block_size, dim=-1).to(q.codes.device), 0, q.codes)
        return replace(q, codes=codes.to(torch.uint8), scales=torch.where(inf.to(q.scales.device), 127, q.scales)
                       .to(torch.uint8))


class CudaNanCode(EmulatedBackend):
    """Every FP8 NaN code is 0x7F (e4m3), whatever the NaN's sign: CUDA's conversion on the
    H200 (a torchao Float8 NaN-amax failure reads differently there than on a CPU)."""

    name = "bad-cuda-nan-code"

    def quantize(self, x, spec, **kw):
        q = super().quantize(x, spec, **kw)
        fmt = getattr(q, "fmt", None)
        if fmt is None or fmt.nan_code is None or fmt.nan == "fnuz":
            return q
        nan = (q.codes & fmt.magnitude_mask) == fmt.nan_code
        return replace(q, codes=torch.where(nan, fmt.nan_code, q.codes).to(torch.uint8))


# ---- released libraries' defects (issue vocabulary): each modelled on code that shipped ----------


class BelowTieDoubleRounding(_ProfileBug):
    """MX elements rounded as microxcaling's Python path does (mx/elemwise_ops.py::
    _quantize_elemwise_core, round="nearest", @7bc4195): floor(|t| + 0.5) with the sum in
    float32, so ties go away from zero and t = nextbelow(0.5) quanta rounds up (e2m1:
    0.25 - 2^-26 becomes 0.5)."""

    name, scaling, fields = "bad-below-tie", "mx", {"rounding": "half_away", "half_away_sum": "float32"}


def _nvfp4_factor(compute: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A replacement for the oracle's S_enc = min(2688 / amax, FLT_MAX); a zero amax or a
    zero factor (an Inf amax) gives 1, as TE's guard does."""
    def s_enc(amax: torch.Tensor) -> torch.Tensor:
        s = compute(amax.to(torch.float32))
        return torch.where((amax == 0) | (s == 0), torch.ones_like(s), s)
    return s_enc


class NVFP4ReciprocalEncodeFactor(_QuantizeBug):
    """NVFP4's per-tensor encode factor as ``2688 * (1 / amax)`` (a reciprocal, then a
    product, as released NVFP4 kernels write it): one float32 ulp from 2688 / amax for some
    amax, which flips elements near a midpoint. Its decode scale is amax / 2688, as TE's."""

    name = "bad-nvfp4-reciprocal-encode"

    def bug(self, x):
        flt_max = torch.finfo(torch.float32).max
        return _patched([(_nvfp4, "_global_encode_scale", _nvfp4_factor(
            lambda a: torch.clamp(2688.0 * torch.reciprocal(a), max=flt_max)))])


class NVFP4UncappedEncodeFactor(_QuantizeBug):
    """NVFP4's encode factor 2688 / amax with no FLT_MAX cap and the decode scale stored as
    its reciprocal: below amax 7.9e-36 the factor is Inf, the decode scale 0, and every value
    0 or NaN (TE caps the factor at FLT_MAX, compute_global_encode_scaling_factor_FP4)."""

    name = "bad-nvfp4-uncapped-encode"

    def bug(self, x):
        return _patched([(_nvfp4, "_global_encode_scale", _nvfp4_factor(_true_quotient))])

    def quantize(self, x, spec, **kw):
        q = super().quantize(x, spec, **kw)
        if spec.scaling != "nvfp4":
            return q
        return replace(q, tensor_scale=torch.reciprocal(_nvfp4_factor(_true_quotient)(q.amax)))


def _true_quotient(amax: torch.Tensor) -> torch.Tensor:
    # a tensor numerator: torch evaluates 2688.0 / tensor as reciprocal(tensor) * 2688
    return torch.full_like(amax, 2688.0) / amax


class NVFP4Float16Fallback(EmulatedBackend):
    """An NVFP4 per-tensor scale held in float16: where 2688 / amax overflows it (amax under
    0.041) the library falls back to per-tensor scale 1 (encode factor and decode scale 1)."""

    name = "bad-nvfp4-fp16-fallback"

    def quantize(self, x, spec, **kw):
        if spec.scaling != "nvfp4":
            return super().quantize(x, spec, **kw)
        amax = x.abs().amax().to(torch.float32)
        if not bool(torch.tensor(2688.0) / amax > torch.finfo(torch.float16).max):
            return super().quantize(x, spec, **kw)
        with _patched([(_nvfp4, "_global_encode_scale", lambda a: torch.ones_like(a))]):
            q = super().quantize(x, spec, **kw)
        return replace(q, tensor_scale=torch.ones_like(q.tensor_scale))


class NVFP4SpecialBlockZeroed(EmulatedBackend):
    """An NVFP4 weight quantizer that writes a block holding a NaN or Inf as zeros (scale and
    codes), its per-tensor amax taken over the finite values."""

    name = "bad-nvfp4-special-zero-block"

    def quantize(self, x, spec, **kw):
        special = ~torch.isfinite(x)
        if spec.scaling != "nvfp4" or spec.block_2d or not bool(special.any()):
            return super().quantize(x, spec, **kw)
        q = super().quantize(torch.where(special, 0, x).to(x.dtype), spec, **kw)
        blocks = special.unflatten(-1, (-1, 16)).any(-1)
        return replace(q, codes=torch.where(blocks.repeat_interleave(16, dim=-1), 0, q.codes).to(torch.uint8),
                       block_scales=torch.where(blocks, 0, q.block_scales).to(torch.uint8))


class _Float16MX(EmulatedBackend):
    """MX on float16 inputs with one float16 defect (``defect``), the oracle elsewhere."""

    def defect(self, x: torch.Tensor, q: Any) -> Any:
        raise NotImplementedError

    def quantize(self, x, spec, **kw):
        q = super().quantize(x, spec, **kw)
        if x.dtype != torch.float16 or spec.scaling != "mx" or spec.block_2d or q.codes.shape != x.shape:
            return q
        return self.defect(x, q)


class MXDivideByUnderflowedPow2(_Float16MX):
    """Computes x / 2**e in float16: 2**e underflows to 0 below 2^-24, so a tiny block's
    elements are x / 0 and cast without saturation (a released MX library)."""

    name = "bad-mx-fp16-pow2-underflow"

    def defect(self, x, q):
        e = q.scales.to(torch.float32) - 127
        pow2 = torch.exp2(e).to(torch.float16).repeat_interleave(q.block_size, dim=-1)
        scaled = (x / pow2).to(torch.float32)
        codes = encode_bits(scaled, q.fmt, "rne", False)
        return replace(q, codes=torch.where(pow2 == 0, codes, q.codes))


class MXZeroBlockNaNFloat16(_Float16MX):
    """Divides a block by max(amax, 1e-30) in float16, where the floor constant is 0: an
    all-zero block is 0 / 0, a NaN block (a released MX library's float16 path)."""

    name = "bad-mx-fp16-zero-block-nan"

    def defect(self, x, q):
        floor = torch.tensor(1e-30, dtype=torch.float16)  # 0 in float16
        amax = torch.maximum(x.abs().unflatten(-1, (-1, q.block_size)).amax(-1), floor)
        nan = amax == 0
        codes = torch.where(nan.repeat_interleave(q.block_size, dim=-1), q.fmt.nan_code or 0, q.codes)
        return replace(q, codes=codes.to(torch.uint8), scales=torch.where(nan, 255, q.scales).to(torch.uint8))


class MXSubnormalAmaxFloat16(_Float16MX):
    """Reads the block exponent from the float16 amax's exponent field and treats field 0 (a
    float16 subnormal amax) as a zero block: byte 127, every code 0."""

    name = "bad-mx-fp16-subnormal-amax"

    def defect(self, x, q):
        amax = x.abs().unflatten(-1, (-1, q.block_size)).amax(-1)
        field0 = ((amax.view(torch.int16) >> 10) & 0x1F == 0) & (amax != 0)
        codes = torch.where(field0.repeat_interleave(q.block_size, dim=-1), 0, q.codes)
        return replace(q, codes=codes.to(torch.uint8), scales=torch.where(field0, 127, q.scales).to(torch.uint8))


class MXZeroBlockByte85(EmulatedBackend):
    """An all-zero MX block stores byte 85: the floor rule on an amax floored at 1e-10
    (floor(log2 1e-10) - 8 = -42 for e4m3), a zero-block byte no profile names."""

    name = "bad-zero-block-byte"

    def quantize(self, x, spec, **kw):
        q = super().quantize(x, spec, **kw)
        if spec.scaling != "mx" or spec.block_2d or q.codes.shape != x.shape:
            return q
        zero = (x.unflatten(-1, (-1, spec.block_size)) == 0).all(-1)
        return replace(q, scales=torch.where(zero, 85, q.scales).to(torch.uint8))


class FP8RowwiseZeroRowEps(EmulatedBackend):
    """torchao's float8 rowwise scale: fp8_max / clamp(amax, min=1e-12), rounded down to a
    power of two (float8_utils.py::amax_to_scale, EPS = 1e-12): an all-zero row gets
    scale_inv 2^-48 in e4m3 where TE's rule gives 1 (the oracle's fp8_quantize with eps=)."""

    name = "bad-fp8-rowwise-zero-eps"

    def quantize(self, x, spec, **kw):
        if spec.scaling != "row":
            return super().quantize(x, spec, **kw)
        return _fp8.fp8_quantize(x, spec.fmt, granularity="row", scale_formula="te", margin=spec.margin,
                                 power_of_2=spec.power_of_2, eps=1e-12)


class _MXNonPow2Scale(_FakeQuantBug):
    """A fake-quant MX kernel (values only) whose block scale is ``scale(x blocks, oracle, emax,
    dtype)``, every step in ``dtype`` (the input's where None): values are the element format's
    RNE (saturating) cast of x / scale, times scale; an element whose quotient is not finite
    (x / 0, a NaN) is NaN, as brevitas' FloatQuant makes it (round(Inf / Inf))."""

    arithmetic: torch.dtype | None = None

    def scale(self, blocks: torch.Tensor, oracle: Any, emax: int, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def fake_quantize(self, x: torch.Tensor, spec: Any, *, state: Any = None) -> torch.Tensor:
        oracle = EmulatedBackend().quantize(x, spec, state=state)
        if spec.scaling != "mx" or spec.block_2d or spec.hadamard is not None or x.shape[-1] % spec.block_size:
            return oracle.dequantize().to(x.dtype)
        fmt, dtype = get_format(spec.fmt), self.arithmetic or x.dtype
        blocks = x.to(dtype).unflatten(-1, (-1, spec.block_size))
        s = self.scale(blocks, oracle, fmt.emax, dtype)
        quotient = (blocks / s).to(torch.float32)
        values = decode(encode_bits(quotient, fmt, "rne", True), fmt).to(dtype) * s
        return torch.where(torch.isfinite(quotient), values, torch.nan).flatten(-2).to(x.dtype)


class MXScaleFloor1e10(_MXNonPow2Scale):
    """Floors the MX block scale at 1e-10 after its power-of-two restriction, in the input's
    dtype: scale = max(2^floor(log2 max(amax, 1e-10)), 1e-10) / 2^emax (brevitas 0.13.4's
    RuntimeDynamicGroupStatsScaling). A float32 block under 2^-33 gets a scale no E8M0 byte
    holds; in float16 the floor is 0 and a zero or tiny block is NaN."""

    name = "bad-mx-scale-floor"

    def scale(self, blocks, oracle, emax, dtype):
        floor = torch.tensor(1e-10, dtype=dtype)
        amax = torch.maximum(blocks.abs().amax(-1, keepdim=True), floor)
        # the exponent of the floored amax, exact (float64 log2 of a float32, bf16 or float16)
        pow2 = torch.exp2(torch.floor(torch.log2(amax.double()))).to(dtype)
        return torch.maximum(pow2, floor) / torch.tensor(2.0**emax, dtype=dtype)


class MXScaleDividedBy075(_MXNonPow2Scale):
    """Divides the OCP block scale (the E8M0 value) by 0.75 in float32 (issue 42: "a scale
    divided by 0.75"): every block on a grid 4/3 coarser than E8M0 allows."""

    name = "bad-mx-scale-div-0.75"
    arithmetic = torch.float32

    def scale(self, blocks, oracle, emax, dtype):
        return (_mx.e8m0_value(oracle.scales).to(torch.float32) / 0.75).unsqueeze(-1)


class FP8DivideByAmaxOverMax(_FakeQuantBug):
    """A fake-quant FP8 tensorwise kernel (values only) that divides x by amax / fp8_max and
    multiplies back, in the input's dtype, amax floored at 1e-10 there (brevitas 0.13.4's
    Fp8e4m3OCPWeightPerTensorFloat): not x * (fp8_max / amax) in float32 as the oracle."""

    name = "bad-fp8-divide-amax-over-max"

    def fake_quantize(self, x: torch.Tensor, spec: Any, *, state: Any = None) -> torch.Tensor:
        if spec.scaling != "tensor":
            return EmulatedBackend().quantize(x, spec, state=state).dequantize().to(x.dtype)
        fmt = get_format(spec.fmt)
        amax = torch.clamp_min(x.abs().amax(), torch.tensor(1e-10, dtype=x.dtype))
        scale = amax / torch.tensor(fmt.max, dtype=x.dtype)
        quotient = (x / scale).to(torch.float32)  # x / 0 or a NaN: NaN, as brevitas' FloatQuant
        values = decode(encode_bits(quotient, fmt, "rne", True), fmt).to(x.dtype) * scale
        return torch.where(torch.isfinite(quotient), values, torch.nan).to(x.dtype)


class MXOverflowScaleByte127(EmulatedBackend):
    """An MX block whose scale 2^e is Inf in the input's dtype stores byte 127 with every code 0
    (compressed-tensors 0.20: the scale rounded up in x's dtype, x / Inf, a wrapped int32 byte)."""

    name = "bad-mx-overflow-byte-127"

    def quantize(self, x, spec, **kw):
        q = super().quantize(x, spec, **kw)
        if spec.scaling != "mx" or spec.block_2d or q.codes.shape != x.shape:
            return q
        power = torch.exp2(q.scales.to(torch.float64) - 127 + q.fmt.emax).to(x.dtype)  # 2^(e + emax) in x's dtype
        inf = torch.isinf(power) & (q.scales != 255)
        codes = torch.where(inf.repeat_interleave(spec.block_size, dim=-1), 0, q.codes)
        return replace(q, codes=codes.to(torch.uint8), scales=torch.where(inf, 127, q.scales).to(torch.uint8))


KNOWN_BAD: dict[str, type[Any]] = {c.name: c for c in (NibbleSwap, WrongScaleRule, StaleWeight, Bf16Fallback,
                                                        NanToZero, DropsBias, GarbageUnlessKMod256,
                                                        HalfAwayForRne, TruncForRne, Float32Log2Scale, Float16Log2Overflow,
                                                        NVFP4ScaleThreshold, NVFP4EncodeScaleInInputDtype,
                                                        NVFP4EncodeScaleBf16, NVFP4BlockScaleBf16, MXScaleFloat16,
                                                        FP8DoubleRoundBf16,
                                                        EvenRuleAtE2M1Width, NVFP4EpsBlockScale,
                                                        NVFP4NonfiniteAmaxScaleOne, ThreeConventions,
                                                        InfBlockByte127, CudaNanCode, FastAccumulation,
                                                        BelowTieDoubleRounding, NVFP4ReciprocalEncodeFactor,
                                                        NVFP4UncappedEncodeFactor, NVFP4Float16Fallback,
                                                        NVFP4SpecialBlockZeroed, MXDivideByUnderflowedPow2,
                                                        MXZeroBlockNaNFloat16, MXSubnormalAmaxFloat16,
                                                        MXZeroBlockByte85, FP8RowwiseZeroRowEps,
                                                        MXScaleFlooredAt1e10, MXScaleOverThreeFifths,
                                                        MXScaleFloor1e10, MXScaleDividedBy075,
                                                        FP8DivideByAmaxOverMax, MXOverflowScaleByte127)}


# ---- a fake-quant seeded bug modelled on AMD Quark's MX floor mode (values only) ----


class _MXFloatScaleCodes(_ProfileBug):
    name, scaling, fields = "mx-float-scale", "mx", {"scale_storage": "input_dtype"}


class MXFloatScaleFakeQuant(_FakeQuantBug):
    """A fake-quant MX kernel (values only, in the input's dtype) that holds the block scale 2^e
    as a float in the input's dtype instead of an E8M0 byte: a float32 block below 2^-127 keeps
    its finer scale, and a bf16 or float16 block whose 2^e underflows the dtype is divided by
    float32 eps (its values 0) (AMD Quark 0.12-0.13, floor mode)."""

    name = "bad-mx-float-scale"

    def fake_quantize(self, x: torch.Tensor, spec: Any, *, state: Any = None) -> torch.Tensor:
        return _MXFloatScaleCodes().quantize(x, spec, state=state).dequantize().to(x.dtype)


KNOWN_BAD[MXFloatScaleFakeQuant.name] = MXFloatScaleFakeQuant
