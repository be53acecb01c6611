"""The fast float path of encode against the exact integer path, and MX's scale multiply
against an exact division by 2**e (STYLE 4: a plain path beside the clever one)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mxcheck
from mxcheck.formats import decode_table, encode_bits_float, encode_bits_int
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
