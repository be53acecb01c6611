"""``mxcheck.__all__`` is DESIGN.md's public oracle API: each name the API block calls, plus
the types that block's results have and the Hadamard transforms its ``hadamard=`` takes."""

from __future__ import annotations

import pytest

import mxcheck

pytestmark = pytest.mark.emulated

# Called by name in DESIGN.md "Public oracle API".
DESIGN_CALLS = {"FORMATS", "get_format", "encode", "decode", "cast", "mx_quantize", "snr_db",
                "fp8_quantize", "DelayedScaling", "nvfp4_quantize"}
# What those calls return or take: FORMATS' values (DESIGN: "FloatFormat (frozen dataclass)"),
# q, f and n, and the rotation mx_quantize/nvfp4_quantize take as hadamard= (DESIGN's
# transforms layer); and the version a report records.
DESIGN_TYPES_AND_TRANSFORMS = {"FloatFormat", "MXTensor", "FP8Tensor", "NVFP4Tensor", "Hadamard",
                               "hadamard_matrix", "apply_hadamard", "__version__"}


def test_all_is_the_design_api_and_nothing_else() -> None:
    assert len(mxcheck.__all__) == len(set(mxcheck.__all__))
    assert set(mxcheck.__all__) == DESIGN_CALLS | DESIGN_TYPES_AND_TRANSFORMS


def test_every_public_name_resolves_to_what_the_api_says() -> None:
    q = mxcheck.mx_quantize(mxcheck.decode(mxcheck.encode(mxcheck.hadamard_matrix(32)[:2], "e4m3"), "e4m3"),
                            "e2m1", hadamard=mxcheck.Hadamard(32))
    f = mxcheck.fp8_quantize(q.dequantize(), "e4m3")
    n = mxcheck.nvfp4_quantize(q.dequantize())
    assert (type(q), type(f), type(n)) == (mxcheck.MXTensor, mxcheck.FP8Tensor, mxcheck.NVFP4Tensor)
    assert isinstance(mxcheck.FORMATS["e2m1"], mxcheck.FloatFormat)
    assert mxcheck.get_format("e2m1") is mxcheck.FORMATS["e2m1"]
