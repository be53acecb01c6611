"""compressed-tensors' own bits (0.20.1; skipped where it is not installed)
against the catalogue behaviours that model it (tests/test_vocabulary_compressed_tensors.py
works the same bits out by hand). No witness import here: the library's venv has none."""

from __future__ import annotations

import pytest
import torch

from mxcheck.diagnose.failures import FAILURES
from mxcheck.gemm import quantize_operand
from mxcheck.profile_kinds import FP8Profile, NVFP4Profile
from mxcheck.recipes import get_recipe

pytestmark = pytest.mark.emulated

OVERFLOW = next(b for b in FAILURES if b.key == "mx_overflow_scale_byte_127")


def _draw(dtype: torch.dtype, amax: float, rows: int = 16, cols: int = 64) -> torch.Tensor:
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(7))
    return (x * (amax / x.abs().max())).to(dtype)


CT_NVFP4 = {"zero_sign": "negative_values", "element_scale": "divide_product", "underflow_block_scale": 0.125,
            "encode_factor": "input_dtype", "block_scale": "factor_times_input_quotient"}


def _library(module: str = "compressed_tensors", name: str = "compressed_tensors"):
    """The adapter of a library that is installed and available, else a skip."""
    pytest.importorskip(module)
    from mxcheck.backends import get

    backend = get(name)
    ok, why = backend.available()
    if not ok:
        pytest.skip(why)
    return backend


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:
        return torch.equal(a.float().view(torch.int32), b.float().view(torch.int32))
    return torch.equal(a, b)


@pytest.mark.parametrize(("dtype", "amax"), [(torch.bfloat16, 4.6), (torch.float16, 0.12), (torch.float16, 0.03),
                                             (torch.float32, 5.9e-36), (torch.float32, 0.7)])
def test_the_nvfp4_fields_reproduce_compressed_tensors_bits(dtype, amax):
    backend = _library()
    x = _draw(dtype, amax, 32, 128)
    got = backend.quantize(x, get_recipe("nvfp4-1x16").x_row)
    want = NVFP4Profile("ct", **CT_NVFP4).quantized(x)
    for field in ("codes", "block_scales", "tensor_scale"):
        assert _same(getattr(want, field), getattr(got, field)), field


@pytest.mark.parametrize(("dtype", "amax"), [(torch.bfloat16, 1.0), (torch.float16, 5.1e-3), (torch.float32, 4.6),
                                             (torch.float32, 1.4e-45)])
def test_the_fp8_input_quotient_reproduces_compressed_tensors_bits(dtype, amax):
    backend = _library()
    x = _draw(dtype, amax)
    got = backend.quantize(x, get_recipe("fp8-tensorwise").x_row)
    want = FP8Profile("ct", scale_arithmetic="input_quotient").quantized(x, "e4m3")
    assert _same(want.scale_inv, got.scale_inv) and _same(want.codes, got.codes)


@pytest.mark.parametrize(("dtype", "amax"), [(torch.bfloat16, 3.1e38), (torch.float16, 59000.0)])
def test_the_mx_overflow_failure_reproduces_compressed_tensors_bits(dtype, amax):
    backend = _library()
    recipe = get_recipe("mxfp4-1x32")
    x = _draw(dtype, amax, 8, 64)
    got = backend.quantize(x, recipe.x_row)
    oracle = quantize_operand(x, recipe.x_row)
    want = OVERFLOW.run(x, recipe.x_row, oracle)
    assert want is not None and not torch.equal(want.scales, oracle.scales)
    assert torch.equal(want.scales, got.scales) and torch.equal(want.codes, got.codes)




def test_zero_negative_reproduces_modelopt_mxfp4_bits():
    """ModelOpt (0.47.0) MXFP4QTensor.quantize: every exact zero gets code 0x8."""
    from mxcheck.profiles import Profile

    backend = _library("modelopt", "modelopt")
    recipe = next(r for r in backend.claims if r.name == "modelopt-mxfp4")
    x = _draw(torch.bfloat16, 4.6, 8, 64)
    x[:, ::3] = 0.0
    x[0] = 0.0
    got = backend.quantize(x, recipe.x_row)
    want = Profile("modelopt", scale_rule="rceil", exponent_source="log2_fp32", rounding="half_zero",
                   zero_sign="zero_negative").quantized(x, "e2m1")
    assert torch.equal(want.scales, got.scales) and torch.equal(want.codes, got.codes)
