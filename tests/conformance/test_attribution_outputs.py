"""A failing GEMM or linear check names the known behaviour that reproduces the kernel's output,
and only that one; a passing check runs no attribution."""

from __future__ import annotations

import re

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.conformance import CHECKS
from mxcheck.diagnose.linear import LINEAR_BEHAVIOURS
from mxcheck.diagnose.outputs import GEMM_BEHAVIOURS
from mxcheck.diagnose.shapes import shape_patterns
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import RECIPES

pytestmark = pytest.mark.emulated

BEHAVIOURS = {b.key: b for b in (*GEMM_BEHAVIOURS, *LINEAR_BEHAVIOURS)}
def _failure(backend, recipe: str, check: str) -> str:
    with pytest.raises(NumericsError) as info:
        CHECKS[check](backend, RECIPES[recipe], torch.Generator().manual_seed(0))
    return str(info.value)


class _Garbage(EmulatedBackend):
    """The oracle's GEMM output times 1e3: no known behaviour gives it."""

    name = "garbage"

    def gemm(self, a, b, **kw):
        return super().gemm(a, b, **kw) * 1e3


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8"])
def test_garbage_is_reproduced_by_no_known_behaviour(recipe):
    message = _failure(_Garbage(), recipe, "gemm")
    assert "65,536 of 65,536 differing outputs are reproduced by no known behaviour" in message, message
    assert not [b.title for b in BEHAVIOURS.values() if b.title in message], message


class _RowDoubled(EmulatedBackend):
    """The oracle's GEMM with output row 5 doubled."""

    name = "row-doubled"

    def gemm(self, a, b, **kw):
        out = super().gemm(a, b, **kw)
        out[5] *= 2
        return out


def test_the_message_shows_where_the_bad_outputs_are_and_their_operands_scales():
    message = _failure(_RowDoubled(), "mxfp8", "gemm")
    head, first, a_row, b_row = message.splitlines()[:4]
    assert "in 1 of 256 rows (1 wholly) and 256 of 256 columns (0 wholly)" in head, head
    assert re.match(r"  output \(row 5, col 0\): got .*, exact .*, error .*, bound .*, error/bound \d", first), first
    # the E8M0 bytes of the oracle's a row 5 and b row 0 (check_gemm's inputs: seed 0)
    from mxcheck.conformance.basic import _inputs

    x, w, _, _ = _inputs(torch.Generator().manual_seed(0), "cpu", RECIPES["mxfp8"])
    a, b = (quantize_operand(t, s) for t, s in ((x, RECIPES["mxfp8"].x_row), (w, RECIPES["mxfp8"].w_row)))
    for line, row in ((a_row, a.scales[5]), (b_row, b.scales[0])):
        shown = re.findall(r"([0-9a-f]{2})=2\^(-?\d+)", line)
        assert "first 8 of 16 blocks" in line, line
        assert [(int(h, 16), int(e)) for h, e in shown] == [(s, s - 127) for s in row[:8].tolist()], line
    assert "differing outputs are reproduced by no known behaviour" in message, message


def test_a_passing_check_runs_no_attribution(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("attribution ran on a passing check")
    for where, name in (("mxcheck.conformance._common", "gemm_mismatch"),
                        ("mxcheck.diagnose.outputs", "explain_gemm"),
                        ("mxcheck.conformance.basic", "explain_linear"),
                        ("mxcheck.conformance.edges", "shape_patterns")):
        monkeypatch.setattr(f"{where}.{name}", boom)
    # the checks the seeded bugs above fail, on the recipes the cheapest of them run on
    for recipe, check in (("mxfp4", "gemm"), ("fp8", "linear"), ("fp8", "nan"), ("mxfp8", "weight_change"),
                          ("mxfp4", "edge_shapes")):
        assert CHECKS[check](EmulatedBackend(), RECIPES[recipe], torch.Generator().manual_seed(0)) is None, check


def test_a_shape_pattern_is_stated_only_where_it_splits_every_shape_run():
    def shapes(*ks):
        return {f"K{k}": {"M": 32, "N": 64, "K": k} for k in ks}
    # K 40 and 48 fail, 128 and 256 pass: K % 32, % 64 and % 128 all split them
    assert shape_patterns(shapes(40, 48), shapes(128, 256)) == [
        "fails at every shape with K % 32 != 0 and at no shape with K % 32 == 0 (as for K % 64, K % 128: "
        "the shapes run do not tell them apart)"]
    assert shape_patterns(shapes(40, 256), shapes(128)) == []  # a failing 256 breaks every K pattern
    assert shape_patterns(shapes(48), shapes(128, 96)) == ["fails at every shape with K % 32 != 0 and at no shape "
                                                           "with K % 32 == 0"]
    assert shape_patterns(shapes(40), {}) == []  # no correct shape: nothing is separated


def test_the_scale_a_kernel_that_ignores_scales_reads_is_one():
    import ml_dtypes  # the witness: its decoding of the E8M0 and ue4m3 bytes
    import numpy as np

    from mxcheck.diagnose.outputs import _SCALES
    from mxcheck.scaling import FP8Tensor, MXTensor, NVFP4Tensor

    for kind, dtype in ((MXTensor, ml_dtypes.float8_e8m0fnu), (NVFP4Tensor, ml_dtypes.float8_e4m3fn)):
        assert float(np.array([_SCALES[kind][1]], np.uint8).view(dtype)[0]) == 1.0, kind
    assert _SCALES[FP8Tensor][1] == 1.0  # scale_inv is a float32 multiplier
