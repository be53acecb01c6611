"""mxcheck.layouts and the AITER adapter against AITER's own torch functions (the amd-aiter
wheel, loaded on a CPU by :mod:`tests.fakes.aiter_wheel`); skipped when the wheel is absent."""

from __future__ import annotations

import pytest
import torch

import mxcheck
from mxcheck import layouts
from mxcheck.backends.aiter import AiterBackend
from mxcheck.packing import pack_fp4
from mxcheck.scaling.mx import mx_quantize
from tests.fakes import aiter_wheel
from tests.fakes import fake_aiter as fa

pytestmark = pytest.mark.emulated

WHEEL = aiter_wheel.load()
needs_wheel = pytest.mark.skipif(WHEEL is None, reason=aiter_wheel.MISSING)


def _bytes(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=gen, dtype=torch.int32).to(torch.uint8)


@needs_wheel
@pytest.mark.parametrize(("n", "k_bytes"), [(16, 32), (48, 96), (256, 128)])
def test_shuffle_weight_is_aiters(gen, n, k_bytes):
    w = _bytes(gen, n, k_bytes)
    theirs = WHEEL.shuffle_weight(w.view(torch.float4_e2m1fn_x2), layout=(16, 16)).view(torch.uint8)
    assert torch.equal(layouts.shuffle_weight(w), theirs)
    assert torch.equal(layouts.unshuffle_weight(theirs), w)


@needs_wheel
@pytest.mark.parametrize(("rows", "cols"), [(48, 2), (256, 8), (300, 12)])
def test_shuffle_scale_is_aiters_e8m0_shuffle_wherever_aiter_writes(gen, rows, cols):
    s = (1 + _bytes(gen, rows, cols) % 254).view(torch.float8_e8m0fnu)  # no 0: 0 marks padding below
    theirs = WHEEL.e8m0_shuffle(s).view(torch.uint8)
    ours = layouts.shuffle_scale(s.view(torch.uint8), pad_value=0)
    data = ours != 0  # where the data lands; AITER leaves the rest as torch.empty memory
    assert ours.shape == theirs.shape and int(data.sum()) == rows * cols
    assert torch.equal(ours[data], theirs[data])


@needs_wheel
def test_aiter_decodes_what_mxcheck_packs():
    codes = torch.arange(16, dtype=torch.uint8).repeat(2)  # every e2m1 code, both nibbles
    got = WHEEL.mxfp4_to_f32(pack_fp4(codes).view(torch.float4_e2m1fn_x2))
    assert torch.equal(got.view(torch.int32), mxcheck.decode(codes, "e2m1").view(torch.int32))
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    theirs = WHEEL.e8m0_to_f32(b.view(torch.float8_e8m0fnu)).double()
    assert torch.isnan(theirs[255]) and torch.equal(theirs[:255], 2.0 ** (b[:255].double() - 127))
    assert torch.equal(fa.e8m0(b)[:255], theirs[:255]) and torch.isnan(fa.e8m0(b)[255])  # the fake decodes alike


@needs_wheel
@pytest.mark.parametrize("k", [64, 384])
def test_aiter_adapter_with_aiters_own_shuffle_weight(monkeypatch, gen, k):
    aiter = fa.install(monkeypatch, version=WHEEL.version)
    monkeypatch.setattr(aiter.shuffle, "shuffle_weight", WHEEL.shuffle_weight)
    a, b = (mx_quantize(torch.randn(r, k, generator=gen), "e2m1", scale_rule="even") for r in (32, 48))
    want = (a.dequantize().double() @ b.dequantize().double().T).to(torch.bfloat16)
    got = AiterBackend().gemm(a, b)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
