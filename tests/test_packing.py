"""mxcheck.packing against torchao's and PyTorch's fp4 packers, Python-int bit strings,
and hand-worked bytes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import mxcheck
from mxcheck.packing import (
    pack_codes,
    pack_fp4,
    pack_fp6,
    unpack_codes,
    unpack_fp4,
    unpack_fp6,
)
from mxcheck.plugin import needs

pytestmark = pytest.mark.emulated

WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8)
# (codes, bytes) per whole-byte group, worked out by hand: lcm(bits, 8) bits per group.
GROUPS = {1: (8, 1), 2: (4, 1), 3: (8, 3), 4: (2, 1), 5: (8, 5), 6: (4, 3), 7: (8, 7), 8: (1, 1)}


def random_codes(gen: torch.Generator, bits: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, 1 << bits, shape, generator=gen, dtype=torch.uint8)


def python_int_pack(row: list[int], bits: int) -> bytes:
    """The witness: one little-endian Python integer holding code i at bit i * bits."""
    word = sum(c << (bits * i) for i, c in enumerate(row))
    return word.to_bytes(len(row) * bits // 8, "little")


# ---------------------------------------------------------------------------------------
# fp4: two codes per byte, element 0 in the low nibble


def test_fp4_pack_matches_torchao_pinned_example():
    # torchao test/prototype/mx_formats/test_kernels.py::test_fp4_pack_unpack pins
    # [0.0, 0.5, 4.0, -0.0] -> [0b00010000, 0b10000110] (research/reference_emulators.md section 4).
    codes = mxcheck.encode(torch.tensor([0.0, 0.5, 4.0, -0.0]), "e2m1")
    assert codes.tolist() == [0x0, 0x1, 0x6, 0x8]
    assert pack_fp4(codes).tolist() == [0b00010000, 0b10000110]
    assert unpack_fp4(torch.tensor([0b00010000, 0b10000110], dtype=torch.uint8)).tolist() == [0, 1, 6, 8]


def test_fp4_pack_is_byte_identical_to_torchao_pack_uint4(gen):
    with needs("torchao"):
        from torchao.prototype.mx_formats.kernels import pack_uint4, unpack_uint4

    codes = random_codes(gen, 4, 6, 64)
    packed = pack_fp4(codes)
    assert torch.equal(packed, pack_uint4(codes))
    assert torch.equal(unpack_fp4(packed), unpack_uint4(pack_uint4(codes)))


def test_fp4_pack_is_byte_identical_to_torchao_to_mx_float4_e2m1fn_x2(gen):
    # torchao's to_mx(x, torch.float4_e2m1fn_x2) is what fills the bytes torchao later views
    # as torch.float4_e2m1fn_x2 for _scaled_mm. PyTorch's dtype is a bit container without
    # casts ("val1 : val0 - bits 7654 : 3210", torch/headeronly/util/Float4_e2m1fn_x2.h),
    # so a torch-side producer is only its test helper, which needs expecttest.
    with needs("torchao"):
        from torchao.prototype.mx_formats.mx_tensor import to_mx

    x = (torch.randn(4, 64, generator=gen) * 3).clamp(-6.0, 6.0)
    x[..., ::32] = 6.0  # every block's amax is 6, so torchao's FLOOR scale is 2^0 (byte 127)
    x[0, 1:9] = torch.tensor([0.0, -0.0, 0.25, 0.75, 5.0, 2.5, -1.25, 3.5])  # ties and zeros
    scale, data = to_mx(x, torch.float4_e2m1fn_x2, 32)
    assert scale.view(torch.uint8).unique().tolist() == [127]
    ours = pack_fp4(mxcheck.encode(x, "e2m1"))
    assert torch.equal(ours, data.view(torch.uint8))
    fp4x2 = ours.view(torch.float4_e2m1fn_x2)  # one x2 element per byte: 2 codes each
    assert fp4x2.shape == (4, 32)
    assert torch.equal(fp4x2.view(torch.uint8), ours)


# ---------------------------------------------------------------------------------------
# fp6: four codes in three bytes, least significant bits first


def test_fp6_pack_hand_worked_example():
    # a, b, c, d = 0b101011, 0b110010, 0b011101, 0b100110 (the codes of the example in
    # research/reference_emulators.md section 4), worked by hand:
    #   b0 = a | b << 6        = 10|101011   (b's low bits 10 above all of a)
    #   b1 = b >> 2 | c << 4   = 1101|1100   (c's low bits 1101 above b's high bits 1100)
    #   b2 = c >> 4 | d << 2   = 100110|01   (d above c's high bits 01)
    # torchao's removed Triton layout gave 10101100 01111001 11100110 for the same codes,
    # its pack_uint6_pytorch helper 10101100 10010111 11101001: neither is this layout.
    codes = torch.tensor([0b101011, 0b110010, 0b011101, 0b100110], dtype=torch.uint8)
    expected = [0b10101011, 0b11011100, 0b10011001]
    assert pack_fp6(codes).tolist() == expected
    assert unpack_fp6(torch.tensor(expected, dtype=torch.uint8)).tolist() == codes.tolist()


def test_fp6_pack_of_max_and_zero_codes():
    # 0x3F in slot 1 only: bits 6..11 set -> b0 = 0b11000000, b1 = 0b00001111, b2 = 0.
    codes = torch.tensor([0, 0x3F, 0, 0], dtype=torch.uint8)
    assert pack_fp6(codes).tolist() == [0b11000000, 0b00001111, 0b00000000]
    # 0x3F in slot 3 only: bits 18..23 -> b2 = 0b11111100.
    codes = torch.tensor([0, 0, 0, 0x3F], dtype=torch.uint8)
    assert pack_fp6(codes).tolist() == [0, 0, 0b11111100]


def test_fp6_pack_of_quantized_values_hand_worked():
    # e2m3: 1.0 = 0b001000, -7.5 = 0b111111, 0.125 = 0b000001, -0.0 = 0b100000
    # b0 = 001000 with 11 on top = 0b11001000; b1 = 1111 with 0001 on top = 0b00011111;
    # b2 = 00 with 100000 on top = 0b10000000.
    codes = mxcheck.encode(torch.tensor([1.0, -7.5, 0.125, -0.0]), "e2m3")
    assert codes.tolist() == [0b001000, 0b111111, 0b000001, 0b100000]
    assert pack_fp6(codes).tolist() == [0b11001000, 0b00011111, 0b10000000]


# ---------------------------------------------------------------------------------------
# every width against a Python-int bit string


@pytest.mark.parametrize("bits", WIDTHS)
def test_pack_equals_python_int_bit_string(bits, gen):
    n_codes, n_bytes = GROUPS[bits]
    codes = random_codes(gen, bits, 5, 3 * n_codes)
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.shape == (5, 3 * n_bytes)
    for row, prow in zip(codes.tolist(), packed.tolist(), strict=True):
        assert bytes(prow) == python_int_pack(row, bits)


def test_pack_8_bits_is_identity(gen):
    codes = random_codes(gen, 8, 3, 7)
    assert torch.equal(pack_codes(codes, 8), codes)
    assert torch.equal(unpack_codes(codes, 8), codes)


@pytest.mark.parametrize("bits", [4, 6])
def test_pack_keeps_leading_dims_and_accepts_non_contiguous(bits, gen):
    codes = random_codes(gen, bits, 8, 3, 4).transpose(0, 2)  # (4, 3, 8), non-contiguous
    assert not codes.is_contiguous()
    packed = pack_codes(codes, bits)
    assert packed.shape == (4, 3, 8 * bits // 8)
    assert torch.equal(packed, pack_codes(codes.contiguous(), bits))
    assert torch.equal(unpack_codes(packed, bits), codes)


@pytest.mark.parametrize("bits", [4, 6])
def test_pack_of_an_empty_last_dim_is_empty(bits):
    assert pack_codes(torch.zeros(3, 0, dtype=torch.uint8), bits).shape == (3, 0)
    assert unpack_codes(torch.zeros(3, 0, dtype=torch.uint8), bits).shape == (3, 0)


def test_unpack_keeps_the_first_n_codes():
    codes = torch.tensor([1, 2, 3, 4, 5, 0, 0, 0], dtype=torch.uint8)  # 5 codes padded to 8
    packed = pack_fp6(codes)
    assert unpack_fp6(packed, n=5).tolist() == [1, 2, 3, 4, 5]
    assert unpack_fp6(packed, n=8).tolist() == codes.tolist()
    assert unpack_fp4(pack_fp4(torch.tensor([7, 9, 15, 0], dtype=torch.uint8)), n=3).tolist() == [7, 9, 15]


@given(bits=st.sampled_from(WIDTHS), data=st.data())
def test_unpack_inverts_pack(bits, data):
    n_codes, n_bytes = GROUPS[bits]
    groups = data.draw(st.integers(0, 6), label="groups")
    rows = data.draw(st.integers(1, 3), label="rows")
    row = st.lists(st.integers(0, (1 << bits) - 1), min_size=groups * n_codes, max_size=groups * n_codes)
    codes = torch.tensor(data.draw(st.lists(row, min_size=rows, max_size=rows)), dtype=torch.uint8)
    codes = codes.reshape(rows, groups * n_codes)
    packed = pack_codes(codes, bits)
    assert packed.shape == (rows, groups * n_bytes)
    assert torch.equal(unpack_codes(packed, bits), codes)


@given(bits=st.sampled_from(WIDTHS), data=st.data())
def test_pack_inverts_unpack_on_any_bytes(bits, data):
    n_bytes = GROUPS[bits][1]
    raw = data.draw(st.binary(min_size=0, max_size=4 * n_bytes).filter(lambda b: len(b) % n_bytes == 0))
    packed = torch.tensor(list(raw), dtype=torch.uint8)
    assert torch.equal(pack_codes(unpack_codes(packed, bits), bits), packed)


# ---------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    ("bits", "length", "match"),
    [
        (4, 3, r"codes\.shape\[-1\]=3 \(the last dim, dim 1 of shape \(2, 3\)\).*groups of 2 codes"),
        (6, 6, r"codes\.shape\[-1\]=6 .*groups of 4 codes into 3 byte.*multiple of 4"),
        (6, 2, r"codes\.shape\[-1\]=2 .*multiple of 4"),
    ],
)
def test_pack_rejects_a_last_dim_that_does_not_fill_whole_bytes(bits, length, match):
    with pytest.raises(ValueError, match=match):
        pack_codes(torch.zeros(2, length, dtype=torch.uint8), bits)


@pytest.mark.parametrize(("bits", "bad"), [(4, 0x10), (4, 0x17), (6, 0x40), (6, 0xFF), (1, 2)])
def test_pack_rejects_codes_with_bits_above_the_width(bits, bad):
    codes = torch.zeros(2, 8, dtype=torch.uint8)
    codes[1, 5] = bad
    with pytest.raises(ValueError, match=rf"codes\[1, 5\] = {bad:#04x} has bits above the {bits}-bit width"):
        pack_codes(codes, bits)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64, torch.float32, torch.bool])
def test_pack_and_unpack_reject_non_uint8(dtype):
    t = torch.zeros(4, dtype=dtype)
    with pytest.raises(TypeError, match=rf"codes\.dtype={dtype}; expected torch\.uint8"):
        pack_codes(t, 4)
    with pytest.raises(TypeError, match=rf"packed\.dtype={dtype}; expected torch\.uint8"):
        unpack_codes(t, 4)


def test_pack_rejects_a_non_tensor():
    with pytest.raises(TypeError, match=r"codes must be a torch\.Tensor, got list"):
        pack_codes([1, 2], 4)


@pytest.mark.parametrize("bits", [0, 9, 12, 16, -4, 4.0, "4", True])
def test_pack_and_unpack_reject_unsupported_widths(bits):
    t = torch.zeros(8, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"bits=.* is not a supported code width; expected one of \(1, 2"):
        pack_codes(t, bits)
    with pytest.raises(ValueError, match=r"is not a supported code width"):
        unpack_codes(t, bits)


def test_pack_rejects_a_0_dim_tensor():
    with pytest.raises(ValueError, match="0-dimensional"):
        pack_fp4(torch.tensor(3, dtype=torch.uint8))


def test_unpack_rejects_a_length_that_is_not_whole_groups():
    with pytest.raises(ValueError, match=r"packed\.shape\[-1\]=4 .*group of 4 codes takes 3 bytes.*multiple of 3"):
        unpack_fp6(torch.zeros(4, dtype=torch.uint8))


@pytest.mark.parametrize(("n", "match"), [(3, "pack into 3 bytes"), (9, "pack into 9 bytes"), (-1, "non-negative")])
def test_unpack_rejects_an_n_that_does_not_match_the_bytes(n, match):
    packed = torch.zeros(6, dtype=torch.uint8)  # 8 fp6 codes
    with pytest.raises(ValueError, match=match):
        unpack_fp6(packed, n=n)
