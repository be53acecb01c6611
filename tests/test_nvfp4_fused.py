"""NVFP4 on CUDA gives the CPU's bits: codes, ue4m3 block scales, amax and tensor scale.

On CUDA the quantize is two fused Triton passes (``mx_cuda.nvfp4_quantize_blocks``): the
global amax (after TE's RHT, where it is asked for), then per block the amax, the ue4m3 scale,
the encode scale and the element codes (RNE, or SR from uint8 bits). The
inputs place every e2m1 value, midpoint and their float32 neighbours exactly under power-of-two
encode scales (so the ties are hit), beside wide-range Gaussian blocks, zero blocks, -0.0 and
Inf. ``cuda`` tests run on a GPU; the ``emulated`` ones run the fused pass in Triton's
interpreter on a CPU (``TRITON_INTERPRET=1`` at start; skipped otherwise).
"""

from __future__ import annotations

import pytest
import torch

from mxcheck.formats import get_format
from mxcheck.scaling.nvfp4 import NVFP4Tensor, nvfp4_quantize
from tests.test_encode_paths import hard_points
from tests.test_mx_fused import interpreted  # noqa: F401  (a fixture)
from tests.test_nvfp4 import blocks_at_magnitudes

_E4M3_X_E2M1_MAX = 448 * 6


def nvfp4_inputs(gen: torch.Generator, with_inf: bool = False) -> torch.Tensor:
    """(144, 64) float32. The global amax is 2688 (one element), so the
    global encode scale is 1; a block whose amax is 6 * 2**k then gets the ue4m3 scale 2**k
    and the encode scale 2**-k, both exact, and its other 15 elements (e2m1 values,
    midpoints, neighbours, times 2**k) land exactly on their points. k covers ue4m3's range.
    Then Gaussian blocks over 2**-24..1, a zero tile, -0.0 and (``with_inf``) an Inf."""
    points = hard_points(get_format("e2m1"), gen)
    points = points[torch.isfinite(points)].clamp(-6.0, 6.0)
    rows = []
    for k in range(-9, 9):
        body = points[torch.randint(0, points.numel(), (16, 15), generator=gen)]
        body.view(-1)[: min(points.numel(), body.numel())] = points[: body.numel()]
        lead = torch.where(torch.rand(16, 1, generator=gen) < 0.5, -6.0, 6.0)
        rows.append((torch.cat([lead, body], dim=1).double() * 2.0**k).float())
    ties = torch.cat(rows).reshape(-1, 64)  # four blocks of 16 per row
    x = torch.cat([ties, blocks_at_magnitudes(gen, 72, 64, -24, 0)])  # 144 rows: 16x16 tiles
    x[0, 0] = _E4M3_X_E2M1_MAX
    x[-16:, :16] = 0.0
    x[-17, 3] = -0.0
    if with_inf:
        x[-18, 5] = float("inf")
    return x


def same_nvfp4(a, b) -> None:
    assert torch.equal(a.block_scales.cpu(), b.block_scales)
    assert torch.equal(a.codes.cpu(), b.codes)
    for f in ("amax", "tensor_scale"):
        assert torch.equal(getattr(a, f).cpu().view(torch.int32), getattr(b, f).view(torch.int32)), f


def test_the_inputs_hit_every_e2m1_tie(gen):
    # The premise, on the CPU path: in the tie rows each block's ue4m3 scale is its amax / 6,
    # a power of two, so its encode scale is exact and x * enc = x / (amax / 6) lands on
    # every e2m1 midpoint of both signs.
    from mxcheck.formats import decode_table

    x = nvfp4_inputs(gen)
    ties = x[:72].reshape(-1, 16)[1:]  # the first block holds the global amax instead
    q = nvfp4_quantize(x)
    block_scale = decode_table(get_format("ue4m3"), torch.device("cpu")).float()[q.block_scales.long()]
    unit = ties.abs().amax(-1, keepdim=True) / 6.0
    assert torch.equal(block_scale[:72].reshape(-1, 1)[1:], unit)
    assert bool((torch.frexp(unit).mantissa == 0.5).all())  # powers of two: exact quotients
    scaled = ties / unit
    for m in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
        assert bool((scaled == m).any()) and bool((scaled == -m).any()), m


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("hadamard", [None, "h16_te"])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
@pytest.mark.parametrize("block_2d", [False, True], ids=["1x16", "16x16"])
def test_nvfp4_on_cuda_equals_the_cpu(block_2d, rounding, hadamard, dtype, gen):
    pytest.importorskip("triton")
    x = nvfp4_inputs(gen, with_inf=hadamard is None).to(dtype)
    rand = torch.randint(0, 256, x.shape, generator=gen, dtype=torch.uint8) if rounding == "sr" else None
    want = nvfp4_quantize(x, block_2d=block_2d, hadamard=hadamard, rand=rand)
    got = nvfp4_quantize(x.cuda(), block_2d=block_2d, hadamard=hadamard, rand=None if rand is None else rand.cuda())
    same_nvfp4(got, want)


LAYOUTS = {
    "rows": lambda x: x,
    "transposed": lambda x: x.t().contiguous().t(),  # column-major: read in place, rows fastest
    "3d": lambda x: x.reshape(3, -1, x.shape[-1]),  # 48 rows a matrix: whole 16x16 tiles
}


@pytest.mark.emulated
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("hadamard", [None, "h16_te"])
@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
@pytest.mark.parametrize("block_2d", [False, True], ids=["1x16", "16x16"])
def test_nvfp4_fused_quantize_in_the_interpreter_equals_the_torch_path(block_2d, rounding, nan, hadamard, layout, gen,
                                                                        monkeypatch, interpreted):  # noqa: F811
    # The fused passes take the global amax (of the rotated tensor, with TE's RHT: signs,
    # butterflies, norm, bf16 output), then the ue4m3 block scales (as e4m3 codes of values
    # >= 0, the sign bit cleared) and the elements (RNE, or SR from the uint8 bits). A NaN
    # makes the global amax NaN: every block scale is the NaN code 0x7F, every element code 0.
    x = nvfp4_inputs(gen, with_inf=hadamard is None)  # float32: the interpreter mishandles bf16 subnormals
    if nan:
        x[5, 7] = -float("nan")
    x = LAYOUTS[layout](x)
    rand = torch.randint(0, 256, x.shape, generator=gen, dtype=torch.uint8) if rounding == "sr" else None
    monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
    want = nvfp4_quantize(x, block_2d=block_2d, rand=rand, hadamard=hadamard)
    if nan:  # the premise
        assert bool((want.block_scales == 0x7F).all()) and not bool(want.codes.any())
    if rounding == "sr" and not nan:  # the premise: SR moves codes that RNE would not
        assert not torch.equal(want.codes, nvfp4_quantize(x, block_2d=block_2d, hadamard=hadamard).codes)
    monkeypatch.setenv("MXCHECK_FUSED_MX", "1")
    same_nvfp4(nvfp4_quantize(x, block_2d=block_2d, rand=rand, hadamard=hadamard), want)


def every_code_pair() -> NVFP4Tensor:
    """Row r: 16 blocks under the ue4m3 scale code r (0..127, 127 the NaN), each block the
    16 e2m1 codes: every (element code, scale code) pair."""
    codes = torch.arange(16, dtype=torch.uint8).repeat(128, 16)
    scales = torch.arange(128, dtype=torch.uint8)[:, None].expand(128, 16).contiguous()
    return NVFP4Tensor(codes=codes, block_scales=scales, tensor_scale=torch.tensor(1.0), amax=torch.tensor(2688.0))


def same_bf16_values(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype == torch.bfloat16
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))  # -0.0 apart from +0.0


@pytest.mark.emulated
def test_nvfp4_fused_block_values_in_the_interpreter_equal_the_torch_path(interpreted):  # noqa: F811
    q = every_code_pair()
    want = q.block_values()
    assert torch.equal(want.bfloat16().float()[~torch.isnan(want)], want[~torch.isnan(want)])  # exact in bf16
    same_bf16_values(q.block_values(torch.bfloat16), want.bfloat16())


@pytest.mark.cuda
def test_nvfp4_block_values_on_cuda_equal_the_cpu():
    pytest.importorskip("triton")
    q = every_code_pair()
    gpu = NVFP4Tensor(codes=q.codes.cuda(), block_scales=q.block_scales.cuda(), tensor_scale=q.tensor_scale.cuda(),
                      amax=q.amax.cuda())
    same_bf16_values(gpu.block_values(torch.bfloat16).cpu(), q.block_values().bfloat16())


@pytest.mark.emulated
def test_nvfp4_sr_from_float32_uniforms_takes_the_torch_path_where_the_kernel_reads_bits(gen, monkeypatch,
                                                                                          interpreted):  # noqa: F811
    # The fused kernel reads SR's randomness as uint8 bits; float32 uniforms (which
    # nvfp4_quantize accepts too) must not reach it, or every u would be read as bits.
    x = nvfp4_inputs(gen)
    u = torch.rand(x.shape, generator=gen)
    monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
    want = nvfp4_quantize(x, rand=u)
    monkeypatch.setenv("MXCHECK_FUSED_MX", "1")
    same_nvfp4(nvfp4_quantize(x, rand=u), want)
