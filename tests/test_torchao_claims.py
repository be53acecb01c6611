"""The torchao adapter on whatever torchao release is installed (tox env torchao-oldest runs
this on the oldest declared one): its claims hold bit for bit on float32 and bfloat16
tensors, what it refuses is a Refusal, and a release outside the measured range is named."""

from __future__ import annotations

from importlib import metadata

import pytest
import torch

from mxcheck.backends import MissingDependency, Refusal
from mxcheck.backends import torchao_compat as compat
from mxcheck.backends.torchao_backend import TORCHAO_CLAIMS, TorchaoBackend
from mxcheck.conformance import CHECKS
from mxcheck.conformance import basic as conformance_basic
from mxcheck.deps import needs
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import RECIPES, OperandSpec

with needs("torchao"):
    import torchao.prototype.mx_formats.mx_tensor  # noqa: F401

pytestmark = pytest.mark.emulated

_CLAIM_IDS = [r.name for r in TORCHAO_CLAIMS]
_BF16_VALUED = ("bf16", "amax-bf16", "inf-nan")  # QUANTIZE_INPUTS whose values are all bf16's
# Inputs the plain oracle (no profile) and torchao agree on: MX blocks with a float32-normal
# amax (the bf16 input); the Float8 casts on every finite input (NaN / Inf: see
# test_torch_backends.py::test_torchao_float8_turns_a_nan_or_inf_amax_into_a_nan_or_zero_scale).
_PLAIN_ORACLE_INPUTS = {"mx": ("bf16",), "fp8": ("bf16", "amax", "amax-bf16")}


class _FedAs:
    """The torchao backend handed ``dtype`` tensors where check_quantize makes float32 ones;
    only inputs whose values ``dtype`` holds exactly are passed on."""

    name = "torchao"

    def __init__(self, dtype: torch.dtype) -> None:
        self.inner, self.dtype = TorchaoBackend(device="cpu"), dtype

    def quantize(self, x: torch.Tensor, spec: OperandSpec, **kw):
        t = x.to(self.dtype)
        assert torch.equal(t.float(), x), f"the input is not {self.dtype}-valued"
        return self.inner.quantize(t, spec, **kw)


def _kind(recipe) -> str:
    return "mx" if recipe.x_row.scaling == "mx" else "fp8"


def test_torchao_claims_exercise_every_scale_rule_on_several_mx_formats():
    mx = {(r.x_row.fmt, r.x_row.scale_rule) for r in TORCHAO_CLAIMS if _kind(r) == "mx"}
    for rule in ("floor", "ceil", "even", "rceil"):
        assert {f for f, r in mx if r == rule} == {"e2m1", "e2m3", "e4m3"}, rule
    for r in TORCHAO_CLAIMS:  # MX: one spec on all six copies, 1x32 along K
        specs = {r.spec(op) for op in ("x_row", "w_row", "g_row", "w_col", "g_col", "x_col")}
        assert _kind(r) == "fp8" or (len(specs) == 1 and r.x_row.block_size == 32), r.name
    assert {"mxfp8@torchao.rceil", "mxfp4-1x32@torchao.even", "fp8", "fp8-hybrid", "fp8-rowwise"} <= set(_CLAIM_IDS)
    # every MX claim is pinned to the torchao profile of its rule (RECIPE@PROFILE)
    assert all(r.name.endswith(f"@torchao.{r.x_row.scale_rule}") for r in TORCHAO_CLAIMS if _kind(r) == "mx")


@pytest.mark.parametrize("recipe", TORCHAO_CLAIMS, ids=_CLAIM_IDS)
def test_torchao_claims_pass_the_conformance_quantize_check(recipe, gen, monkeypatch):
    """As the suite runs it: every input family, as float32 and bf16 tensors (input_dtypes).
    The MX claims are pinned to torchao's profiles and pass every family; the Float8 casts
    turn a NaN or Inf amax into a NaN or zero scale (a finding pinned by
    test_torch_backends.py::test_torchao_float8_turns_a_nan_or_inf_amax_into_a_nan_or_zero_scale),
    so they are held to the finite families here."""
    if _kind(recipe) == "fp8":
        monkeypatch.setattr(conformance_basic, "QUANTIZE_INPUTS",
                            {n: conformance_basic.QUANTIZE_INPUTS[n] for n in _PLAIN_ORACLE_INPUTS["fp8"]})
    assert CHECKS["quantize"](TorchaoBackend(device="cpu"), recipe, gen) is None


def _wide(gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Gaussian rows at scales 2^-20 .. 2^20: normal amaxes, no byte-0 block."""
    x = torch.randn(64, 256, generator=gen) * torch.exp2(torch.randint(-20, 21, (64, 1), generator=gen).float())
    return x.to(dtype)


@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
@pytest.mark.parametrize("fmt", ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2"])
def test_torchao_quantize_of_a_bf16_tensor_equals_quantize_operand_of_it(fmt, rule, gen):
    x, spec = _wide(gen, torch.bfloat16), OperandSpec(fmt, "mx", scale_rule=rule)
    got, want = TorchaoBackend(device="cpu").quantize(x, spec), quantize_operand(x, spec)
    assert torch.equal(got.scales, want.scales) and torch.equal(got.codes, want.codes)


@pytest.mark.parametrize("recipe", ["fp8", "fp8-hybrid", "fp8-rowwise"])
def test_torchao_float8_cast_of_a_bf16_tensor_equals_quantize_operand_of_it(recipe, gen):
    x, spec = _wide(gen, torch.bfloat16) / 2**20, RECIPES[recipe].g_row  # fp8-hybrid's g is e5m2
    got, want = TorchaoBackend(device="cpu").quantize(x, spec), quantize_operand(x, spec)
    assert torch.equal(got.codes, want.codes) and torch.equal(got.scale_inv, want.scale_inv)


def test_torchao_input_dtypes_are_what_its_quantize_takes(gen):
    b = TorchaoBackend(device="cpu")
    assert set(b.input_dtypes) == {torch.float32, torch.bfloat16}
    x = _wide(gen, torch.float32)
    for dtype in (torch.float16, torch.float64):  # to_mx asserts "not supported yet"
        with pytest.raises(Refusal, match=str(dtype)):
            b.quantize(x.to(dtype), OperandSpec("e4m3", "mx"))


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(("spec", "word"), [
    (OperandSpec("e4m3", "mx", block_2d=True), "2D"),
    (OperandSpec("e4m3", "mx", hadamard="h32"), "Hadamard"),
    (OperandSpec("e4m3", "mx", rounding="sr"), "nearest even"),
    (OperandSpec("e4m3", "mx", zero_scale=127), "zero_scale"),
    (OperandSpec("e2m1", "nvfp4", block_size=16), "MX blocks"),
])
def test_torchao_quantize_refuses_what_torchao_cannot_do(spec, word):
    with pytest.raises(Refusal, match=word):
        TorchaoBackend(device="cpu").quantize(torch.randn(4, 64), spec)


def test_torchao_refuses_a_k_that_does_not_tile_but_rejects_caller_mistakes_as_plain_errors():
    b = TorchaoBackend(device="cpu")
    with pytest.raises(Refusal, match="K\\) = 40"):
        b.quantize(torch.randn(4, 40), OperandSpec("e4m3", "mx"))
    with pytest.raises(ValueError, match="2D") as e:
        b.quantize(torch.randn(64), OperandSpec("e4m3", "mx"))
    assert not isinstance(e.value, Refusal)
    with pytest.raises(TypeError, match=r"torch\.int32"):
        b.quantize(torch.ones(4, 64, dtype=torch.int32), OperandSpec("e4m3", "mx"))
    with pytest.raises(Refusal, match="M=40"):
        b.linear(torch.randn(40, 64), torch.randn(64, 64), None, "mxfp8")
    with pytest.raises(Refusal, match="2D"):
        b.linear(torch.randn(32, 64), torch.randn(32, 64), None, "mxfp4")


# ------------------------------------------------------------------ what the installed torchao has


@pytest.mark.parametrize(("found", "ok"), [("0.13.0", False), ("0.14.0", True), ("0.18.0", True),
                                           ("0.19.0", False), ("0.14.1+cu126", True)])
def test_torchao_outside_the_measured_releases_is_a_missing_dependency(found, ok, monkeypatch):
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: found if name == "torchao" else real(name))
    got = TorchaoBackend(device="cpu").available()
    if ok:
        assert got == (True, "")
        return
    assert got[0] is False and isinstance(got[1], MissingDependency)
    assert (got[1].package, got[1].needed, got[1].found) == ("torchao", ">=0.14,<0.19", found)
    assert got[1] == f"needs torchao>=0.14,<0.19 (found {found})"


def test_torchao_not_installed_is_a_missing_dependency(monkeypatch):
    def absent(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", absent)
    assert TorchaoBackend(device="cpu").available() == (False, "needs torchao>=0.14,<0.19 (not installed)")


def test_torchao_without_mx_mm_still_quantizes_and_says_which_recipes_need_it(monkeypatch, gen):
    monkeypatch.setattr(compat, "MX_MM_HOMES", ("torchao.no_such_module",))
    compat.mx_mm.cache_clear()
    try:
        b = TorchaoBackend(device="cpu")
        assert b.available() == (True, "")
        ok, why = b.supports("mxfp8")
        assert not ok and "recipe mxfp8 needs mx_mm" in why and "torchao.no_such_module" in why
        with pytest.raises(Refusal, match="mx_mm"):
            b.linear(torch.randn(64, 64), torch.randn(64, 64), None, "mxfp8")
        x = _wide(gen, torch.float32)
        assert torch.equal(b.quantize(x, RECIPES["mxfp8"].x_row).codes, quantize_operand(x, RECIPES["mxfp8"].x_row).codes)
    finally:
        compat.mx_mm.cache_clear()


def test_torchao_mx_mm_arguments_follow_the_installed_signature(monkeypatch):
    class Future:  # a release whose mx_mm grew an argument this adapter does not know
        @staticmethod
        def forward(ctx, input_hp, weight_hp, in_elem_dtype, w_elem_dtype, grad_elem_dtype, block_size,
                    fused_bias, scale_calculation_mode):
            raise AssertionError("not called")

    monkeypatch.setattr(compat, "mx_mm", lambda: (Future, None))
    assert "'fused_bias'" in compat.mx_mm_args(compat.scale_mode("rceil"))
    ok, why = TorchaoBackend(device="cpu").supports("mxfp4-1x32")
    assert not ok and "'fused_bias'" in why
