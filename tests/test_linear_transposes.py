"""A column copy taken as the transpose of its row copy is the same bits as quantizing the
transposed tensor (``mxcheck.gemm.transposed_operand``), and the linear takes that shortcut
only where it holds.

Tensorwise FP8 and square tiles (FP8 128x128, MX and NVFP4 2D tiles) reduce and encode the
same elements either way; row scales, 1D blocks along the other axis, a rotation, SR or a
padded axis do not, and there the shortcut must refuse.
"""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from mxcheck.functions import linear as linear_mod
from mxcheck.functions import quant_linear
from mxcheck.functions.linear import OperandQuantizer
from mxcheck.gemm import quantize_operand, transposed_operand
from mxcheck.recipes import RECIPES, OperandSpec
from mxcheck.scaling import mx_cuda
from mxcheck.scaling.mx import MX_ELEMENT_FORMATS
from tests.test_mx_fused import interpreted  # noqa: F401  (the fixture the interpreter tests use)

pytestmark = pytest.mark.emulated

SYMMETRIC = {
    **{f"fp8-tensor-{fmt}-{formula}": OperandSpec(fmt, "tensor", scale_formula=formula)
       for fmt in ("e4m3", "e5m2", "e4m3fnuz") for formula in ("te", "primus_turbo")},
    "fp8-tensor-pow2-margin": OperandSpec("e4m3", "tensor", power_of_2=True, margin=1),
    "fp8-block128x128": OperandSpec("e4m3", "block128x128", power_of_2=True),
    **{f"mx-2d-{fmt}-{rule}": OperandSpec(fmt, "mx", block_2d=True, scale_rule=rule)
       for fmt in MX_ELEMENT_FORMATS for rule in ("floor", "ceil", "even", "rceil")},
    "mx-2d-zero-scale-127-pad-128": OperandSpec("e2m3", "mx", block_2d=True, zero_scale=127, pad_to=128,
                                                rounding="half_away"),
    "mx-2d-block-16": OperandSpec("e2m1", "mx", block_2d=True, block_size=16, rounding="trunc"),
    "nvfp4-2d": OperandSpec("e2m1", "nvfp4", block_size=16, block_2d=True),
}


def tiled_input(gen: torch.Generator, rows: int = 256, cols: int = 384) -> torch.Tensor:
    """bf16 with magnitudes that vary over 2**+-40 by 16x16 tile and by row, one all-zero
    tile, one NaN, -0.0 and values past every format's max (the spots where a transposed
    scale or a transposed NaN block would differ)."""
    x = torch.randn(rows, cols, generator=gen)
    tile_exp = torch.randint(-40, 40, (rows // 16, cols // 16), generator=gen).repeat_interleave(16, 0)
    row_exp = torch.randint(-3, 4, (rows, 1), generator=gen)
    x = x * torch.exp2((tile_exp.repeat_interleave(16, 1) + row_exp).float())
    x[:32, 32:64] = 0.0
    x[40, 7] = -0.0
    x[100, 200] = 3.0e38
    return x.bfloat16()


def same(a, b) -> bool:
    """Equal fields, floats compared by their bits (NaN scales included)."""
    for f in fields(a):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if isinstance(va, torch.Tensor):
            if va.dtype.is_floating_point:
                as_int = torch.int32 if va.dtype == torch.float32 else torch.int16
                va, vb = va.view(as_int), vb.view(as_int)
            if va.shape != vb.shape or va.dtype != vb.dtype or not torch.equal(va, vb):
                return False
        elif va != vb:
            return False
    return True


@pytest.mark.parametrize("nan", [False, True], ids=["finite", "with-nan"])
@pytest.mark.parametrize("name", list(SYMMETRIC))
def test_a_symmetric_spec_transposes_to_the_bits_of_quantizing_the_transpose(name, nan, gen):
    spec = SYMMETRIC[name]
    x = tiled_input(gen)
    if nan:
        x[130, 77] = float("nan")
    q = quantize_operand(x, spec)
    got = transposed_operand(q, spec)
    assert got is not None, name
    assert same(got, quantize_operand(x.t().contiguous(), spec))


NOT_SYMMETRIC = {
    "fp8-row": OperandSpec("e4m3", "row"),
    "fp8-block1x128": OperandSpec("e4m3", "block1x128"),
    "mx-1d": OperandSpec("e4m3", "mx", scale_rule="rceil"),
    "mx-2d-hadamard": OperandSpec("e2m1", "mx", block_2d=True, hadamard="h16x2"),
    "mx-2d-padded": OperandSpec("e2m1", "mx", block_2d=True, pad_to=256),
    "mx-2d-padded-other-axis": OperandSpec("e2m1", "mx", block_2d=True, pad_to=256),
    "nvfp4-1d": OperandSpec("e2m1", "nvfp4", block_size=16),
}
# 256 x 384 but for the other axis: the 256 pad leaves x's columns alone and pads x.T's
SHAPES = {"mx-2d-padded-other-axis": (384, 256)}


@pytest.mark.parametrize("name", list(NOT_SYMMETRIC))
def test_an_asymmetric_spec_refuses_and_quantizing_the_transpose_would_differ(name, gen):
    spec = NOT_SYMMETRIC[name]
    x = tiled_input(gen, *SHAPES.get(name, (256, 384)))  # a 256 pad: x's columns are padded
    q = quantize_operand(x, spec)
    assert transposed_operand(q, spec) is None
    # the premise: the plain transpose of q's codes is not what quantizing x.T gives
    want = quantize_operand(x.t().contiguous(), spec)
    assert q.codes.t().shape != want.codes.shape or not torch.equal(q.codes.t(), want.codes)


def test_sr_and_delayed_specs_refuse(gen):
    x = tiled_input(gen)
    sr = OperandSpec("e2m1", "mx", block_2d=True, rounding="sr")
    rand = torch.randint(0, 256, x.shape, dtype=torch.uint8, generator=gen)
    assert transposed_operand(quantize_operand(x, sr, rand=rand), sr) is None
    tensor = OperandSpec("e4m3", "tensor")  # the same codes under another spec
    assert transposed_operand(quantize_operand(x, tensor), OperandSpec("e4m3", "delayed")) is None


# ------------------------------------------------------------------ the linear's shortcut

def _spy(monkeypatch) -> list[str]:
    """Names of the operands the linear took as transposes."""
    taken: list[str] = []
    real = linear_mod.transposed_operand

    def spy(q, spec):
        out = real(q, spec)
        if out is not None:
            taken.append(spec.scaling)
        return out

    monkeypatch.setattr(linear_mod, "transposed_operand", spy)
    return taken


# The copies each named recipe can take as transposes (square tiles or tensorwise FP8 with
# the same spec both ways).
EXPECTED_TRANSPOSES = {"fp8": 3, "fp8-hybrid": 3, "mxfp4": 1, "nvfp4": 1, "fp8-block": 1,
                       "mxfp4-fp8bwd": 1}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_the_linear_takes_the_shortcut_where_it_holds_and_gives_the_plain_bits(recipe, gen, monkeypatch):
    x = torch.randn(256, 512, generator=gen).bfloat16()
    w = (torch.randn(256, 512, generator=gen) * 512**-0.5).bfloat16()
    dy = (torch.randn(256, 256, generator=gen) * 1e-2).bfloat16()

    def grads(seed):
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = quant_linear(xx, ww, None, recipe, generator=torch.Generator().manual_seed(seed),
                         states=linear_mod.make_delayed_states(recipe))
        y.backward(dy)
        return y, xx.grad, ww.grad

    taken = _spy(monkeypatch)
    fast = grads(3)
    assert len(taken) == EXPECTED_TRANSPOSES.get(recipe, 0)
    monkeypatch.setattr(linear_mod, "transposed_operand", lambda q, spec: None)
    plain = grads(3)
    for a, b in zip(fast, plain, strict=True):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_a_tensor_changed_in_place_or_another_storage_is_quantized_again(gen, monkeypatch):
    spec = RECIPES["fp8"].x_col
    x = torch.randn(128, 256, generator=gen).bfloat16()
    q = OperandQuantizer(RECIPES["fp8"], "layer", None, None)
    taken = _spy(monkeypatch)
    q("x_row", x)
    x.mul_(4.0)  # a new version: the row copy's bits are stale
    assert same(q("x_col", x.t()), quantize_operand(x.t().contiguous(), spec))
    q("x_row", x)
    q("x_col", x.clone().t())  # the same values in another storage
    assert taken == []
    q("x_row", x)
    q("x_col", x.t())  # the premise: unchanged and the same storage, it is taken
    assert taken == ["tensor"]


# ------------------------------------------------------------------ the tiled byte transpose

TRANSPOSE_SHAPES = [(1, 1), (64, 64), (100, 37), (130, 300), (0, 5)]


def _assert_tiled_transpose(device: str, gen: torch.Generator) -> None:
    for shape in TRANSPOSE_SHAPES:
        codes = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8).to(device)
        got = mx_cuda.transposed_codes(codes)
        assert got is not None, shape
        assert got.is_contiguous() and torch.equal(got.cpu(), codes.cpu().t()), shape


@pytest.mark.emulated
@pytest.mark.usefixtures("interpreted")
def test_the_tiled_byte_transpose_in_the_interpreter_is_torchs(gen):
    _assert_tiled_transpose("cpu", gen)


@pytest.mark.cuda
def test_the_tiled_byte_transpose_on_cuda_is_torchs(gen):
    pytest.importorskip("triton")
    _assert_tiled_transpose("cuda", gen)
