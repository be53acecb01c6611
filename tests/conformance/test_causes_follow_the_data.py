"""Causes follow the data (issue 42 item 4): a GEMM or linear failure whose operand
quantization differs on the same input names the quantizer's cause first, and no behaviour
of a path the backend does not have is ever named."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.conformance import CHECKS
from mxcheck.diagnose.linear import LinearCase, explain_linear
from mxcheck.functions import quant_linear
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import RECIPES

pytestmark = pytest.mark.emulated


def test_a_backend_without_a_linear_is_never_told_its_bias_is_dropped():
    # the kernel's output is exactly the reference Function's without the bias; a GEMM or
    # fake-quant backend cannot drop it (the reference Function adds it)
    recipe = RECIPES["mxfp8"]
    g = torch.Generator().manual_seed(4)
    x, w, b = torch.randn(32, 64, generator=g), torch.randn(32, 64, generator=g), torch.randn(32, generator=g)
    with torch.no_grad():
        without_bias = quant_linear(x, w, None, recipe)
    own = "\n".join(explain_linear(without_bias, LinearCase(recipe, x, w, b)))
    assert "the bias is dropped" in own  # the premise: with a linear of its own, that is the cause
    lines = "\n".join(explain_linear(without_bias, LinearCase(recipe, x, w, b, own_linear=False)))
    assert "the bias is dropped" not in lines and " are reproduced by: " not in lines
    assert "the backend has no linear of its own" in lines


class _TruncatingFakeQuant:
    """A fake-quant backend (no linear, no bias path) whose MX elements are truncated toward
    zero: its linear fails through the reference Function, and the quantize check names the
    truncation."""

    name = "fq-trunc"

    def fake_quantize(self, x, spec, *, state=None):
        truncating = replace(spec, rounding="trunc") if spec.scaling == "mx" else spec
        return quantize_operand(x, truncating).dequantize().to(x.dtype)


def test_a_linear_failure_names_its_operand_quantizers_cause_first():
    with pytest.raises(NumericsError) as info:
        CHECKS["linear"](_TruncatingFakeQuant(), RECIPES["mxfp8"], torch.Generator().manual_seed(0))
    head, *causes = str(info.value).splitlines()
    assert head.startswith("SNR ")
    assert causes[0].startswith("the backend's quantization of x_row differs from the oracle's on this input ("), causes
    assert causes[0].endswith("differing blocks are reproduced by: element codes truncated toward zero (seen in a cvt "
                              "with the rz suffix)"), causes[0]
    assert not any("the bias is dropped" in line for line in causes)
