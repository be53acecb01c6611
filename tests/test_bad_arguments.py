"""Bad arguments to the oracle API raise ValueError/TypeError naming the argument, the
value and what is accepted (review 2026-12-01, finding 8), never a silent default."""

from __future__ import annotations

import pytest
import torch

import mxcheck
from mxcheck.flux.quantize import quantize_model
from mxcheck.functions import quant_linear

pytestmark = pytest.mark.emulated

X = torch.ones(4, 32)


@pytest.mark.parametrize("saturate", ["no", None, 1, "False"])
def test_encode_refuses_a_saturate_that_is_not_a_bool(saturate):
    with pytest.raises(TypeError, match=rf"saturate={saturate!r}.*expected True or False"):
        mxcheck.encode(torch.tensor([1000.0]), "e4m3", saturate=saturate)


@pytest.mark.parametrize(("kw", "match"), [
    ({"block_2d": "yes"}, r"block_2d='yes'.*expected True or False"),
    ({"block_2d": 1}, r"block_2d=1.*expected True or False"),
    ({"zero_scale": True}, r"zero_scale=True.*E8M0 byte in \[0, 254\]"),
    ({"pad_to": True}, r"pad_to=True.*positive multiple of block_size"),
])
def test_mx_quantize_refuses_bools_and_non_bools_where_they_do_not_belong(kw, match):
    with pytest.raises(TypeError, match=match):
        mxcheck.mx_quantize(X, "e2m1", **kw)


@pytest.mark.parametrize(("kw", "match"), [
    ({"layer": None}, r"layer=None.*expected a str"),
    ({"gemm": "x"}, r"gemm='x'.*expected a callable"),
])
def test_quant_linear_names_the_bad_argument(kw, match):
    with pytest.raises(TypeError, match=match):
        quant_linear(torch.ones(4, 32), torch.ones(8, 32), None, "mxfp8", **kw)


def test_quant_linear_refuses_a_weight_that_is_not_a_tensor():
    with pytest.raises(TypeError, match=r"weight=None \(NoneType\); expected a torch.Tensor"):
        quant_linear(torch.ones(4, 32), None, None, "mxfp8")


def test_quantize_model_refuses_backend_none():
    model = torch.nn.Sequential(torch.nn.Linear(32, 32))
    with pytest.raises(TypeError, match=r"backend=None \(NoneType\).*expected a backend name \(one of \[.*'emulated'"):
        quantize_model(model, "mxfp8", backend=None)
