"""The fused Triton MX quantizer (``mxcheck.scaling.mx_cuda.quantize_blocks``) gives the torch
path's codes and scale bytes, bit for bit, on every code, tie and scale byte.

On CUDA (``-m cuda``) every format, scale rule and rounding is compared with the CPU torch
path, for float32, bf16 and fp16 inputs. On a CPU machine with Triton installed, a few cases
run in Triton's interpreter (``emulated``); without Triton they skip.
"""

from __future__ import annotations

import os

import pytest
import torch

import mxcheck
from mxcheck.formats import get_format
from mxcheck.hadamard import Hadamard
from mxcheck.scaling import mx_cuda
from mxcheck.scaling.mx import MX_ELEMENT_FORMATS
from tests.test_encode_paths import hard_points
from tests.test_mx import inf_blocks, varied_blocks

RULES = ("floor", "ceil", "even", "rceil")
ROUNDINGS = ("rne", "half_away", "trunc", "sr")


def fused_inputs(fmt: str, gen: torch.Generator, *, all_bf16: bool = True) -> torch.Tensor:
    """(R, 64) float32, R a multiple of 32: each format's values, midpoints and their
    neighbours in blocks whose amax is ``fmt.max`` times 2**k for k over the whole E8M0
    range (so every scale byte, 0 and the top ones included, carries ties); every bf16 bit pattern,
    in order (neighbouring magnitudes share a block) and shuffled (NaN, Inf, zero and
    subnormal blocks); the scale-rule edge cases of ``varied_blocks``; Inf and NaN blocks."""
    f = get_format(fmt)
    points = hard_points(f, gen)
    points = points[torch.isfinite(points)].clamp(-f.max, f.max)
    per_row = 63
    rows = -(-points.numel() // per_row)
    body = torch.zeros(rows * per_row)
    body[: points.numel()] = points
    block = torch.cat([torch.full((rows, 1), f.max), body.reshape(rows, per_row)], dim=1)
    exps = torch.arange(-140, 128, 4, dtype=torch.float64)
    # fmt.max * 2**k in float64, then float32: overflow to Inf and subnormals are intended
    scaled = (block.double()[None] * torch.exp2(exps)[:, None, None]).float().reshape(-1, 64)
    nan_block = torch.ones(1, 64)
    nan_block[0, 5] = float("nan")
    parts = [scaled, varied_blocks(gen), inf_blocks(), nan_block]
    if all_bf16:
        patterns = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
        perm = torch.randperm(patterns.numel(), generator=gen)
        parts += [patterns.reshape(-1, 64), patterns[perm].reshape(-1, 64)]
    x = torch.cat(parts)
    pad = -x.shape[0] % 32
    return torch.cat([x, torch.zeros(pad, 64)]) if pad else x


def _quantize(x, fmt, rule, rounding, block_2d, rand, **kw):
    return mxcheck.mx_quantize(x, fmt, scale_rule=rule, rounding=rounding, block_2d=block_2d, rand=rand, **kw)


def assert_fused_equals_torch_path(x: torch.Tensor, device: str, fmt: str, rule: str, rounding: str,
                                   block_2d: bool, gen: torch.Generator, **kw) -> None:
    rand = torch.randint(0, 256, x.shape, generator=gen, dtype=torch.uint8) if rounding == "sr" else None
    want = _quantize(x, fmt, rule, rounding, block_2d, rand, **kw)  # CPU: the torch path
    got = _quantize(x.to(device), fmt, rule, rounding, block_2d, None if rand is None else rand.to(device), **kw)
    codes, scales = got.codes.cpu(), got.scales.cpu()
    bad = (codes != want.codes).nonzero()
    assert not len(bad), (f"{len(bad)} of {codes.numel()} codes differ; first at {bad[0].tolist()}: "
                          f"x={x[tuple(bad[0])].item()!r} fused {codes[tuple(bad[0])]} torch "
                          f"{want.codes[tuple(bad[0])]} (byte {want.scales[bad[0][0], bad[0][1] // 32]})")
    assert torch.equal(scales, want.scales), f"{int((scales != want.scales).sum())} scale bytes differ"


def test_fused_inputs_hold_ties_byte_0_nan_and_the_top_bytes(gen):
    """The premise of the equivalence tests: their inputs hold RNE ties (codes where RNE and
    round-half-away differ), byte 0, NaN (255) and the top bytes, per format."""
    for fmt in MX_ELEMENT_FORMATS:
        x = fused_inputs(fmt, gen, all_bf16=False)
        rne, away = (mxcheck.mx_quantize(x, fmt, rounding=r) for r in ("rne", "half_away"))
        assert int((rne.codes != away.codes).sum()) > 100, fmt
        assert {0, 255} <= set(rne.scales.unique().tolist()), fmt
        # float32's top binade (2**127) over the element's emax: the largest finite amax's byte
        assert int(rne.scales[rne.scales < 255].max()) >= 127 + 127 - get_format(fmt).emax, fmt


# ------------------------------------------------------------------ CUDA: every case

@pytest.mark.cuda
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fmt", MX_ELEMENT_FORMATS)
def test_fused_quantize_equals_the_torch_path_for_every_scale_rule(fmt, rule, gen):
    pytest.importorskip("triton")
    assert_fused_equals_torch_path(fused_inputs(fmt, gen), "cuda", fmt, rule, "rne", False, gen)


@pytest.mark.cuda
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("fmt", MX_ELEMENT_FORMATS)
def test_fused_quantize_equals_the_torch_path_for_every_rounding(fmt, rounding, gen):
    pytest.importorskip("triton")
    assert_fused_equals_torch_path(fused_inputs(fmt, gen), "cuda", fmt, "even", rounding, False, gen)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("fmt", "rule", "block_2d"), [("e2m1", "even", True), ("e4m3", "rceil", False),
                                                       ("e2m3", "floor", True), ("e5m2fnuz", "ceil", False)])
def test_fused_quantize_equals_the_torch_path_for_16_bit_inputs_and_2d_tiles(fmt, rule, block_2d, dtype, gen):
    pytest.importorskip("triton")
    x = fused_inputs(fmt, gen).to(dtype)
    assert_fused_equals_torch_path(x, "cuda", fmt, rule, "rne", block_2d, gen)


# The recipes' rotations (mxfp4's h16x2 on the wgrad pair, mxfp6's h32 with its bf16 input
# rounding and zero byte 127), a 64-point one wider than a block, and one the kernel does not
# take (signs: the torch path rotates, the kernel encodes).
ROTATIONS = [("e2m1", "even", "rne", "h16x2", 0), ("e2m1", "even", "sr", "h16x2", 0),
             ("e2m3", "floor", "half_away", "h32", 127), ("e4m3", "rceil", "rne", Hadamard(64), 0),
             ("e2m1", "floor", "rne", "h16_te", 0)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("fmt", "rule", "rounding", "hadamard", "zero_scale"), ROTATIONS, ids=str)
def test_fused_quantize_with_a_rotation_equals_the_torch_path(fmt, rule, rounding, hadamard, zero_scale, dtype,
                                                               gen):
    pytest.importorskip("triton")
    x = fused_inputs(fmt, gen).to(dtype)
    assert_fused_equals_torch_path(x, "cuda", fmt, rule, rounding, False, gen, hadamard=hadamard,
                                   zero_scale=zero_scale)


# Operands the kernel reads in place through their strides: a transposed one (wgrad's and
# dgrad's column copies), rows of a wider tensor, a column slice; and a 3D one.
LAYOUTS = {
    "transposed": lambda x: x.t().contiguous().t(),
    "row_slice": lambda x: torch.cat([x, x], dim=1)[:, : x.shape[1]],
    "transposed_slice": lambda x: torch.cat([x, x]).t().contiguous().t()[: x.shape[0]],
    "3d": lambda x: x.reshape(2, -1, x.shape[1]),
}


@pytest.mark.cuda
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("fmt", "rule", "rounding", "hadamard"), [("e2m1", "even", "sr", "h16x2"),
                                                                   ("e4m3", "rceil", "rne", None),
                                                                   ("e4m3", "floor", "rne", Hadamard(64))], ids=str)
def test_fused_quantize_reads_strided_operands_in_place(fmt, rule, rounding, hadamard, layout, gen):
    pytest.importorskip("triton")
    x = fused_inputs(fmt, gen)
    rand = torch.randint(0, 256, x.shape, generator=gen, dtype=torch.uint8) if rounding == "sr" else None
    kw = dict(scale_rule=rule, rounding=rounding, hadamard=hadamard)
    strided = LAYOUTS[layout](x.cuda())
    # the premise: the same bits (NaN included) in another layout
    assert torch.equal(strided.cpu().view(torch.int32), LAYOUTS[layout](x).view(torch.int32))
    assert layout == "3d" or not strided.is_contiguous()
    want = mxcheck.mx_quantize(LAYOUTS[layout](x).contiguous(), fmt, rand=None if rand is None else
                               rand.reshape(strided.shape), **kw)
    got = mxcheck.mx_quantize(strided, fmt, rand=None if rand is None else rand.reshape(strided.shape).cuda(), **kw)
    assert torch.equal(got.scales.cpu(), want.scales)
    assert torch.equal(got.codes.cpu(), want.codes)


@pytest.mark.cuda
def test_fused_quantize_runs_on_cuda_and_can_be_switched_off(gen, monkeypatch):
    """The fast path is taken (quantize_blocks returns a result) and MXCHECK_FUSED_MX=0 turns
    it off, so a benchmark's A/B and the tests above compare two different paths."""
    pytest.importorskip("triton")
    x = torch.randn(64, 64, generator=gen).cuda()
    f = get_format("e2m1")
    args = dict(block_size=32, scale_rule="even", zero_scale=0, rounding="rne", u=None)
    assert mx_cuda.quantize_blocks(x, f, **args) is not None
    monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
    assert mx_cuda.quantize_blocks(x, f, **args) is None


# ------------------------------------------------------------------ CPU: Triton's interpreter

@pytest.fixture
def interpreted():
    """Triton's interpreter for the fused kernels on CPU tensors. Triton reads
    TRITON_INTERPRET when it is imported, so the run must start with it set
    (``TRITON_INTERPRET=1 pytest tests/test_mx_fused.py``); skips otherwise, and without Triton."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the fused kernels run on CPU only in Triton's interpreter: TRITON_INTERPRET=1 at start")
    pytest.importorskip("triton")
    return "cpu"


@pytest.mark.emulated
@pytest.mark.parametrize(("fmt", "rule", "rounding", "hadamard", "zero_scale"), ROTATIONS[:4], ids=str)
def test_fused_rotation_in_the_interpreter_equals_the_torch_path(fmt, rule, rounding, hadamard, zero_scale,
                                                                 interpreted, monkeypatch, gen):
    # bf16 values, no subnormals: the interpreter rounds float32 to bf16 its own way and
    # flushes bf16 subnormals (h32 rounds its input to bf16); the cuda tests take them all
    x = fused_inputs(fmt, gen, all_bf16=False).bfloat16().float()
    x[x.abs() < torch.finfo(torch.float32).tiny] = 0.0
    monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
    rand = torch.randint(0, 256, x.shape, generator=gen, dtype=torch.uint8) if rounding == "sr" else None
    kw = dict(scale_rule=rule, rounding=rounding, rand=rand, hadamard=hadamard, zero_scale=zero_scale)
    want = mxcheck.mx_quantize(x, fmt, **kw)
    monkeypatch.setenv("MXCHECK_FUSED_MX", "1")
    got = mxcheck.mx_quantize(x, fmt, **kw)
    assert torch.equal(got.scales, want.scales)
    bad = (got.codes != want.codes).nonzero()
    assert not len(bad), f"{len(bad)} codes differ; first at {bad[0].tolist()}"


@pytest.mark.emulated
@pytest.mark.parametrize(("fmt", "rule", "rounding", "block_2d"), [
    ("e2m1", "even", "rne", False), ("e4m3", "rceil", "rne", False), ("e2m3", "floor", "half_away", True),
    ("e5m2", "ceil", "sr", False), ("e4m3fnuz", "floor", "trunc", False)])
def test_fused_quantize_in_the_interpreter_equals_the_torch_path(fmt, rule, rounding, block_2d, interpreted,
                                                                  monkeypatch, gen):
    # float32 input only: the interpreter (numpy) widens bf16 subnormals wrongly, which the
    # GPU does not (the cuda tests above take every bf16 pattern).
    x = fused_inputs(fmt, gen, all_bf16=False)
    monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
    rand = torch.randint(0, 256, x.shape, generator=gen, dtype=torch.uint8) if rounding == "sr" else None
    want = _quantize(x, fmt, rule, rounding, block_2d, rand)
    monkeypatch.setenv("MXCHECK_FUSED_MX", "1")
    f = get_format(fmt)
    u = None if rand is None else rand.double() / 256
    kw = dict(block_size=32, scale_rule=rule, zero_scale=0, rounding=rounding, u=u)
    # 2D: the kernel's own tile amax, and the bytes given (its path for the cases it refuses)
    runs = [dict(block_2d=True), dict(scales=want.scales)] if block_2d else [{}]
    for run in runs:
        got = mx_cuda.quantize_blocks(x, f, **kw, **run)
        assert got is not None
        codes, got_scales = got
        # NaN blocks: mx_quantize writes the format's NaN code; so does the kernel
        assert torch.equal(got_scales, want.scales), run
        bad = (codes != want.codes).nonzero()
        assert not len(bad), f"{run}: {len(bad)} codes differ; first at {bad[0].tolist()}: x={x[tuple(bad[0])].item()!r}"


@pytest.mark.emulated
@pytest.mark.parametrize(("layout", "kw"), [*((layout, {}) for layout in LAYOUTS),
                                            ("transposed", {"hadamard": Hadamard(64)}),
                                            ("transposed", {"block_2d": True, "hadamard": "h16x2"})], ids=str)
def test_fused_quantize_in_the_interpreter_reads_strided_operands(layout, kw, interpreted, monkeypatch, gen):
    # a 64-point rotation spans two blocks of a row: a transposed operand is copied first,
    # since a program's blocks are then on consecutive rows
    x = fused_inputs("e4m3", gen, all_bf16=False)
    strided = LAYOUTS[layout](x)
    monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
    want = mxcheck.mx_quantize(strided.contiguous(), "e4m3", scale_rule="rceil", **kw)
    monkeypatch.setenv("MXCHECK_FUSED_MX", "1")
    got = mxcheck.mx_quantize(strided, "e4m3", scale_rule="rceil", **kw)
    assert torch.equal(got.scales, want.scales) and torch.equal(got.codes, want.codes)


@pytest.mark.emulated
@pytest.mark.parametrize("value", ["false", "off", "", "2"])
def test_an_unknown_fused_switch_value_is_an_error_naming_it(value, monkeypatch):
    monkeypatch.setenv("MXCHECK_FUSED_MX", value)
    with pytest.raises(ValueError, match=rf"MXCHECK_FUSED_MX={value!r}; expected '1'.*or '0'"):
        mx_cuda.fused_enabled()


@pytest.mark.emulated
@pytest.mark.parametrize(("value", "enabled"), [("0", False), ("1", True), (None, True)])
def test_the_fused_switch_takes_0_and_1_and_defaults_to_on(value, enabled, monkeypatch):
    if value is None:
        monkeypatch.delenv("MXCHECK_FUSED_MX", raising=False)
    else:
        monkeypatch.setenv("MXCHECK_FUSED_MX", value)
    assert mx_cuda.fused_enabled() is enabled


# The hardware's fp8 cast (encode_scaled's HW_CAST) rounds to nearest even and knows only the
# OCP e4m3 / e5m2 encodings; everything else must keep the software encode. The cuda tests
# above check its bits; this checks that it is taken where it should be (a silent switch-off
# would leave the bits right and the speed gone) and nowhere else.
HW_CAST_CASES = [("e4m3", "rne", False, True), ("e5m2", "rne", False, True), ("e4m3", "sr", False, False),
                 ("e5m2", "half_away", False, False), ("e4m3", "trunc", False, False),
                 ("e4m3fnuz", "rne", False, False), ("e5m2fnuz", "rne", False, False), ("e2m1", "rne", False, False),
                 ("e2m3", "rne", False, False), ("e3m2", "rne", False, False), ("e4m3", "rne", True, False)]


@pytest.mark.emulated
@pytest.mark.parametrize(("fmt", "rounding", "scales_given", "taken"), HW_CAST_CASES)
def test_the_hardware_fp8_cast_is_taken_for_ocp_e4m3_and_e5m2_under_rne_only(fmt, rounding, scales_given, taken,
                                                                              monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert mx_cuda._hw_cast(get_format(fmt), rounding, scales_given) is taken
    # Triton's interpreter does not round its fp8 cast to nearest even
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert mx_cuda._hw_cast(get_format(fmt), rounding, scales_given) is False
