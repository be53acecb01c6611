"""mxcheck.layouts: AITER / Primus-Turbo preshuffle layouts and the AITER MXFP6 blob.

Expected positions are worked out by hand from the vendor sources named in each test
(``mxcheck/layouts.py`` lists the files and commits); none is computed by the code under
test.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxcheck.layouts import (
    mxfp6_blob_sizes,
    pack_mxfp6_blob,
    shuffle_scale,
    shuffle_weight,
    unpack_mxfp6_blob,
    unshuffle_scale,
    unshuffle_weight,
)
from mxcheck.packing import pack_fp6

pytestmark = pytest.mark.emulated


def _coords(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two uint8 tensors holding each entry's own row and column (rows, cols < 256)."""
    r = torch.arange(rows, dtype=torch.uint8)[:, None].expand(rows, cols).contiguous()
    c = torch.arange(cols, dtype=torch.uint8)[None, :].expand(rows, cols).contiguous()
    return r, c


# ---------------------------------------------------------------------------------------
# shuffle_weight (aiter/ops/shuffle.py, layout (16, 16), 1-byte elements)

# Output flat index -> (n, kb) of the byte it holds, for a [32, 64]-byte weight (N=32,
# K=128 fp4 values). Derived from AITER's view(-1, N/16, 16, K/32, 2, 16).permute(0, 1, 3,
# 4, 2, 5): the output runs over (n0, k0, k1, n1, k2) with strides (16*64=1024, 512, 256,
# 16, 1), and n = 16*n0 + n1, kb = 32*k0 + 16*k1 + k2. E.g. 1300 = 1024 + 256 + 16 + 4:
# n0=1, k0=0, k1=1, n1=1, k2=4 -> (17, 20).
WEIGHT_16x16 = {
    0: (0, 0), 15: (0, 15), 16: (1, 0), 17: (1, 1), 255: (15, 15), 256: (0, 16), 271: (0, 31),
    272: (1, 16), 511: (15, 31), 512: (0, 32), 768: (0, 48), 1023: (15, 63), 1024: (16, 0),
    1300: (17, 20), 2047: (31, 63),
}


def test_shuffle_weight_puts_bytes_where_aiter_view_permute_does():
    r, c = _coords(32, 64)
    sr, sc = shuffle_weight(r).flatten(), shuffle_weight(c).flatten()
    got = {i: (int(sr[i]), int(sc[i])) for i in WEIGHT_16x16}
    assert got == WEIGHT_16x16


@given(n_tiles=st.integers(1, 4), k_tiles=st.integers(1, 4), batch=st.integers(0, 2), seed=st.integers(0, 2**32))
def test_shuffle_weight_matches_primus_turbo_compute_shuffled_index(n_tiles, k_tiles, batch, seed):
    # Primus-Turbo csrc/include/primus_turbo/device/shuffle.cuh compute_shuffled_index:
    # N_block*(K_packed<<4) + K_block*512 + sub_block*256 + row_in_block*16 + k_elem.
    n, kb = 16 * n_tiles, 32 * k_tiles
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 256, (max(batch, 1), n, kb), generator=g, dtype=torch.uint8)
    rows, cols = torch.arange(n)[:, None], torch.arange(kb)[None, :]
    dst = (rows // 16) * (kb * 16) + (cols // 32) * 512 + ((cols % 32) // 16) * 256 + (rows % 16) * 16 + cols % 16
    want = torch.empty_like(w).view(w.shape[0], -1)
    want[:, dst.flatten()] = w.view(w.shape[0], -1)
    assert torch.equal(shuffle_weight(w), want.view(w.shape))
    assert torch.equal(unshuffle_weight(shuffle_weight(w)), w)


@given(n_tiles=st.integers(1, 3), k_tiles=st.integers(1, 3),
       dtype=st.sampled_from([torch.uint8, torch.float4_e2m1fn_x2, torch.float8_e4m3fn, torch.bfloat16]),
       seed=st.integers(0, 2**32))
def test_unshuffle_weight_inverts_shuffle_weight(n_tiles, k_tiles, dtype, seed):
    # 1-byte types share AITER's 16-byte lane of 16 elements; bf16 has lanes of 8 (K = 16 // 2).
    g = torch.Generator().manual_seed(seed)
    n, k = 16 * n_tiles, 32 * k_tiles
    w = torch.randint(0, 256, (n, k * (2 if dtype == torch.bfloat16 else 1)), generator=g, dtype=torch.uint8)
    w = w.view(dtype)
    s = shuffle_weight(w)
    assert s.dtype == dtype and s.shape == w.shape
    assert torch.equal(unshuffle_weight(s).view(torch.uint8), w.view(torch.uint8))


def test_bf16_shuffle_weight_keeps_8_element_lanes_together():
    # K = 16 // element_size = 8 for bf16: view(-1, 1, 16, 1, 4, 8); element (n, k) moves to
    # (k//8)*128 + n*8 + k%8 for a [16, 32] tile (k1 = k//8 strides 16*8 = 128).
    r, c = _coords(16, 32)
    sr = shuffle_weight(r.to(torch.bfloat16)).flatten()
    sc = shuffle_weight(c.to(torch.bfloat16)).flatten()
    for (n, k), i in {(0, 0): 0, (0, 7): 7, (1, 0): 8, (0, 8): 128, (15, 31): 3 * 128 + 15 * 8 + 7}.items():
        assert (int(sr[i]), int(sc[i])) == (n, k)


@pytest.mark.parametrize(("shape", "dim"), [((24, 64), "dim -2 (N) = 24"), ((16, 48), "dim -1 (K"),
                                            ((64,), "at least 2 dims")])
def test_shuffle_weight_names_the_dim_that_does_not_tile(shape, dim):
    w = torch.zeros(shape, dtype=torch.uint8)
    with pytest.raises(ValueError, match=re.escape(dim)):
        shuffle_weight(w)
    with pytest.raises(ValueError, match=re.escape(dim)):
        unshuffle_weight(w)


# ---------------------------------------------------------------------------------------
# shuffle_scale (aiter e8m0_shuffle; Primus-Turbo shuffle_scale([16, 16]))

# (r, c) of a [40, 13] scale -> index in the [256, 16] shuffled output, from AITER's
# view(R/32, 2, 16, C/8, 2, 4).permute(0, 3, 5, 2, 4, 1) = Primus-Turbo's
# compute_shuffle_scale_index: i0*(16/8)*256 + i3*256 + i5*64 + i2*4 + i4*2 + i1 with
# i0=r//32, i1=(r%32)//16, i2=r%16, i3=c//8, i4=(c%8)//4, i5=c%4. E.g. (39, 12): i0=1,
# i2=7, i3=1, i4=1 -> 512 + 256 + 28 + 2 = 798.
SCALE_INDEX = {(0, 0): 0, (16, 0): 1, (0, 4): 2, (16, 4): 3, (1, 0): 4, (0, 1): 64, (0, 8): 256,
               (32, 0): 512, (39, 12): 798, (17, 9): 325, (38, 3): 728}
# Padding slots: (40, 0) -> 512 + 8*4 = 544 (row 40 >= 40), (0, 13) -> 256 + 64 + 2 = 322.
SCALE_PAD_INDEX = (544, 322)


def test_shuffle_scale_puts_bytes_where_aiter_and_primus_turbo_do():
    r, c = _coords(40, 13)
    sr, sc = shuffle_scale(r, pad_value=255), shuffle_scale(c, pad_value=255)
    assert sr.shape == (256, 16)  # rows pad to 256, columns to 8
    sr, sc = sr.flatten(), sc.flatten()
    assert {rc: (int(sr[i]), int(sc[i])) for rc, i in SCALE_INDEX.items()} == {rc: rc for rc in SCALE_INDEX}
    assert [int(sr[i]) for i in SCALE_PAD_INDEX] == [255, 255]
    assert int(shuffle_scale(r).flatten()[544]) == 0  # Primus-Turbo pads with 0


@given(rows=st.integers(1, 600), cols=st.integers(1, 40), seed=st.integers(0, 2**32))
def test_unshuffle_scale_inverts_shuffle_scale(rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(0, 256, (rows, cols), generator=g, dtype=torch.uint8)
    out = shuffle_scale(s)
    assert out.shape == (-(-rows // 256) * 256, -(-cols // 8) * 8)
    assert torch.equal(unshuffle_scale(out, rows, cols), s)
    e8 = shuffle_scale(s.view(torch.float8_e8m0fnu))
    assert e8.dtype == torch.float8_e8m0fnu and torch.equal(e8.view(torch.uint8), out)


@pytest.mark.parametrize(("shape", "rows", "cols", "msg"), [
    ((250, 8), 200, 8, "dim 0 = 250 is not a multiple of 256"),
    ((256, 12), 200, 12, "dim 1 = 12 is not a multiple of 8"),
    ((512, 8), 200, 8, "dim 0 = 512 is not the padding of 200 rows"),
    ((256, 8), 200, 9, "dim 1 = 8 is not the padding of 9 columns"),
])
def test_unshuffle_scale_names_the_dim_that_does_not_match(shape, rows, cols, msg):
    with pytest.raises(ValueError, match=msg):
        unshuffle_scale(torch.zeros(shape, dtype=torch.uint8), rows, cols)


def test_shuffle_scale_rejects_what_is_not_2d_bytes():
    with pytest.raises(ValueError, match="2D tensor of E8M0 bytes"):
        shuffle_scale(torch.zeros(4, 4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="2D tensor of E8M0 bytes"):
        shuffle_scale(torch.zeros(4, 4, dtype=torch.float32))


# ---------------------------------------------------------------------------------------
# AITER MXFP6 blob (gemm_op_a6w6.py pack_big_torch / pack_scale_torch)


def test_mxfp6_blob_puts_blocks_and_scales_where_aiter_packer_does():
    # rows=300, K=160: rows pad to 512 (2 row tiles), K to 256 (2 K tiles) + 2 guard tiles.
    rows, k = 300, 160
    codes = torch.zeros(rows, k, dtype=torch.uint8)
    scales = torch.full((rows, k // 32), 127, dtype=torch.uint8)
    codes[17, 64:96] = torch.arange(32, dtype=torch.uint8)  # row 17, group 2
    codes[290, 160 - 32:] = 63 - torch.arange(32, dtype=torch.uint8)  # row 290, group 4
    scales[17, 2], scales[290, 4], scales[200, 0] = 3, 5, 7
    blob, sblob = pack_mxfp6_blob(codes, scales)
    assert (blob.numel(), sblob.numel()) == mxfp6_blob_sizes(rows, k) == (2 * 4 * 24576, 2 * 4 * 1024)
    # Row 17 group 2: tile (0, 0), rem=17, kg=2 -> block (17//16)*64 + 2*16 + 17%16 = 97:
    # C0 bytes at 97*16 = 1552, C1 bytes at 16384 + 97*8 = 17160.
    # Codes 0..7 pack (c0 | c1<<6, c1>>2 | c2<<4, c2>>4 | c3<<2) to 64, 32, 12, 68, 97, 28.
    assert blob[1552:1558].tolist() == [64, 32, 12, 68, 97, 28]
    packed = pack_fp6(torch.arange(32, dtype=torch.uint8))
    assert torch.equal(blob[1552:1568], packed[:16]) and torch.equal(blob[17160:17168], packed[16:])
    # Row 290 group 4: tile (1, 1) starts at (1*4 + 1)*24576 = 122880; rem=34, kg=0 ->
    # block (34//16)*64 + 0 + 2 = 130: C0 at 122880 + 2080 = 124960, C1 at 122880 + 16384 + 1040.
    packed = pack_fp6(63 - torch.arange(32, dtype=torch.uint8))
    assert torch.equal(blob[124960:124976], packed[:16]) and torch.equal(blob[140304:140312], packed[16:])
    # Scale of (r, g) in tile t*4 + g//4 at (rem//128)*512 + (g%4)*128 + (rem%16)*8 + (rem%128)//16:
    # (17, 2) -> 256 + 8 + 1 = 265; (290, 4) -> 5*1024 + 16 + 2 = 5138; (200, 0) -> 512 + 64 + 4 = 580.
    assert (int(sblob[265]), int(sblob[5138]), int(sblob[580])) == (3, 5, 7)
    # Guard tiles (K tiles 2 and 3 of each row tile) hold code 0 / scale 127, as AITER's torch packer.
    tiles = blob.view(2, 4, 24576)
    assert not tiles[:, 2:].any() and bool((sblob.view(2, 4, 1024)[:, 2:] == 127).all())


# Each example packs whole 256 x 128 tiles (~50 ms); 40 examples still cross both paddings.
@settings(max_examples=40)
@given(rows=st.integers(1, 300), k_blocks=st.integers(1, 10), seed=st.integers(0, 2**32))
def test_unpack_mxfp6_blob_inverts_pack_mxfp6_blob(rows, k_blocks, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 64, (rows, 32 * k_blocks), generator=g, dtype=torch.uint8)
    scales = torch.randint(0, 256, (rows, k_blocks), generator=g, dtype=torch.uint8)
    c, s = unpack_mxfp6_blob(*pack_mxfp6_blob(codes, scales), rows, 32 * k_blocks)
    assert torch.equal(c, codes) and torch.equal(s, scales)


def test_mxfp6_blob_checks_shapes_and_sizes():
    with pytest.raises(ValueError, match="k \\(the contraction dim\\) = 48"):
        pack_mxfp6_blob(torch.zeros(4, 48, dtype=torch.uint8), torch.zeros(4, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="scales: expected E8M0 bytes of shape \\(4, 2\\)"):
        pack_mxfp6_blob(torch.zeros(4, 64, dtype=torch.uint8), torch.zeros(4, 3, dtype=torch.uint8))
    blob, sblob = pack_mxfp6_blob(torch.zeros(4, 64, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="blob: expected 98304 bytes for rows=4 k=256"):
        unpack_mxfp6_blob(blob, sblob, 4, 256)  # packed with K=64: 1 + 2 K tiles, not 2 + 2
