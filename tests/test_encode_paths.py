"""The fast float path of encode against the exact integer path, and MX's scale multiply
against an exact division by 2**e (STYLE 4: a plain path beside the clever one)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mxcheck
from mxcheck.formats import decode_table, encode_bits_float, encode_bits_int
from mxcheck.scaling import blocks
from mxcheck.scaling.blocks import block_amax
from mxcheck.scaling.mx import MX_ELEMENT_FORMATS, mx_quantize

pytestmark = pytest.mark.emulated

FAST_FORMATS = [f for f in mxcheck.FORMATS.values() if f.signed and f.bits <= 8]
ROUNDINGS = ("rne", "half_away", "trunc", "sr")


def hard_points(fmt, gen: torch.Generator) -> torch.Tensor:
    """Every value, every midpoint and its float32 neighbours, specials, random data."""
    values = decode_table(fmt)
    values = torch.unique(values[torch.isfinite(values)])
    mids = ((values[1:] + values[:-1]) / 2).float()
    specials = torch.tensor([math.inf, -math.inf, math.nan, -math.nan, 3.0e38, 1e-45, -0.0, 0.0,
                             torch.finfo(torch.float32).tiny, fmt.max * 1.0001, -fmt.max * 3])
    return torch.cat([
        values.float(), -values.float(), mids, -mids,
        torch.nextafter(mids, torch.full_like(mids, math.inf)),
        torch.nextafter(mids, torch.full_like(mids, -math.inf)),
        specials,
        torch.randn(4000, generator=gen) * fmt.max / 3,
        torch.randn(1000, generator=gen) * fmt.min_subnormal,
    ])


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("fmt", FAST_FORMATS, ids=str)
def test_float_path_equals_integer_path(fmt, rounding, gen):
    x = hard_points(fmt, gen)
    u = torch.randint(0, 256, x.shape, generator=gen).double() / 256 if rounding == "sr" else None
    fast = encode_bits_float(x, fmt, rounding, u)
    exact = encode_bits_int(x, fmt, rounding, True, u)
    diff = (fast != exact).nonzero().flatten()
    assert not len(diff), f"{len(diff)} differ, first x={x[diff[0]].item()!r}: {fast[diff[0]]} vs {exact[diff[0]]}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_float_path_takes_16_bit_inputs_as_their_float32_values(dtype, gen):
    x = (torch.randn(5000, generator=gen) * 100).to(dtype)
    for fmt in FAST_FORMATS:
        assert torch.equal(encode_bits_float(x, fmt), encode_bits_int(x.float(), fmt))


@pytest.mark.parametrize("rounding", ("rne", "half_away", "sr"))
@pytest.mark.parametrize("fmt", MX_ELEMENT_FORMATS)
def test_mx_scale_multiply_equals_exact_division_by_the_scale(fmt, rounding, gen):
    # Blocks whose small elements land in float32 subnormals after scaling, tiny blocks
    # (scale byte 0), huge blocks (byte 254) and ordinary ones.
    rows = [torch.randn(32, generator=gen) * 2.0 ** k for k in (-140, -127, -100, 0, 60, 126)]
    wide = torch.randn(32, generator=gen)
    wide[::2] *= 2.0**-120
    rows += [wide, wide * 2.0**100]
    x = torch.stack(rows)
    x[0] = x[0].clamp(-1e-38, 1e-38)
    rand = torch.rand(x.shape, generator=gen) if rounding == "sr" else None
    q = mx_quantize(x, fmt, rounding=rounding, rand=rand)
    exps = (q.scales.to(torch.int32) - 127).repeat_interleave(32, dim=-1)
    u = None if rand is None else rand.double()
    exact = encode_bits_int(x, mxcheck.get_format(fmt), rounding, True, u, scale_exp=exps)
    assert torch.equal(q.codes, exact)


def test_integer_path_divides_a_float32_subnormal_by_its_scale_exactly():
    # 2^-140 / 2^-142 = 4: the source is a float32 subnormal, the result is normal.
    x = torch.tensor([2.0**-140], dtype=torch.float32)
    code = encode_bits_int(x, mxcheck.get_format("e2m1"), "rne", True, None, scale_exp=torch.tensor([-142]))
    assert code.item() == 0x6  # e2m1 4.0
    assert np.float32(2.0**-140) != 0  # the premise: representable as a subnormal


# ---- row chunks (CPU): every quantizer's elementwise passes run on chunks of rows, so their
# temporaries stay small; the bits must be those of one pass over the whole tensor.


def _grid_rows(fmt, width: int, exponents: range, dtype=torch.float32) -> torch.Tensor:
    """One row of every finite value, midpoint and midpoint neighbour of fmt (then Inf and
    NaN, which share only the last block), scaled by 2**k for each k: every code and tie
    under every E8M0 byte that the scale rule can reach, float32 underflow and overflow."""
    values = decode_table(fmt)
    values = torch.unique(values[torch.isfinite(values)])
    mids = (values[1:] + values[:-1]) / 2
    row = torch.cat([values, -values, mids, -mids, torch.nextafter(mids, torch.full_like(mids, math.inf)),
                     torch.nextafter(mids, torch.full_like(mids, -math.inf))]).float()
    row = torch.cat([row, torch.zeros(-(row.numel() + 4) % width), torch.tensor([math.inf, -math.inf, 0.0, math.nan])])
    return torch.stack([row * 2.0**k for k in exponents]).to(dtype)


def _whole_and_chunked(monkeypatch, fn):
    """fn() with one chunk, and with chunks of 4096 elements (several rows, a short last one)."""
    monkeypatch.setattr(blocks, "CPU_CHUNK_ELEMENTS", 1 << 40)
    whole = fn()
    monkeypatch.setattr(blocks, "CPU_CHUNK_ELEMENTS", 4096)
    assert len(blocks.chunk_rows(torch.empty(256, 4096))) > 1  # the premise: it does chunk
    return whole, fn()


def _assert_same_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.dtype.is_floating_point:
        a, b = (t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()]) for t in (a, b))
    diff = (a != b).nonzero()
    assert not len(diff), f"{what}: {len(diff)} differ, first at {diff[0].tolist()}"


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("fmt", MX_ELEMENT_FORMATS)
def test_mx_quantize_in_row_chunks_equals_one_pass(fmt, rounding, monkeypatch, gen):
    f = mxcheck.get_format(fmt)
    x = _grid_rows(f, 32, range(-160, 131))
    rand = torch.randint(0, 256, x.shape, dtype=torch.uint8, generator=gen) if rounding == "sr" else None
    block_2d = rounding == "trunc"  # 2D tiles once per format: the scales are per row either way
    x = x[: x.shape[0] // 32 * 32] if block_2d else x
    rand = None if rand is None else rand[: x.shape[0]]
    whole, chunked = _whole_and_chunked(monkeypatch, lambda: mx_quantize(
        x, fmt, scale_rule="even", rounding=rounding, rand=rand, block_2d=block_2d))
    # the premise: every byte from 16 to the highest a float32 amax reaches (127 + 127 - emax), and NaN
    if not block_2d:  # (a tile's 32 rows share the largest row's byte)
        assert set(whole.scales.unique().tolist()) >= set(range(16, 255 - f.emax)) | {255}
    for name in ("codes", "scales"):
        _assert_same_bits(getattr(whole, name), getattr(chunked, name), f"{fmt} {rounding} {name}")
    _assert_same_bits(whole.dequantize(), chunked.dequantize(), f"{fmt} {rounding} dequantize")


@pytest.mark.parametrize("hadamard", ["h32", "h16x2"])
def test_mx_rotation_in_row_chunks_equals_one_pass(hadamard, monkeypatch, gen):
    x = (torch.randn(96, 4096, generator=gen) * torch.exp2(torch.randint(-30, 30, (96, 1), generator=gen))).bfloat16()
    whole, chunked = _whole_and_chunked(monkeypatch, lambda: mx_quantize(
        x, "e2m3", rounding="half_away", hadamard=hadamard, zero_scale=127, pad_to=4224))
    _assert_same_bits(whole.codes, chunked.codes, "codes")
    _assert_same_bits(whole.scales, chunked.scales, "scales")


@pytest.mark.parametrize("granularity", ["tensor", "row", "block1x128", "block128x128"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz"])
def test_fp8_quantize_in_row_chunks_equals_one_pass(fmt, granularity, monkeypatch):
    x = _grid_rows(mxcheck.get_format(fmt), 128, range(-140, 116))  # 256 rows
    whole, chunked = _whole_and_chunked(monkeypatch, lambda: mxcheck.fp8_quantize(x, fmt, granularity=granularity))
    _assert_same_bits(whole.codes, chunked.codes, "codes")
    _assert_same_bits(whole.dequantize(), chunked.dequantize(), "dequantize")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("block_2d", "hadamard", "sr"), [(False, None, False), (True, None, True),
                                                        (False, "h16_te", True)])
def test_nvfp4_quantize_in_row_chunks_equals_one_pass(block_2d, hadamard, sr, dtype, monkeypatch, gen):
    # a NaN or Inf would make every scale NaN; 2**-24 .. 2**7 spans the ue4m3 scales
    grid = torch.nan_to_num(_grid_rows(mxcheck.get_format("e2m1"), 16, range(-24, 8)), nan=1.0,
                            posinf=7.0, neginf=-7.0)
    spread = torch.randn(32, grid.shape[1], generator=gen) * torch.exp2(torch.randint(-10, 10, (32, grid.shape[1]), generator=gen))
    x = torch.cat([grid, spread]).to(dtype)
    rand = torch.randint(0, 256, x.shape, dtype=torch.uint8, generator=gen) if sr else None
    whole, chunked = _whole_and_chunked(monkeypatch, lambda: mxcheck.nvfp4_quantize(
        x, block_2d=block_2d, hadamard=hadamard, rand=rand))
    if not block_2d:  # the premise: many of the 127 ue4m3 codes occur (a tile shares one)
        assert len(whole.block_scales.unique()) >= 60
    for name in ("codes", "block_scales", "amax"):
        _assert_same_bits(getattr(whole, name), getattr(chunked, name), name)
    _assert_same_bits(whole.dequantize(), chunked.dequantize(), "dequantize")


@pytest.mark.parametrize("rows", [1, 32, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_block_amax_from_row_minmax_equals_amax_of_abs(rows, dtype, gen):
    # The CPU reduction takes max(hi, -lo) per 1D block, then the max over a tile's rows;
    # the plain one is amax |x| over the tile. Zero tiles of either sign, Inf, NaN blocks.
    x = (torch.randn(256, 512, generator=gen) * torch.exp2(torch.randint(-60, 60, (256, 512), generator=gen))).to(dtype)
    x[:128, :128] = -0.0
    x[128:, :64] = 0.0
    x[5, 200], x[7, 300], x[200, 400], x[201, 401] = math.inf, -math.inf, math.nan, -math.nan
    got = block_amax(x, rows, 32)
    plain = x.abs().reshape(256 // rows, rows, 512 // 32, 32).amax(dim=(1, 3)).float()
    assert torch.equal(got.isnan(), plain.isnan()) and bool(got.isnan().any())
    keep = ~plain.isnan()
    assert torch.equal(got[keep], plain[keep])
    if rows > 1:  # tiles: +0 too, as |x| gives (1D blocks keep the -0 that max(hi, -lo) may give)
        _assert_same_bits(got[keep], plain[keep], f"block_amax rows={rows}")
