"""The compressed-tensors and ModelOpt adapters against strict fakes of their releases
(``tests/fakes/fake_compressed_tensors.py``: compressed-tensors 0.20.1;
``tests/fakes/fake_modelopt.py``: nvidia-modelopt 0.47.0): claims, refusals, the version
range, the codes' layout, and values returned in the dtype and with the defects the library has.
The real libraries' runs are recorded by ``tools/survey_conventions.py``
(``references/conventions/``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mxcheck.backends import Refusal, get
from mxcheck.backends.compressed_tensors_backend import CT_CONFIGS
from mxcheck.backends.contract import MissingDependency
from mxcheck.backends.modelopt_backend import MODELOPT_CONFIGS
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import OperandSpec, get_recipe
from tests.fakes import fake_compressed_tensors, fake_modelopt

pytestmark = pytest.mark.emulated

# adapter name -> (fake module, distribution, its configurations)
ADAPTERS = {"compressed_tensors": (fake_compressed_tensors, "compressed-tensors", CT_CONFIGS),
            "modelopt": (fake_modelopt, "nvidia-modelopt", MODELOPT_CONFIGS)}
# Claims whose codes and scales are the oracle's on float32 normal data (checked against the
# real releases, references/conventions/*.json); the others differ by a convention:
# compressed-tensors MXFP8A16 rounds the block amax at e2m1's mantissa width (mxfp_utils.py
# generate_mx_scales), its NVFP4 tensor_scale is 1 / global_scale (it stores the encode factor).
# Both FP8 exports store scale_inv = amax / 448, the oracle 1 / (448 / amax): an ulp apart on
# some amax.
EXACT = {"compressed_tensors": ("mxfp4-1x32",),
         "modelopt": ("nvfp4-1x16@modelopt.nvfp4", "mxfp8", "modelopt-mxfp4")}


@pytest.fixture(params=sorted(ADAPTERS))
def adapter(request, monkeypatch):
    fake, _, configs = ADAPTERS[request.param]
    fake.install(monkeypatch)
    return request.param, get(request.param), configs


def _randn(rows: int = 8, cols: int = 64, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(3)).to(dtype)


def test_each_configuration_claims_a_recipe_the_adapter_supports(adapter):
    _, backend, configs = adapter
    assert backend.available() == (True, "")
    assert [c.recipe for c in configs] == list(backend.claims)
    for config in configs:
        assert backend.supports(config.recipe) == (True, "")


def test_a_spec_no_configuration_computes_is_refused_naming_the_field(adapter):
    name, backend, configs = adapter
    spec = dataclasses.replace(configs[0].spec, hadamard="h16x2", profile=None)
    with pytest.raises(Refusal, match=rf"nearest, {configs[0].name} .*hadamard='h16x2' \(it computes None\)"):
        backend.quantize(_randn(), spec)
    ok, why = backend.supports(get_recipe("mxfp6"))
    assert not ok and why.startswith(f"{name}: recipe mxfp6: ") and "differs in fmt='e2m3'" in why
    with pytest.raises(Refusal, match="K=40"):
        backend.quantize(_randn(cols=40), configs[0].spec)


def test_bad_operands_are_type_and_value_errors(adapter):
    _, backend, configs = adapter
    with pytest.raises(ValueError, match=r"2D \[rows, K\].*\(64,\)"):
        backend.quantize(torch.zeros(64), configs[0].spec)
    with pytest.raises(TypeError, match=r"x\.dtype=torch\.float64"):
        backend.fake_quantize(_randn().double(), configs[0].spec)


@pytest.mark.parametrize("found", ["0.19.0", "9.0.0"])
def test_a_release_outside_the_checked_range_is_not_available(monkeypatch, found):
    for name, (fake, dist, _) in ADAPTERS.items():
        with monkeypatch.context() as mp:
            fake.install(mp, version=found)
            ok, why = get(name).available()
            assert not ok and isinstance(why, MissingDependency) and why.package == dist and why.found == found


def test_an_absent_library_is_a_missing_dependency():
    for name, (_, dist, _) in ADAPTERS.items():
        ok, why = get(name).available()
        assert not ok and isinstance(why, MissingDependency) and why.package == dist and why.found is None


def test_codes_are_the_oracles_where_the_library_agrees_with_it(adapter):
    """Unpacked codes and scales in mxcheck's layout: a nibble order, reshape or scale view
    wrong in the adapter moves codes."""
    name, backend, _ = adapter
    x = _randn(64, 256)
    for recipe in backend.claims:
        if recipe.name not in EXACT[name]:
            continue
        ours, theirs = quantize_operand(x, recipe.x_row), backend.quantize(x, recipe.x_row)
        for field in dataclasses.fields(ours):
            value = getattr(ours, field.name)
            if isinstance(value, torch.Tensor) and field.name not in ("amax", "scale"):
                assert torch.equal(getattr(theirs, field.name), value), f"{recipe.name} {field.name}"


def test_values_are_the_dequantized_codes_in_the_input_dtype(adapter):
    """fake_quantize and quantize are the library's two paths; on float32 normal data they
    give one set of values (up to the float32 order of the dequantization)."""
    _, backend, _ = adapter
    x = _randn(16, 128)
    for recipe in backend.claims:
        values = backend.fake_quantize(x, recipe.x_row)
        assert values.dtype == x.dtype and values.shape == x.shape
        torch.testing.assert_close(values, backend.quantize(x, recipe.x_row).dequantize(), rtol=2**-22, atol=0)


def test_dequantize_reads_the_librarys_own_export_back(adapter):
    """dequantize (the library's decompression of codes in mxcheck's layout) gives the
    library's own values back, in bfloat16: the codes, scales and per-tensor factor reach it
    in the fields its checkpoints hold (a nibble order or a decode / encode factor mixed up
    moves values)."""
    _, backend, _ = adapter
    x = _randn(16, 128)
    for recipe in backend.claims:
        values = backend.dequantize(backend.quantize(x, recipe.x_row), recipe.x_row)
        assert torch.equal(values.bfloat16(), backend.fake_quantize(x, recipe.x_row).bfloat16()), recipe.name


def test_compressed_tensors_nvfp4_drops_the_tensor_scale_of_a_float16_tensor_below_0_041(monkeypatch):
    """compressed-tensors 0.20 generate_gparam divides 2688 by the amax in the tensor's dtype:
    in float16 it overflows below 2688 / 65504 = 0.041 and becomes 1.0, so a block whose amax
    is below 6 * 2^-10 has a block scale that underflows float8_e4m3fn and is zeroed. The
    adapter passes float16 through as the library computes it."""
    fake_compressed_tensors.install(monkeypatch)
    backend, spec = get("compressed_tensors"), get_recipe("nvfp4-1x16").x_row
    x = _randn(4, 64) / _randn(4, 64).abs().amax()
    assert backend.quantize((x * 0.03).half(), spec).tensor_scale.item() == 1.0
    assert backend.quantize((x * 0.045).half(), spec).tensor_scale.item() < 2e-5  # 0.045 / 2688
    assert not backend.fake_quantize((x * 0.004).half(), spec).any()
    assert backend.fake_quantize(x * 0.004, spec).count_nonzero() > 200  # float32: quantized, not lost


def test_modelopt_mxfp4_rounds_ties_toward_zero(monkeypatch):
    """MXFP4QTensor.quantize counts the bounds strictly below |x|: 0.75 (between codes 0.5 and
    1.0) becomes 0.5 where round-to-nearest-even gives 1.0."""
    fake_modelopt.install(monkeypatch)
    x = torch.zeros(1, 32)
    x[0, :2] = torch.tensor([6.0, 0.75])
    values = get("modelopt").fake_quantize(x, OperandSpec("e2m1", "mx", scale_rule="rceil"))
    assert values[0, :2].tolist() == [6.0, 0.5]
