"""The AITER and Primus-Turbo adapters against FAKE vendor modules (no AMD GPU involved).

Each fake records its calls and computes with mxcheck's oracle. A fake GEMM decodes its
operands the way the vendor defines them (AITER ``mxfp4_to_f32``: low nibble first, table
[0, .5, 1, 1.5, 2, 3, 4, 6, -0, ...]; ``e8m0_to_f32``: 2**(byte - 127); the E2M3 table of
``gemm_op_a6w6._e2m3_table``), undoes preshuffles with ``mxcheck.layouts`` and multiplies
in float64; fake shuffles pad with 255 (E8M0 NaN) where AITER leaves memory unspecified.
So a wrong layout, nibble order or argument order in an adapter changes the result.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import Enum
from types import ModuleType, SimpleNamespace
from typing import Any, NamedTuple

import pytest
import torch

import mxcheck.backends
from mxcheck import layouts
from mxcheck.backends.aiter import AiterBackend
from mxcheck.backends.primus_turbo import PrimusTurboBackend
from mxcheck.recipes import RECIPES, OperandSpec
from mxcheck.scaling.fp8 import fp8_quantize
from mxcheck.scaling.mx import MXTensor, mx_quantize

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


def install(monkeypatch: pytest.MonkeyPatch, *names: str) -> dict[str, ModuleType]:
    mods = {n: ModuleType(n) for n in names}
    for n, m in mods.items():
        parent, _, child = n.rpartition(".")
        if parent:
            setattr(mods[parent], child, m)
        monkeypatch.setitem(sys.modules, n, m)
    return mods


@pytest.fixture
def fake_aiter(monkeypatch: pytest.MonkeyPatch) -> Calls:
    calls = Calls()
    m = install(monkeypatch, "aiter", "aiter.utility", "aiter.utility.fp4_utils", "aiter.ops", "aiter.ops.shuffle")
    m["aiter"].dtypes = SimpleNamespace(fp4x2=torch.float4_e2m1fn_x2, fp8_e8m0=torch.float8_e8m0fnu, bf16=torch.bfloat16)

    def dynamic_mxfp4_quant(x, scaling_mode="even", shuffle=False):
        calls.add("dynamic_mxfp4_quant", x, scaling_mode=scaling_mode, shuffle=shuffle)
        q = mx_quantize(x, "e2m1", scale_rule="even")
        return pack_nibbles(q.codes), q.scales.view(torch.float8_e8m0fnu)

    def shuffle_weight(x, layout=(16, 16), use_int4=False):
        calls.add("shuffle_weight", x, layout=layout)
        return layouts.shuffle_weight(x, layout)

    def e8m0_shuffle(scale):
        calls.add("e8m0_shuffle", scale)
        return layouts.shuffle_scale(scale, pad_value=255)

    def a4w4(A, B, A_scale, B_scale, dtype, bpreshuffle):
        m, n, k = A.shape[0], B.shape[0], 2 * A.shape[1]
        B = layouts.unshuffle_weight(B) if bpreshuffle else B
        As, Bs = layouts.unshuffle_scale(A_scale, m, k // 32), layouts.unshuffle_scale(B_scale, n, k // 32)
        out = torch.full((-(-m // 32) * 32, n), torch.nan, dtype=dtype)  # rows padded as AITER's
        out[:m] = (dec_fp4(A, As) @ dec_fp4(B, Bs).T).to(dtype)
        return out

    def gemm_a4w4(A, B, A_scale, B_scale, bias=None, dtype=torch.bfloat16, alpha=1.0, beta=0.0, bpreshuffle=True):
        calls.add("gemm_a4w4", A, B, A_scale, B_scale, bias=bias, dtype=dtype, bpreshuffle=bpreshuffle)
        return a4w4(A, B, A_scale, B_scale, dtype, bpreshuffle)[: A.shape[0]]

    def quant_mxfp6_gemm(w):
        calls.add("quant_mxfp6_gemm", w)
        return layouts.pack_mxfp6_blob(*_mxfp6(w))

    def gemm_a6w6(A, B, A_scale, B_scale, M, N, K, dtype=torch.bfloat16, alpha=1.0, kernelName=None, bias=None):
        calls.add("gemm_a6w6", A, B, A_scale, B_scale, M, N, K, dtype=dtype)
        (ac, asc), (bc, bsc) = layouts.unpack_mxfp6_blob(A, A_scale, M, K), layouts.unpack_mxfp6_blob(B, B_scale, N, K)
        return (_dec(ac, E2M3, asc) @ _dec(bc, E2M3, bsc).T).to(dtype)

    m["aiter.utility.fp4_utils"].dynamic_mxfp4_quant = dynamic_mxfp4_quant
    m["aiter.utility.fp4_utils"].e8m0_shuffle = e8m0_shuffle
    m["aiter.ops.shuffle"].shuffle_weight = shuffle_weight
    m["aiter"].gemm_a4w4, m["aiter"].gemm_a6w6, m["aiter"].quant_mxfp6_gemm = gemm_a4w4, gemm_a6w6, quant_mxfp6_gemm
    m["aiter"].legacy_a4w4 = a4w4  # for the test of AITER's older signature
    return calls


def _mxfp6(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = oracle(x, MXFP6.x_row)
    return q.codes, q.scales


def _gemm_flags(trans_a: bool, trans_b: bool, trans_c: bool = False) -> None:
    if trans_a or not trans_b or trans_c:
        raise NotImplementedError(f"fake implements NT only, got {trans_a=} {trans_b=} {trans_c=}")


@pytest.fixture
def fake_primus(monkeypatch: pytest.MonkeyPatch) -> Calls:
    calls = Calls()
    p = "primus_turbo.pytorch."
    m = install(monkeypatch, "primus_turbo", "primus_turbo.pytorch", *(p + s for s in (
        "core", "core.low_precision", "core.backend", "ops", "ops.quantization", "ops.gemm_fp4", "ops.gemm_fp6",
        "ops.gemm_fp8", "kernels", "kernels.gemm", "kernels.gemm.gemm_fp4_impl", "kernels.gemm.gemm_fp6_impl",
        "kernels.gemm.gemm_fp8_impl", "kernels.quantization", "kernels.quantization.mxfp6_pack")))
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
    lp.Float4QuantConfig, lp.Float6QuantConfig, lp.Float8QuantConfig = Float4QuantConfig, SimpleNamespace, Float8QuantConfig
    m[p + "core.backend"].BackendType = Enum("BackendType", "AITER HIPBLASLT TURBO")

    def fp4(x, recipe, axis):  # rows of the NT operand: x (axis 1) or x^T (axis 0); K padded to 128
        q = mx_quantize(x if axis == 1 else x.t(), "e2m1", scale_rule="even", block_2d=recipe.use_2d_block,
                        hadamard="h16x2" if recipe.use_rht else None, pad_to=128)
        return pack_nibbles(q.codes), q.scales.view(torch.float8_e8m0fnu)

    def quantize_fp4(x, out_dtype, granularity, *, block_size=None, axis=None, scaling_recipe=None):
        calls.add("quantize_fp4", x, out_dtype, granularity, block_size=block_size, axis=axis, recipe=scaling_recipe)
        return fp4(x, scaling_recipe, axis)

    def quantize_fp4_with_trans(x, out_dtype, granularity, *, block_size=None, axis=None, scaling_recipe=None,
                                scaling_recipe_for_trans=None):
        calls.add("quantize_fp4_with_trans", x, recipe=scaling_recipe, recipe_t=scaling_recipe_for_trans)
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
            qa, qb = quant(a, config, "x_row"), quant(b, config, "w_row")
            return StraightThrough.apply(a, b, (qa.double() @ qb.double().T).to(out_dtype))
        return gemm

    m[p + "ops.quantization"].quantize_fp4 = quantize_fp4
    m[p + "ops.quantization"].quantize_fp4_with_trans = quantize_fp4_with_trans
    m[p + "ops.quantization"].quantize_fp8 = quantize_fp8
    m[p + "kernels.quantization.mxfp6_pack"].quantize_mxfp6_row = lambda x: (
        calls.add("quantize_mxfp6_row", x), layouts.pack_mxfp6_blob(*_mxfp6(x)))[1]
    m[p + "kernels.quantization.mxfp6_pack"].quantize_mxfp6_dual = lambda x: (
        calls.add("quantize_mxfp6_dual", x),
        (*layouts.pack_mxfp6_blob(*_mxfp6(x)), *layouts.pack_mxfp6_blob(*_mxfp6(x.t()))))[1]
    m[p + "kernels.gemm.gemm_fp4_impl"].gemm_fp4_impl = gemm_fp4_impl
    m[p + "kernels.gemm.gemm_fp6_impl"].gemm_fp6_impl = gemm_fp6_impl
    m[p + "kernels.gemm.gemm_fp8_impl"].gemm_fp8_impl = gemm_fp8_impl
    m[p + "ops.gemm_fp4"].gemm_fp4 = linear_fn("gemm_fp4", lambda t, c, op: oracle(t.detach(), MXFP4.spec(op)).dequantize())
    m[p + "ops.gemm_fp6"].gemm_fp6 = linear_fn("gemm_fp6", lambda t, c, op: oracle(t.detach(), MXFP6.spec(op)).dequantize())
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
    (AiterBackend, "mxfp4", ""), (AiterBackend, "mxfp6", ""),
    (AiterBackend, "fp8", "x_row is e4m3 scaling='tensor'"), (AiterBackend, "mxfp4-fp8bwd", "g_row is e5m2"),
    (AiterBackend, "mxfp8", "x_row is e4m3 scaling='mx'"), (AiterBackend, "nvfp4", "scaling='nvfp4'"),
    (PrimusTurboBackend, "mxfp4", ""), (PrimusTurboBackend, "mxfp6", ""), (PrimusTurboBackend, "fp8", ""),
    (PrimusTurboBackend, "fp8-hybrid", ""), (PrimusTurboBackend, "mxfp4+sr", ""),
    (PrimusTurboBackend, "mxfp4-fp8bwd", "'g_row': 'fp8'"), (PrimusTurboBackend, "fp8-delayed", "'x_row': None"),
    (PrimusTurboBackend, "nvfp4", "'x_row': None"),
], ids=str)
def test_supports_answers_with_a_reason(cls, recipe, why):
    r = MXFP4.with_gradient_sr() if recipe == "mxfp4+sr" else recipe
    ok, reason = cls().supports(r)
    assert ok == (why == "") and why in reason


# ---------------------------------------------------------------------------------------
# AITER


def test_aiter_quantize_is_the_oracle_through_unshuffled_dynamic_mxfp4_quant(fake_aiter, gen):
    x = torch.randn(48, 192, generator=gen).bfloat16()
    q, want = AiterBackend().quantize(x, MXFP4.x_row), oracle(x, MXFP4.x_row)
    assert torch.equal(q.codes, want.codes) and torch.equal(q.scales, want.scales) and q.codes.shape == (48, 256)
    assert torch.equal(q.dequantize(), want.dequantize())
    (_, args, kw), = fake_aiter.named("dynamic_mxfp4_quant")
    assert kw["shuffle"] is False and args[0].shape == (48, 192)


@pytest.mark.parametrize(("op", "field"), [("w_row", "block_2d"), ("x_col", "hadamard")])
def test_aiter_quantize_refuses_what_its_quantizer_lacks(fake_aiter, op, field):
    with pytest.raises(ValueError, match=field):
        AiterBackend().quantize(torch.zeros(32, 64), MXFP4.spec(op))


@pytest.mark.parametrize("legacy", [False, True], ids=["gemm_a4w4-dtype", "gemm_a4w4-out"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_aiter_a4w4_equals_the_emulated_product_with_aiter_layouts(fake_aiter, gen, monkeypatch, legacy, with_bias):
    m, n, k = 48, 32, 192  # M not a multiple of 32: the padded output rows must be cropped
    a = oracle(torch.randn(m, k, generator=gen), MXFP4.x_row)
    b = oracle(torch.randn(n, k, generator=gen), MXFP4.w_row)
    bias = torch.randn(n, generator=gen).bfloat16() if with_bias else None
    aiter = sys.modules["aiter"]
    if legacy:  # older AITER: gemm_a4w4(A, B, A_scale, B_scale, out, bias, alpha, beta, bpreshuffle)
        def gemm_a4w4(A, B, A_scale, B_scale, out, bias=None, alpha=1.0, beta=0.0, bpreshuffle=True):
            fake_aiter.add("gemm_a4w4", A, B, A_scale, B_scale, out, bpreshuffle=bpreshuffle)
            out.fill_(7.0)  # rows past M stay garbage, as in AITER's padded output
            out[:m] = aiter.legacy_a4w4(A, B, A_scale, B_scale, out.dtype, bpreshuffle)[:m]
            return out
        monkeypatch.setattr(aiter, "gemm_a4w4", gemm_a4w4)
    got = AiterBackend().gemm(a, b, bias=bias)
    want = product(a, b)
    assert same(got, want if bias is None else want + bias)
    assert [c[0] for c in fake_aiter] == ["shuffle_weight", "e8m0_shuffle", "e8m0_shuffle", "gemm_a4w4"]
    (_, (w,), kw), (_, (sa,), _), (_, (sb,), _), (_, g, gkw) = fake_aiter
    assert kw["layout"] == (16, 16) and w.dtype == torch.float4_e2m1fn_x2 and w.shape == (n, 128)
    assert (sa.shape, sb.shape, sa.dtype) == ((m, 8), (n, 8), torch.float8_e8m0fnu)
    assert [t.shape for t in g[:4]] == [(m, 128), (n, 128), (256, 8), (256, 8)]  # A unpadded, scales 256 rows
    assert gkw["bpreshuffle"] is True and (g[4].shape == (256, n) if legacy else gkw["dtype"] == torch.bfloat16)


@pytest.mark.parametrize(("m", "n", "k", "bad"), [(48, 24, 128, "N=24"), (40, 32, 128, "M=40"), (32, 32, 96, "K=96")])
def test_aiter_a4w4_names_the_dim_that_does_not_tile(fake_aiter, m, n, k, bad):
    a, b = oracle(torch.ones(m, k), MXFP4.x_row.__class__("e2m1", "mx", scale_rule="even")), None
    b = oracle(torch.ones(n, k), MXFP4.x_row.__class__("e2m1", "mx", scale_rule="even"))
    with pytest.raises(ValueError, match=bad):
        AiterBackend().gemm(a, b)


def test_aiter_a6w6_quantizes_and_multiplies_blobs_in_aiter_argument_order(fake_aiter, gen):
    m, n, k = 40, 24, 96
    x, w = torch.randn(m, k, generator=gen).bfloat16(), torch.randn(n, k, generator=gen).bfloat16()
    be = AiterBackend()
    a, b = be.quantize(x, MXFP6.x_row), be.quantize(w, MXFP6.w_row)
    assert torch.equal(a.codes, oracle(x, MXFP6.x_row).codes) and a.hadamard is not None
    assert torch.equal(b.scales, oracle(w, MXFP6.w_row).scales)
    assert same(be.gemm(a, b), product(oracle(x, MXFP6.x_row), oracle(w, MXFP6.w_row)))
    (_, args, _), = fake_aiter.named("gemm_a6w6")
    assert args[4:] == (m, n, k) and [t.numel() for t in args[:4]] == [3 * 24576, 3 * 24576, 3072, 3072]


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


def test_primus_fp6_quantize_dual_and_gemm_fp6_impl_argument_order(fake_primus, gen):
    x, w = torch.randn(64, 96, generator=gen), torch.randn(32, 96, generator=gen)
    be = PrimusTurboBackend()
    (a, a_t), b = be.quantize_dual(x, MXFP6.x_row, MXFP6.x_col), be.quantize(w, MXFP6.w_row)
    assert torch.equal(a_t.codes, oracle(x.t(), MXFP6.x_col).codes)
    assert same(be.gemm(a, b), product(oracle(x, MXFP6.x_row), oracle(w, MXFP6.w_row)))
    (_, args, _), = fake_primus.named("gemm_fp6_impl")
    assert args[4:] == (64, 32, 96, torch.bfloat16, 4) and args[1].numel() == 3 * 1024  # a, a_scale, b, b_scale


def test_primus_fp8_tensorwise_quantize_and_gemm(fake_primus, gen):
    x, w = torch.randn(32, 64, generator=gen), torch.randn(16, 64, generator=gen)
    be = PrimusTurboBackend()
    a, b = be.quantize(x, FP8.x_row), be.quantize(w, FP8.w_row)
    fa, fb = fp8_quantize(x, "e4m3", scale_formula="primus_turbo"), fp8_quantize(w, "e4m3", scale_formula="primus_turbo")
    assert torch.equal(a.codes, fa.codes) and torch.equal(a.scale_inv, fa.scale_inv)
    want = (fa.dequantize().double() @ fb.dequantize().double().T).to(torch.bfloat16)
    assert same(be.gemm(a, b), want)
    (_, args, _), = fake_primus.named("gemm_fp8_impl")
    assert args[0].dtype == torch.float8_e4m3fn and (args[2], args[5], args[7]) == (False, True, False)
    assert args[8:] == (1, 2)  # TENSORWISE, HIPBLASLT


def test_primus_linear_runs_gemm_fp4_nt_on_flattened_tokens_and_adds_bias(fake_primus, gen):
    x = torch.randn(2, 16, 128, generator=gen, requires_grad=True)
    w, bias = torch.randn(64, 128, generator=gen), torch.randn(64, generator=gen)
    out = PrimusTurboBackend().linear(x, w, bias, "mxfp4")
    want = product(oracle(x.detach().reshape(32, 128), MXFP4.x_row), oracle(w, MXFP4.w_row))
    assert out.shape == (2, 16, 64) and same(out.reshape(32, 64), want + bias.bfloat16())
    (_, args, kw), = fake_primus.named("gemm_fp4")
    assert args[0].shape == (32, 128) and (kw["trans_a"], kw["trans_b"]) == (False, True)
    assert kw["config"].use_gradient_sr is False and kw["out_dtype"] == torch.bfloat16
    out.float().sum().backward()
    assert x.grad is not None and bool(x.grad.abs().sum() > 0)


def test_primus_linear_maps_recipes_to_configs(fake_primus, gen):
    x, w = torch.randn(32, 64, generator=gen), torch.randn(32, 64, generator=gen)
    PrimusTurboBackend().linear(x, w, None, "fp8-hybrid")
    PrimusTurboBackend().linear(x, w, None, MXFP4.with_gradient_sr())
    (_, _, kw8), = fake_primus.named("gemm_fp8")
    (_, _, kw4), = fake_primus.named("gemm_fp4")
    assert kw8["config"].format.name == "HYBRID" and kw4["config"].use_gradient_sr is True
    with pytest.raises(ValueError, match="multiples of 256"):
        PrimusTurboBackend().linear(x, w, None, "mxfp6")
