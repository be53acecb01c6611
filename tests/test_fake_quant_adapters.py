"""The brevitas and AMD Quark adapters (fake-quant libraries: they return values) against
strict fakes of their released packages (``tests/fakes/fake_brevitas.py``, brevitas 0.13.4;
``tests/fakes/fake_quark.py``, amd-quark 0.13), and the fakes against the released packages
where those are installed (CI's survey tox env; skipped elsewhere)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends import MissingDependency, Refusal
from mxcheck.backends import brevitas_backend as bb
from mxcheck.backends import quark_backend as qb
from mxcheck.conformance import basic
from mxcheck.recipes import OPERANDS, OperandSpec, Recipe, get_recipe
from tests.fakes import fake_brevitas, fake_quark

pytestmark = pytest.mark.emulated

# (bit_width, exponent_bit_width, mantissa_bit_width) brevitas' own LLM example gives each OCP
# format (brevitas_examples/common/generative/quantizers: float_ocp_e4m3 ... float_ocp_e2m1).
OCP_WIDTHS = {"ocp-mxfp8-e4m3": (8, 4, 3), "ocp-mxfp8-e5m2": (8, 5, 2), "ocp-mxfp6-e2m3": (6, 2, 3),
              "ocp-mxfp6-e3m2": (6, 3, 2), "ocp-mxfp4": (4, 2, 1)}


def _clear_caches() -> None:
    for cached in (bb._mx_quantizer, qb._quark, qb._reused_module):
        cached.cache_clear()


@pytest.fixture
def brevitas(monkeypatch: pytest.MonkeyPatch) -> bb.BrevitasBackend:
    fake_brevitas.install(monkeypatch)
    _clear_caches()
    yield bb.BrevitasBackend()
    _clear_caches()


@pytest.fixture
def quark(monkeypatch: pytest.MonkeyPatch) -> qb.QuarkBackend:
    fake_quark.install(monkeypatch)
    _clear_caches()
    yield qb.QuarkBackend()
    _clear_caches()


def _only(monkeypatch: pytest.MonkeyPatch, family: str, dtypes: tuple[torch.dtype, ...]) -> None:
    monkeypatch.setattr(basic, "QUANTIZE_INPUTS", {family: replace(basic.QUANTIZE_INPUTS[family], dtypes=dtypes)})


# ---- claims --------------------------------------------------------------------------------

def test_each_brevitas_mx_quantizer_is_the_ocp_recipe_of_its_element_widths():
    mx = {c.recipe.name: c.name for c in bb.BREVITAS_CONFIGS if c.recipe.x_row.scaling == "mx"}
    assert set(mx) == set(OCP_WIDTHS)
    for recipe, (bits, ebits, mbits) in OCP_WIDTHS.items():
        assert mx[recipe] == (f"MXFloat8e4m3Act.let(bit_width={bits}, exponent_bit_width={ebits}, "
                              f"mantissa_bit_width={mbits})")


def test_quark_claims_its_default_even_rule_and_ocps_floor_rule_on_every_mx_format():
    mx = [(c.recipe.x_row.fmt, c.recipe.x_row.scale_rule) for c in qb.QUARK_CONFIGS if c.recipe.x_row.scaling == "mx"]
    assert sorted(mx) == sorted((f, r) for f in ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1") for r in ("even", "floor"))
    others = {c.recipe.name for c in qb.QUARK_CONFIGS if c.recipe.x_row.scaling != "mx"}
    assert others == {"fp8-tensorwise", "nvfp4-1x16"}


@pytest.mark.parametrize(("adapter", "recipe", "field"), [
    (bb.BrevitasBackend, "mxfp8", "scale_rule='rceil'"), (bb.BrevitasBackend, "nvfp4-1x16", "scaling='nvfp4'"),
    (bb.BrevitasBackend, "mxfp4", "pad_to=128"), (qb.QuarkBackend, "mxfp8", "scale_rule='rceil'"),
    (qb.QuarkBackend, "fp8", "scale_formula='primus_turbo'")], ids=lambda v: getattr(v, "name", v))
def test_a_recipe_outside_the_configurations_is_not_supported_naming_the_field(adapter, recipe, field):
    ok, why = adapter().supports(recipe)
    assert not ok
    assert field in why, why


# ---- the library's release ------------------------------------------------------------------

@pytest.mark.parametrize(("install", "adapter", "package", "version", "needed"), [
    (fake_brevitas.install, bb.BrevitasBackend, "brevitas", "0.14.0", ">=0.13.3,<0.14"),
    (fake_brevitas.install, bb.BrevitasBackend, "brevitas", "0.12.1", ">=0.13.3,<0.14"),
    (fake_quark.install, qb.QuarkBackend, "amd-quark", "0.14", ">=0.12,<0.14"),
    (fake_quark.install, qb.QuarkBackend, "amd-quark", "0.11.2", ">=0.12,<0.14")],
    ids=["brevitas-0.14.0", "brevitas-0.12.1", "quark-0.14", "quark-0.11.2"])  # stable ids: xdist compares them
def test_a_release_outside_the_checked_range_is_named_with_the_range(monkeypatch, install, adapter, package, version,
                                                                     needed):
    install(monkeypatch, version=version)
    ok, why = adapter().available()
    assert not ok
    assert isinstance(why, MissingDependency)
    assert (why.package, why.needed, why.found) == (package, needed, version)


def test_both_are_available_on_their_checked_release(brevitas, quark):
    assert brevitas.available() == (True, "")
    assert quark.available() == (True, "")


def test_importing_and_getting_the_adapters_imports_neither_library(tmp_path):
    # packages that exist here, so that an import would succeed and show in sys.modules
    for name in ("brevitas", "quark"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    code = ("import sys, mxcheck.backends as b; b.get('brevitas'); b.get('quark'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('brevitas', 'quark')))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]"


# ---- values ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("recipe", ["ocp-mxfp4", "fp8-tensorwise"])
def test_brevitas_returns_its_quant_tensors_value_in_the_inputs_dtype_and_shape(brevitas, dtype, recipe):
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).to(dtype)
    v = brevitas.fake_quantize(x, get_recipe(recipe).x_row)
    assert (v.dtype, v.shape) == (dtype, x.shape)
    assert v.unique().numel() < x.unique().numel()  # quantized: fewer distinct values


def test_brevitas_takes_a_k_that_is_no_multiple_of_32_as_the_library_does(brevitas):
    # dynamic_over_sub_channel_block_view pads the last group with zeros
    x = torch.randn(2, 40, generator=torch.Generator().manual_seed(0))
    assert brevitas.fake_quantize(x, get_recipe("ocp-mxfp8-e4m3").x_row).shape == (2, 40)


@pytest.mark.parametrize(("x", "error", "match"), [
    (torch.ones(32), ValueError, r"x=\(32,\): brevitas fake_quantize takes a 2D \[rows, K\] tensor"),
    (torch.ones(2, 32, dtype=torch.int32), TypeError, r"x.dtype=torch.int32: brevitas fake_quantize takes"),
    (torch.ones(2, 32, dtype=torch.float64), TypeError, r"x.dtype=torch.float64")], ids=["1d", "int", "float64"])
def test_a_bad_operand_names_the_argument_and_what_is_accepted(brevitas, x, error, match):
    with pytest.raises(error, match=match):
        brevitas.fake_quantize(x, get_recipe("ocp-mxfp8-e4m3").x_row)


def test_a_spec_no_configuration_computes_is_a_refusal_naming_the_nearest(brevitas, quark):
    spec = get_recipe("mxfp4").w_row  # 2D 32x32 blocks
    for backend in (brevitas, quark):
        with pytest.raises(Refusal, match=r"has no configuration for this spec; the nearest, .* block_2d=True"):
            backend.fake_quantize(torch.ones(32, 128), spec)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_quark_refuses_mxfp4_even_on_half_precision_on_a_cpu_where_its_kernel_is_gpu_only(quark, dtype):
    x = torch.ones(2, 32, dtype=dtype)
    with pytest.raises(Refusal, match=r"mx\.qdq_mxfp4, a GPU-only kernel"):
        quark.fake_quantize(x, get_recipe("mxfp4-1x32").x_row)
    assert quark.fake_quantize(x.float(), get_recipe("mxfp4-1x32").x_row).dtype == torch.float32


def test_quark_reuses_one_module_per_mx_configuration_and_a_fresh_one_per_nvfp4_call(quark):
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(0))
    spec = get_recipe("ocp-mxfp8-e4m3").x_row
    assert qb._module(spec) is qb._module(spec)  # a layer's quantizer, called again and again
    nvfp4 = get_recipe("nvfp4-1x16").x_row
    assert qb._module(nvfp4) is not qb._module(nvfp4)  # its static second stage calibrates on one tensor
    assert quark.fake_quantize(x, nvfp4).shape == x.shape


# ---- the conformance suite on the fakes ---------------------------------------------------------

QUARK_E4M3_EVEN = next(c.recipe for c in qb.QUARK_CONFIGS if (c.recipe.x_row.fmt, c.recipe.x_row.scale_rule)
                       == ("e4m3", "even"))


@pytest.mark.parametrize(("adapter", "recipe"), [("brevitas", "ocp-mxfp8-e4m3"), ("quark", QUARK_E4M3_EVEN)],
                         ids=["brevitas-ocp-mxfp8-e4m3", "quark-mx-e4m3-even"])
def test_the_adapters_pass_the_values_check_where_the_released_code_is_ocp_exact(request, monkeypatch, adapter, recipe):
    # randn in float32: no block near a binade edge, no specials, nothing tiny
    _only(monkeypatch, "bf16", (torch.float32,))
    assert basic.check_quantize(request.getfixturevalue(adapter), get_recipe(recipe), torch.Generator()) is None


@pytest.mark.parametrize(("adapter", "recipe", "family", "dtype", "cause"), [
    ("brevitas", "ocp-mxfp8-e4m3", "zeros", torch.float16, "128 of 128 blocks"),
    ("brevitas", "ocp-mxfp8-e4m3", "amax-bf16", torch.bfloat16, "block exponent from a log2 in the input's dtype"),
    ("quark", "ocp-mxfp8-e4m3", "amax", torch.float32, "block exponent from a float32 log2"),
    ("quark", "mxfp4-1x32", "bf16", torch.float32, "-0 lost: every zero code is +0")], ids=str)
def test_the_released_defects_the_fakes_carry_fail_the_values_check(request, monkeypatch, adapter, recipe, family,
                                                                     dtype, cause):
    _only(monkeypatch, family, (dtype,))
    with pytest.raises(NumericsError, match=f"fake_quantize of recipe {recipe}, backend {adapter}") as e:
        basic.check_quantize(request.getfixturevalue(adapter), get_recipe(recipe), torch.Generator())
    assert cause in str(e.value)


# ---- the fakes against the released libraries ----------------------------------------------------

def _released(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _same_values(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.dtype == want.dtype and bool(((got == want) & (torch.signbit(got) == torch.signbit(want))
                                             | (got.isnan() & want.isnan())).all())


def _where_fake_and_library_differ(monkeypatch, adapter, fake, recipe, inputs) -> list[str]:
    """The input labels where the adapter's values over the installed library differ from its
    values over the fake (installed for the second pass only)."""
    _clear_caches()
    real = [adapter().fake_quantize(t, recipe.spec(name)) for _, name, _, t in inputs]
    with monkeypatch.context() as m:
        fake.install(m)
        _clear_caches()
        faked = [adapter().fake_quantize(t, recipe.spec(name)) for _, name, _, t in inputs]
    _clear_caches()
    return [label for (_, _, label, _), a, b in zip(inputs, real, faked, strict=True) if not _same_values(a, b)]


@pytest.mark.skipif(not _released("brevitas"), reason="brevitas not installed (the survey's tox env installs it)")
@pytest.mark.parametrize("recipe", [*OCP_WIDTHS, "fp8-tensorwise"])
def test_the_brevitas_fake_gives_the_released_librarys_values(monkeypatch, recipe):
    r = get_recipe(recipe)
    inputs = list(basic.quantize_inputs(r, torch.Generator(), bb.BrevitasBackend.input_dtypes, "cpu"))
    assert _where_fake_and_library_differ(monkeypatch, bb.BrevitasBackend, fake_brevitas, r, inputs) == []


# What the Quark fake is held to, measured against 0.13 on every float32 family: MX "even"
# treats a block holding Inf or NaN otherwise than the fake (not modelled).
QUARK_HELD = [("mx:e4m3:even", ("inf-nan", "one-inf", "one-nan")), ("ocp-mxfp8-e4m3", ()), ("ocp-mxfp4", ()),
              ("fp8-tensorwise", ()), ("nvfp4-1x16", ())]


@pytest.mark.skipif(not _released("quark"), reason="amd-quark not installed (the survey's tox env installs it)")
@pytest.mark.parametrize(("recipe", "not_modelled"), QUARK_HELD, ids=[r for r, _ in QUARK_HELD])
def test_the_quark_fake_gives_the_released_librarys_values(monkeypatch, recipe, not_modelled):
    r = (Recipe(recipe, **dict.fromkeys(OPERANDS, OperandSpec("e4m3", "mx", scale_rule="even")))
         if recipe.startswith("mx:") else get_recipe(recipe))
    inputs = [i for i in basic.quantize_inputs(r, torch.Generator(), (torch.float32,), "cpu") if i[0] not in not_modelled]
    assert _where_fake_and_library_differ(monkeypatch, qb.QuarkBackend, fake_quark, r, inputs) == []
