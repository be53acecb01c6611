"""The AITER and Primus-Turbo adapters against FAKE vendor modules (no AMD GPU involved).

The AITER fake is :mod:`tests.fakes.fake_aiter` (released v0.1.20.post1 / legacy v0.1.8 /
branch mxfp6-gemms-clean, each as strict as the vendor: wrapped signatures, bf16-only ASM
output, 256-wide K tiles that read uninitialised scale padding). The Primus-Turbo fake
below models AMD-AGI/Primus-Turbo main a6a16cdc (and v0.3.0-v0.4.0): bf16/fp16-only MX
quantizers (``csrc/pytorch/quantization/quantization.cpp``: "Input must be BFloat16 or
Half"), no MXFP6 unless asked for (``gemm_fp6_impl.py`` @ 0307ccde, ``mxfp6_pack.py`` @
0c98a604, index-only), ``gemm_fp6_impl`` refusing M % 256, N % 256, K % 128.
Fake GEMMs decode their operands the way the vendor defines them (AITER ``mxfp4_to_f32``:
low nibble first; ``e8m0_to_f32``: 2**(byte - 127), 0xFF NaN) and multiply in float64.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from enum import Enum
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
import torch

import mxcheck.backends
from mxcheck import layouts
from mxcheck.backends import Refusal
from mxcheck.backends.aiter import AiterBackend
from mxcheck.backends.primus_turbo import PrimusTurboBackend
from mxcheck.formats import decode
from mxcheck.recipes import RECIPES, OperandSpec
from mxcheck.scaling.fp8 import fp8_quantize
from mxcheck.scaling.mx import MXTensor, mx_quantize
from tests.fakes import fake_aiter as fa

pytestmark = pytest.mark.emulated

E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
_c = torch.arange(64)
_mag = torch.where((_c >> 3) & 3 == 0, (_c & 7) / 8, 2.0 ** (((_c >> 3) & 3) - 1) * (1 + (_c & 7) / 8))
E2M3 = torch.where((_c >> 5) & 1 == 1, -_mag, _mag).double()
MXFP4, MXFP6, FP8 = RECIPES["mxfp4"], RECIPES["mxfp6"], RECIPES["fp8"]


def _dec(codes: torch.Tensor, table: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return table[codes.long()] * (2.0 ** (scales.view(torch.uint8).double() - 127)).repeat_interleave(32, -1)


def dec_fp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    b = packed.view(torch.uint8).long()
    return _dec(torch.stack([b & 0xF, b >> 4], -1).flatten(-2), E2M1, scales)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:  # aiter fp4_utils.pack_uint4
    return (codes[..., ::2] | (codes[..., 1::2] << 4)).view(torch.float4_e2m1fn_x2)


def oracle(x: torch.Tensor, spec: OperandSpec) -> MXTensor:
    return mx_quantize(x, spec.fmt, scale_rule=spec.scale_rule, rounding=spec.rounding, block_2d=spec.block_2d,
                       hadamard=spec.hadamard, zero_scale=spec.zero_scale, pad_to=spec.pad_to)


def product(a: MXTensor, b: MXTensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return (a.dequantize(padded=True).double() @ b.dequantize(padded=True).double().T).to(dtype)


def same(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.shape == y.shape and torch.equal(x.view(torch.int16), y.view(torch.int16))


class StraightThrough(torch.autograd.Function):
    """Forward: a given product; backward: the plain a @ b^T gradients."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return out.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        a, b = ctx.saved_tensors
        return g.to(a.dtype) @ b, g.t().to(a.dtype) @ a, None


class Calls(list):
    def add(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.append((name, args, kwargs))

    def named(self, name: str) -> list[tuple[str, tuple, dict]]:
        return [c for c in self if c[0] == name]


install = fa.module_tree  # the primus_turbo fakes below are built on the same module tree


@pytest.fixture
def fake_aiter(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Released AITER (v0.1.20.post1); gemm_a4w4 calls recorded as the caller made them."""
    calls = Calls()
    aiter = fa.install(monkeypatch).aiter
    real = aiter.gemm_a4w4

    def gemm_a4w4(*args, **kwargs):  # as opaque as torch_compile_guard's wrapper_custom
        calls.add("gemm_a4w4", *args, **kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(aiter, "gemm_a4w4", gemm_a4w4)
    return calls


@pytest.fixture
def fake_aiter_mxfp6(monkeypatch: pytest.MonkeyPatch) -> Any:
    """AITER branch mxfp6-gemms-clean (878d1dea): gemm_a6w6 and quant_mxfp6_gemm present."""
    return fa.install(monkeypatch, version="0.1.20.post1", mxfp6=True).aiter


def _mxfp6(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = oracle(x, MXFP6.x_row)
    return q.codes, q.scales


def _gemm_flags(trans_a: bool, trans_b: bool, trans_c: bool = False) -> None:
    if trans_a or not trans_b or trans_c:
        raise NotImplementedError(f"fake implements NT only, got {trans_a=} {trans_b=} {trans_c=}")


def _bf16_or_half(x: torch.Tensor) -> None:  # quantization.cpp @ a6a16cdc, every MX quantizer
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise RuntimeError("Input must be BFloat16 or Half")


@pytest.fixture
def fake_primus(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Primus-Turbo main a6a16cdc / v0.4.0: no MXFP6 (see fake_primus_mxfp6)."""
    return _fake_primus(monkeypatch, mxfp6=False)


@pytest.fixture
def fake_primus_mxfp6(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """The index-only MXFP6 files (gemm_fp6_impl.py @ 0307ccde, mxfp6_pack.py @ 0c98a604)."""
    return _fake_primus(monkeypatch, mxfp6=True)


def _fake_primus(monkeypatch: pytest.MonkeyPatch, *, mxfp6: bool) -> Calls:
    calls = Calls()
    p = "primus_turbo.pytorch."
    fp6 = ("ops.gemm_fp6", "kernels.gemm.gemm_fp6_impl", "kernels.quantization.mxfp6_pack") if mxfp6 else ()
    m = install(monkeypatch, "primus_turbo", "primus_turbo.pytorch", *(p + s for s in (
        "core", "core.low_precision", "core.backend", "ops", "ops.quantization", "ops.gemm_fp4",
        "ops.gemm_fp8", "kernels", "kernels.gemm", "kernels.gemm.gemm_fp4_impl",
        "kernels.gemm.gemm_fp8_impl", "kernels.quantization", *fp6)))
    for absent in {"ops.gemm_fp6", "kernels.gemm.gemm_fp6_impl", "kernels.quantization.mxfp6_pack"} - set(fp6):
        monkeypatch.setitem(sys.modules, p + absent, None)  # ModuleNotFoundError, as a release
    Format = Enum("Format", "E4M3 E5M2 E2M1_X2 E2M3 HYBRID")
    Granularity = Enum("ScalingGranularity", "TENSORWISE ROWWISE BLOCKWISE MX_BLOCKWISE")

    class ScalingRecipe(NamedTuple):
        use_2d_block: bool = False
        use_sr: bool = False
        use_rht: bool = False

    @dataclass
    class Float4QuantConfig:
        use_gradient_sr: bool = False
        use_preshuffle: bool = False

    @dataclass
    class Float8QuantConfig:
        format: Any = Format.E4M3
        granularity: Any = Granularity.TENSORWISE

    lp = m[p + "core.low_precision"]
    lp.Format, lp.ScalingGranularity, lp.ScalingRecipe = Format, Granularity, ScalingRecipe
    lp.Float4QuantConfig, lp.Float8QuantConfig = Float4QuantConfig, Float8QuantConfig
    if mxfp6:
        lp.Float6QuantConfig = SimpleNamespace
    m[p + "core.backend"].BackendType = Enum("BackendType", "AITER HIPBLASLT TURBO")

    def fp4(x, recipe, axis):  # rows of the NT operand: x (axis 1) or x^T (axis 0); K padded to 128
        q = mx_quantize(x if axis == 1 else x.t(), "e2m1", scale_rule="even", block_2d=recipe.use_2d_block,
                        hadamard="h16x2" if recipe.use_rht else None, pad_to=128)
        return pack_nibbles(q.codes), q.scales.view(torch.float8_e8m0fnu)

    def quantize_fp4(x, out_dtype, granularity, *, block_size=None, axis=None, scaling_recipe=None):
        calls.add("quantize_fp4", x, out_dtype, granularity, block_size=block_size, axis=axis, recipe=scaling_recipe)
        _bf16_or_half(x)
        return fp4(x, scaling_recipe, axis)

    def quantize_fp4_with_trans(x, out_dtype, granularity, *, block_size=None, axis=None, scaling_recipe=None,
                                scaling_recipe_for_trans=None):
        calls.add("quantize_fp4_with_trans", x, recipe=scaling_recipe, recipe_t=scaling_recipe_for_trans)
        _bf16_or_half(x)
        return (*fp4(x, scaling_recipe, 1), *fp4(x, scaling_recipe_for_trans, 0))

    def quantize_fp8(x, out_dtype, granularity, **kw):
        calls.add("quantize_fp8", x, out_dtype, granularity)
        f = fp8_quantize(x, {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}[out_dtype],
                         granularity="tensor", scale_formula="primus_turbo")
        return f.codes.view(out_dtype), f.scale_inv

    def gemm_fp4_impl(a, a_s, trans_a, b, b_s, trans_b, out_dtype, trans_c, granularity, default_backend,
                      preshuffled=False):
        calls.add("gemm_fp4_impl", a, a_s, trans_a, b, b_s, trans_b, out_dtype, trans_c, granularity=granularity,
                  default_backend=default_backend)
        _gemm_flags(trans_a, trans_b, trans_c)
        return (dec_fp4(a, a_s) @ dec_fp4(b, b_s).T).to(out_dtype)

    def gemm_fp6_impl(a, a_s, b, b_s, m_, n, k, out_dtype, granularity, bias=None):
        calls.add("gemm_fp6_impl", a, a_s, b, b_s, m_, n, k, out_dtype, granularity)
        if m_ % 256 or n % 256 or k % 128:  # can_handle: no backend for this shape
            raise ValueError("gemm_fp6_impl: no backend can handle this problem")
        (ac, asc), (bc, bsc) = layouts.unpack_mxfp6_blob(a, a_s, m_, k), layouts.unpack_mxfp6_blob(b, b_s, n, k)
        return (_dec(ac, E2M3, asc) @ _dec(bc, E2M3, bsc).T).to(out_dtype)

    def gemm_fp8_impl(a, a_s, trans_a, b, b_s, trans_b, out_dtype, trans_c, granularity, default_backend):
        calls.add("gemm_fp8_impl", a, a_s, trans_a, b, b_s, trans_b, out_dtype, trans_c, granularity, default_backend)
        _gemm_flags(trans_a, trans_b, trans_c)
        return ((a.double() * a_s.double()) @ (b.double() * b_s.double()).T).to(out_dtype)

    def linear_fn(name, quant):  # forward = the oracle's product; gradient straight through
        def gemm(a, b, trans_a=False, trans_b=False, out_dtype=None, config=None):
            calls.add(name, a, b, trans_a=trans_a, trans_b=trans_b, out_dtype=out_dtype, config=config)
            _gemm_flags(trans_a, trans_b)
            if name != "gemm_fp8":
                _bf16_or_half(a)
                _bf16_or_half(b)
            qa, qb = quant(a, config, "x_row"), quant(b, config, "w_row")
            return StraightThrough.apply(a, b, (qa.double() @ qb.double().T).to(out_dtype))
        return gemm

    m[p + "ops.quantization"].quantize_fp4 = quantize_fp4
    m[p + "ops.quantization"].quantize_fp4_with_trans = quantize_fp4_with_trans
    m[p + "ops.quantization"].quantize_fp8 = quantize_fp8
    def mxfp6_pack(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"quantize_mxfp6 expects bf16/fp16 input, got {x.dtype}")
        return layouts.pack_mxfp6_blob(*_mxfp6(x))

    m[p + "kernels.gemm.gemm_fp4_impl"].gemm_fp4_impl = gemm_fp4_impl
    m[p + "kernels.gemm.gemm_fp8_impl"].gemm_fp8_impl = gemm_fp8_impl
    m[p + "ops.gemm_fp4"].gemm_fp4 = linear_fn("gemm_fp4", lambda t, c, op: oracle(t.detach(), MXFP4.spec(op)).dequantize())
    if mxfp6:
        m[p + "kernels.quantization.mxfp6_pack"].quantize_mxfp6_row = lambda x: (
            calls.add("quantize_mxfp6_row", x), mxfp6_pack(x))[1]
        m[p + "kernels.quantization.mxfp6_pack"].quantize_mxfp6_dual = lambda x: (
            calls.add("quantize_mxfp6_dual", x), (*mxfp6_pack(x), *mxfp6_pack(x.t())))[1]
        m[p + "kernels.gemm.gemm_fp6_impl"].gemm_fp6_impl = gemm_fp6_impl
        m[p + "ops.gemm_fp6"].gemm_fp6 = linear_fn(
            "gemm_fp6", lambda t, c, op: oracle(t.detach(), MXFP6.spec(op)).dequantize())
    m[p + "ops.gemm_fp8"].gemm_fp8 = linear_fn("gemm_fp8", lambda t, c, op: fp8_quantize(
        t.detach(), "e4m3", scale_formula="primus_turbo").dequantize())
    return calls


BACKENDS = [pytest.param(AiterBackend, "aiter", "fake_aiter", id="aiter"),
            pytest.param(PrimusTurboBackend, "primus_turbo", "fake_primus", id="primus_turbo")]


# ---------------------------------------------------------------------------------------
# availability, lazy imports, supports


@pytest.mark.parametrize(("cls", "module", "fake"), BACKENDS)
def test_unavailable_names_the_missing_module(cls, module, fake, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    monkeypatch.setenv("MXCHECK_FAKE_HARDWARE", "gfx950")
    ok, why = cls().available()
    assert not ok and f"{module} not importable" in why and "gfx950" not in why


@pytest.mark.parametrize(("cls", "module", "fake"), BACKENDS)
def test_unavailable_off_gfx950_even_with_the_module(cls, module, fake, monkeypatch, request):
    request.getfixturevalue(fake)
    monkeypatch.setenv("MXCHECK_FAKE_HARDWARE", "sm90")
    ok, why = cls().available()
    assert not ok and "needs an AMD MI355X (gfx950)" in why and "sm90" in why and "importable" not in why


@pytest.mark.parametrize(("cls", "module", "fake"), BACKENDS)
def test_available_with_the_module_on_gfx950(cls, module, fake, monkeypatch, request):
    request.getfixturevalue(fake)
    monkeypatch.setenv("MXCHECK_FAKE_HARDWARE", "gfx950")
    assert cls().available() == (True, "")


def test_registry_and_adapter_modules_import_no_vendor_package(monkeypatch):
    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("aiter", "primus_turbo"):
                raise AssertionError(f"vendor package {name} imported while loading the adapter")

    for name in ("aiter", "primus_turbo", "mxcheck.backends.aiter", "mxcheck.backends.primus_turbo"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "meta_path", [Refuse(), *sys.meta_path])
    for name in ("aiter", "primus_turbo"):
        backend = mxcheck.backends.get(name)
        assert backend.name == name and backend.supports("mxfp4") == (True, "")


@pytest.mark.parametrize(("cls", "recipe", "why"), [
    (AiterBackend, "mxfp4", ""), (AiterBackend, "mxfp6", "aiter not importable"),
    (AiterBackend, "fp8", "x_row is e4m3 scaling='tensor'"), (AiterBackend, "mxfp4-fp8bwd", "g_row is e5m2"),
    (AiterBackend, "mxfp8", "x_row is e4m3 scaling='mx'"), (AiterBackend, "nvfp4", "scaling='nvfp4'"),
    (PrimusTurboBackend, "mxfp4", ""), (PrimusTurboBackend, "fp8", ""),
    (PrimusTurboBackend, "mxfp6", "has no primus_turbo.pytorch.ops.gemm_fp6.gemm_fp6"),
    (PrimusTurboBackend, "fp8-hybrid", ""), (PrimusTurboBackend, "mxfp4+sr", ""),
    (PrimusTurboBackend, "mxfp4-fp8bwd", "'g_row': 'fp8'"), (PrimusTurboBackend, "fp8-delayed", "'x_row': None"),
    (PrimusTurboBackend, "nvfp4", "'x_row': None"),
], ids=str)
def test_supports_answers_with_a_reason(cls, recipe, why, monkeypatch):
    for module in ("aiter", "primus_turbo"):  # not installed (an installed aiter would JIT-build)
        monkeypatch.setitem(sys.modules, module, None)
    r = MXFP4.with_gradient_sr() if recipe == "mxfp4+sr" else recipe
    ok, reason = cls().supports(r)
    assert ok == (why == "") and why in reason


# ---------------------------------------------------------------------------------------
# AITER


def test_aiter_quantize_is_the_oracle_through_unshuffled_dynamic_mxfp4_quant(fake_aiter, gen, monkeypatch):
    x = torch.randn(48, 192, generator=gen).bfloat16()
    fp4 = sys.modules["aiter.utility.fp4_utils"]
    real, seen = fp4.dynamic_mxfp4_quant, []
    monkeypatch.setattr(fp4, "dynamic_mxfp4_quant", lambda x, **kw: (seen.append((x.shape, kw)), real(x, **kw))[1])
    q, want = AiterBackend().quantize(x, MXFP4.x_row), oracle(x, MXFP4.x_row)
    assert torch.equal(q.codes, want.codes) and torch.equal(q.scales, want.scales) and q.codes.shape == (48, 256)
    assert torch.equal(q.dequantize(), want.dequantize())
    assert seen == [((48, 192), {"shuffle": False})]


@pytest.mark.parametrize(("op", "field"), [("w_row", "block_2d"), ("x_col", "hadamard")])
def test_aiter_quantize_refuses_what_its_quantizer_lacks(fake_aiter, op, field):
    with pytest.raises(ValueError, match=field):
        AiterBackend().quantize(torch.zeros(32, 64), MXFP4.spec(op))


E2M1_EVEN = OperandSpec("e2m1", "mx", scale_rule="even")
AITER_VERSIONS = ["0.1.7.post2.dev18", fa.LEGACY, fa.RELEASED]


# K = 64 is Flux's img_in; 96 and 384 are K % 256 != 0 that the old K % 64 guard let through
# to a kernel reading whole 256-wide K tiles (uninitialised scale padding, the next row's bytes).
@pytest.mark.parametrize("k", [64, 96, 384, 512])
@pytest.mark.parametrize("version", AITER_VERSIONS)
def test_aiter_a4w4_pads_k_to_the_kernel_tile_and_equals_the_product(monkeypatch, gen, version, k):
    fa.install(monkeypatch, version=version)
    m, n = 48, 32  # M not a multiple of 32: AITER's padded output rows must be cropped
    a, b = oracle(torch.randn(m, k, generator=gen), E2M1_EVEN), oracle(torch.randn(n, k, generator=gen), E2M1_EVEN)
    bias = torch.randn(n, generator=gen).bfloat16()
    got = AiterBackend().gemm(a, b, bias=bias)
    assert same(got, product(a, b) + bias)


def test_aiter_a4w4_hands_aiter_its_layouts_padded_to_256_in_k(fake_aiter, gen):
    m, n, k = 48, 32, 192
    a, b = oracle(torch.randn(m, k, generator=gen), E2M1_EVEN), oracle(torch.randn(n, k, generator=gen), E2M1_EVEN)
    AiterBackend().gemm(a, b)
    (_, g, kw), = fake_aiter.named("gemm_a4w4")
    assert [tuple(t.shape) for t in g] == [(m, 128), (n, 128), (256, 8), (256, 8)]  # K 192 -> 256
    assert (g[0].dtype, g[2].dtype) == (torch.float4_e2m1fn_x2, torch.float8_e8m0fnu)
    assert kw == {"dtype": torch.bfloat16, "bpreshuffle": True}
    # every scale byte past the data is 0 (a 0-code block times 2^-127), none left to torch.empty
    sa = layouts.unshuffle_scale(g[2].view(torch.uint8), 256, 8)
    assert torch.equal(sa[:m, :6], a.scales) and not sa[:m, 6:].any() and not sa[m:].any()
    assert torch.equal(layouts.unshuffle_weight(g[1].view(torch.uint8)), pack_nibbles(
        torch.nn.functional.pad(b.codes, (0, 64))).view(torch.uint8))


def test_aiter_fake_reads_uninitialised_scale_padding_as_the_kernel_does(fake_aiter, gen):
    # The premise of the padding fix: AITER's own e8m0_shuffle with K % 256 != 0 gives
    # silently wrong finite results (AITER #2900), so the fake is not kinder than the vendor.
    m, n, k = 32, 32, 64
    a, b = oracle(torch.randn(m, k, generator=gen), E2M1_EVEN), oracle(torch.randn(n, k, generator=gen), E2M1_EVEN)
    e8m0 = torch.float8_e8m0fnu
    got = sys.modules["aiter"].gemm_a4w4(  # the call as the old adapter made it: K = 64 unpadded
        pack_nibbles(a.codes), fa.shuffle_weight(pack_nibbles(b.codes)), fa.e8m0_shuffle(a.scales.view(e8m0)),
        fa.e8m0_shuffle(b.scales.view(e8m0)), dtype=torch.bfloat16, bpreshuffle=True)
    assert torch.isfinite(got.float()).all() and not same(got, product(a, b))


def test_aiter_a4w4_refuses_fp16_output_as_the_asm_kernel_does(fake_aiter, gen):
    a = oracle(torch.randn(32, 256, generator=gen), E2M1_EVEN)
    with pytest.raises(ValueError, match=r"out_dtype=torch.float16.*BFloat16"):
        AiterBackend().gemm(a, a, out_dtype=torch.float16)
    assert AiterBackend.gemm_out_dtypes == (torch.bfloat16,)


def test_aiter_gemm_a4w4_signature_hides_out_as_torch_compile_guard_does(fake_aiter):
    import inspect

    params = inspect.signature(sys.modules["aiter"].gemm_a4w4).parameters
    assert [p.kind for p in params.values()] == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]


@pytest.mark.parametrize(("m", "n", "k", "bad"), [(48, 24, 128, "N=24"), (40, 32, 128, "M=40")])
def test_aiter_a4w4_names_the_dim_that_does_not_tile(fake_aiter, m, n, k, bad):
    a, b = oracle(torch.ones(m, k), E2M1_EVEN), oracle(torch.ones(n, k), E2M1_EVEN)
    with pytest.raises(ValueError, match=bad):
        AiterBackend().gemm(a, b)


def test_aiter_mxfp6_is_not_offered_by_a_release(fake_aiter):
    ok, why = AiterBackend().supports("mxfp6")
    assert not ok and "0.1.20.post1" in why and "gemm_a6w6" in why
    with pytest.raises(Refusal, match="gemm_a6w6"):
        AiterBackend().gemm(oracle(torch.ones(32, 64), MXFP6.x_row), oracle(torch.ones(32, 64), MXFP6.w_row))


def test_aiter_a6w6_quantizes_and_multiplies_blobs_in_aiter_argument_order(fake_aiter_mxfp6, gen, monkeypatch):
    assert AiterBackend().supports("mxfp6") == (True, "")
    m, n, k = 40, 24, 96
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)  # float32: ties away
    be, seen = AiterBackend(), []
    real = fake_aiter_mxfp6.gemm_a6w6
    monkeypatch.setattr(fake_aiter_mxfp6, "gemm_a6w6", lambda *a: (seen.append(a), real(*a))[1])
    a, b = be.quantize(x, MXFP6.x_row), be.quantize(w, MXFP6.w_row)
    assert torch.equal(a.codes, oracle(x, MXFP6.x_row).codes) and a.hadamard is not None
    assert torch.equal(b.scales, oracle(w, MXFP6.w_row).scales)
    assert same(be.gemm(a, b), product(oracle(x, MXFP6.x_row), oracle(w, MXFP6.w_row)))
    (args,) = seen
    assert args[4:] == (m, n, k) and [t.numel() for t in args[:4]] == [3 * 24576, 3 * 24576, 3072, 3072]


def test_aiter_mxfp6_rounding_follows_the_packer_the_input_dtype_picks(fake_aiter_mxfp6, gen):
    x = torch.randn(32, 64, generator=gen).bfloat16()  # bf16 on gfx950: the HIP packer, ties to even
    with pytest.raises(ValueError, match=r"rounding='rne'.*'half_away'"):
        AiterBackend().quantize(x, MXFP6.x_row)
    spec = dataclasses.replace(MXFP6.x_row, rounding="rne")
    assert torch.equal(AiterBackend().quantize(x, spec).codes, oracle(x, spec).codes)


def test_aiter_gemm_refuses_mixed_formats_and_rotations(fake_aiter, gen):
    x = torch.randn(32, 64, generator=gen)
    with pytest.raises(ValueError, match="a is e2m1 and b is e2m3"):
        AiterBackend().gemm(oracle(x, MXFP4.x_row), oracle(x, MXFP6.x_row))
    with pytest.raises(ValueError, match="different rotations"):
        AiterBackend().gemm(oracle(x, MXFP4.x_row), oracle(x, MXFP4.x_col))


# ---------------------------------------------------------------------------------------
# Primus-Turbo


def test_primus_quantize_and_dual_give_the_oracle_row_and_col_copies(fake_primus, gen):
    x = torch.randn(64, 96, generator=gen).bfloat16()
    be = PrimusTurboBackend()
    q = be.quantize(x, MXFP4.w_row)
    assert torch.equal(q.codes, oracle(x, MXFP4.w_row).codes) and q.block_2d
    row, col = be.quantize_dual(x, MXFP4.x_row, MXFP4.x_col)  # x_col: x^T [K, M], H16 x 2 along M
    want_col = oracle(x.t(), MXFP4.x_col)
    assert torch.equal(row.codes, oracle(x, MXFP4.x_row).codes) and col.shape == (96, 64)
    assert torch.equal(col.codes, want_col.codes) and torch.equal(col.scales, want_col.scales)
    (_, _, kw), = fake_primus.named("quantize_fp4_with_trans")
    assert (kw["recipe"].use_rht, kw["recipe_t"].use_rht, kw["recipe_t"].use_2d_block) == (False, True, False)
    (_, args, kw), = fake_primus.named("quantize_fp4")
    assert args[1] == torch.float4_e2m1fn_x2 and kw["axis"] == 1 and kw["recipe"].use_2d_block


def test_primus_fp4_gemm_calls_gemm_fp4_impl_nt_with_unshuffled_operands(fake_primus, gen):
    a = oracle(torch.randn(32, 160, generator=gen), MXFP4.x_row)
    b = oracle(torch.randn(64, 160, generator=gen), MXFP4.w_row)  # 2D blocks: N % 32
    assert same(PrimusTurboBackend().gemm(a, b), product(a, b))
    (_, args, kw), = fake_primus.named("gemm_fp4_impl")
    assert (args[2], args[5], args[7], args[6]) == (False, True, False, torch.bfloat16)
    assert (args[0].dtype, args[1].dtype, args[1].shape) == (torch.float4_e2m1fn_x2, torch.float8_e8m0fnu, (32, 8))
    assert kw["granularity"] == 4 and kw["default_backend"] == 2  # MX_BLOCKWISE, HIPBLASLT


def test_primus_fp6_quantize_dual_and_gemm_fp6_impl_argument_order(fake_primus_mxfp6, gen):
    assert PrimusTurboBackend().supports("mxfp6") == (True, "")
    x, w = torch.randn(256, 128, generator=gen).bfloat16(), torch.randn(256, 128, generator=gen).bfloat16()
    be = PrimusTurboBackend()
    (a, a_t), b = be.quantize_dual(x, MXFP6.x_row, MXFP6.x_col), be.quantize(w, MXFP6.w_row)
    assert torch.equal(a_t.codes, oracle(x.t(), MXFP6.x_col).codes)
    assert same(be.gemm(a, b), product(oracle(x, MXFP6.x_row), oracle(w, MXFP6.w_row)))
    (_, args, _), = fake_primus_mxfp6.named("gemm_fp6_impl")
    assert args[4:] == (256, 256, 128, torch.bfloat16, 4) and args[1].numel() == 3 * 1024  # a, a_scale, b, b_scale


@pytest.mark.parametrize(("m", "n", "k", "bad"), [(64, 256, 128, "M=64"), (256, 32, 128, "N=32"),
                                                  (256, 256, 96, "K=96")])
def test_primus_gemm_fp6_names_the_dim_gemm_fp6_impl_cannot_handle(fake_primus_mxfp6, m, n, k, bad):
    a, b = oracle(torch.ones(m, k), MXFP6.x_row), oracle(torch.ones(n, k), MXFP6.w_row)
    with pytest.raises(ValueError, match=rf"{bad} \(needs a multiple of"):
        PrimusTurboBackend().gemm(a, b)


def test_primus_mxfp6_is_not_offered_by_a_release(fake_primus):
    ok, why = PrimusTurboBackend().supports("mxfp6")
    assert not ok and "ops.gemm_fp6.gemm_fp6" in why and "Float6QuantConfig" in why
    with pytest.raises(Refusal, match="gemm_fp6"):
        PrimusTurboBackend().linear(torch.ones(256, 256), torch.ones(256, 256), None, "mxfp6")


@pytest.mark.parametrize("dual", [False, True], ids=["quantize", "quantize_dual"])
def test_primus_mx_quantize_refuses_float32_naming_the_dtype(fake_primus, dual):
    x = torch.ones(32, 128)
    with pytest.raises(Refusal, match=r"x.dtype=torch.float32.*bfloat16 or float16"):
        if dual:
            PrimusTurboBackend().quantize_dual(x, MXFP4.x_row, MXFP4.x_col)
        else:
            PrimusTurboBackend().quantize(x, MXFP4.x_row)


def test_primus_fp8_tensorwise_quantize_and_gemm(fake_primus, gen):
    x, w = torch.randn(32, 64, generator=gen), torch.randn(16, 64, generator=gen)
    be = PrimusTurboBackend()
    a, b = be.quantize(x, FP8.x_row), be.quantize(w, FP8.w_row)
    fa, fb = fp8_quantize(x, "e4m3", scale_formula="primus_turbo"), fp8_quantize(w, "e4m3", scale_formula="primus_turbo")
    assert torch.equal(a.codes, fa.codes) and torch.equal(a.scale_inv, fa.scale_inv)
    # Exact products in float64 (FP8Tensor.dequantize rounds code * scale_inv to float32,
    # which flipped one bf16 output under --mxcheck-seed 592686444 on the H200 seed sweep).
    fa64, fb64 = (decode(q.codes, "e4m3").double() * q.scale_inv.double() for q in (fa, fb))
    assert same(be.gemm(a, b), (fa64 @ fb64.T).to(torch.bfloat16))
    (_, args, _), = fake_primus.named("gemm_fp8_impl")
    assert args[0].dtype == torch.float8_e4m3fn and (args[2], args[5], args[7]) == (False, True, False)
    assert args[8:] == (1, 2)  # TENSORWISE, HIPBLASLT


def test_primus_linear_runs_gemm_fp4_nt_on_flattened_tokens_and_adds_bias(fake_primus, gen):
    x = torch.randn(2, 16, 128, generator=gen, requires_grad=True)
    w, bias = torch.randn(64, 128, generator=gen), torch.randn(64, generator=gen)
    out = PrimusTurboBackend().linear(x, w, bias, "mxfp4")  # float32 in: Primus-Turbo gets bf16
    want = product(oracle(x.detach().reshape(32, 128).bfloat16(), MXFP4.x_row), oracle(w.bfloat16(), MXFP4.w_row))
    assert out.shape == (2, 16, 64) and same(out.reshape(32, 64), want + bias.bfloat16())
    (_, args, kw), = fake_primus.named("gemm_fp4")
    assert args[0].shape == (32, 128) and (kw["trans_a"], kw["trans_b"]) == (False, True)
    assert kw["config"].use_gradient_sr is False and kw["out_dtype"] == torch.bfloat16
    out.float().sum().backward()
    assert x.grad is not None and bool(x.grad.abs().sum() > 0)


def test_primus_linear_maps_recipes_to_configs(fake_primus_mxfp6, gen):
    x, w = torch.randn(32, 64, generator=gen), torch.randn(32, 64, generator=gen)
    PrimusTurboBackend().linear(x, w, None, "fp8-hybrid")
    PrimusTurboBackend().linear(x, w, None, MXFP4.with_gradient_sr())
    (_, _, kw8), = fake_primus_mxfp6.named("gemm_fp8")
    (_, _, kw4), = fake_primus_mxfp6.named("gemm_fp4")
    assert kw8["config"].format.name == "HYBRID" and kw4["config"].use_gradient_sr is True
    with pytest.raises(ValueError, match="multiples of 256"):
        PrimusTurboBackend().linear(x, w, None, "mxfp6")
