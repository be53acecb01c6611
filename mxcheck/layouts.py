"""Vendor operand layouts as pure-torch permutations, each with its exact inverse.

The MI355X GEMMs do not read row-major operands: AITER's ``gemm_a4w4`` wants the weight
bytes in 16x16 preshuffled tiles and both E8M0 scale tensors in a 32x8 tile order, and
``gemm_a6w6`` reads one opaque blob per operand. These functions reproduce those layouts
byte for byte on any device, so an adapter can be tested with fake vendor modules and a
kernel's operands can be decoded back to codes. The element packing inside a byte
(fp4: low nibble = even index; fp6: 4 codes in 3 bytes, least significant bits first)
is ``mxcheck.packing``'s; this module only moves whole bytes.

Sources (public repositories; commit = the stored file version that was read):

* ROCm/aiter ``aiter/ops/shuffle.py`` @ 0122c48149c1f523bb5ca9154766bf795c1d371b:
  ``shuffle_weight(x, layout=(16, 16))`` and ``shuffle_scale(src)``;
  ``aiter/utility/fp4_utils.py`` @ 0b3d71613304c12fdc3e1a324d0f1a67a3875684:
  ``e8m0_shuffle(scale)`` is ``shuffle_scale(scale)``; the Triton quantizer's
  ``SHUFFLE`` branch writes the same index.
* AMD-AGI/Primus-Turbo ``csrc/kernels/shuffle/shuffle.cu`` @ 6467563819cbdad7e0a29280a57ca443f855b42f
  (``shuffle_e8m0_scale_16x16_kernel``, ``shuffle_fp4_weight_16x16_kernel``), host glue
  ``csrc/pytorch/shuffle/shuffle.cpp`` and ``compute_shuffle_scale_index`` /
  ``compute_shuffled_index``: the same two permutations as AITER. Primus-Turbo's
  ``shuffle_scale(scale, [16, 16])`` is AITER's ``e8m0_shuffle`` except that the padding
  is written as 0 where AITER leaves ``torch.empty`` memory, so one function serves both.
* ROCm/aiter branch ``mxfp6-gemms-clean``, ``aiter/ops/gemm_op_a6w6.py`` @
  08481f1b22e7ea28b59223ee2e7f857f6a4677bb: ``pack_big_torch``, ``pack_scale_torch``
  (layout ``mxfp6_c0c1_256_padk2``) and ``mxfp6_gemm_pack_size``.
"""

from __future__ import annotations

import torch

from mxcheck.packing import pack_fp6, unpack_fp6

__all__ = [
    "MXFP6_GUARD_K_TILES",
    "MXFP6_K_TILE",
    "MXFP6_ROW_TILE",
    "SHUFFLE_LAYOUT",
    "mxfp6_blob_sizes",
    "pack_mxfp6_blob",
    "shuffle_scale",
    "shuffle_weight",
    "unpack_mxfp6_blob",
    "unshuffle_scale",
    "unshuffle_weight",
]

SHUFFLE_LAYOUT = (16, 16)  # (IN, IK): the only layout gemm_a4w4 / Primus-Turbo use
_SCALE_ROW_PAD, _SCALE_COL_PAD = 256, 8  # shuffle_scale pads rows to 256, columns to 8

# mxfp6_c0c1_256_padk2 geometry (gemm_op_a6w6.py _TILE, _K_TILE, _PADK, *_TILE_BYTES)
MXFP6_ROW_TILE = 256
MXFP6_K_TILE = 128
MXFP6_GUARD_K_TILES = 2
_MXFP6_TILE_BYTES = 24576  # 1024 blocks of 32 codes: 16 bytes each in C0, 8 in C1
_MXFP6_C0_BYTES = 16384
_MXFP6_SCALE_TILE_BYTES = 1024
_MXFP6_PAD_SCALE = 127  # what AITER's packer gives an all-zero block (scale 2^0)


def _ceil(x: int, m: int) -> int:
    return -(-x // m) * m


def _as_bytes(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x.view(torch.uint8) if x.element_size() == 1 else x


# ---------------------------------------------------------------------------------------
# Weight preshuffle: aiter/ops/shuffle.py shuffle_weight (the non-MoE branch).
# ---------------------------------------------------------------------------------------


def _weight_tiles(x: torch.Tensor, layout: tuple[int, int], name: str) -> tuple[int, int, int]:
    """(BN, BK, KP) of AITER's view(-1, N/BN, BN, K/BK, BK/KP, KP), or ValueError."""
    if (not isinstance(layout, tuple) or len(layout) != 2
            or not all(isinstance(v, int) and v > 0 for v in layout)):
        raise ValueError(f"layout={layout!r}; expected a pair of positive ints such as (16, 16)")
    if x.dim() < 2:
        raise ValueError(f"{name} has shape {tuple(x.shape)}; shuffle_weight needs at least 2 dims (N, K)")
    bn, bk = layout[0], 2 * layout[1]
    kp = 16 // x.element_size()  # 16 bytes per lane: 16 uint8/fp8/fp4x2, 8 bf16
    if kp == 0 or bk % kp:
        raise ValueError(f"layout={layout} with {x.element_size()}-byte elements: the K tile "
                         f"({bk} elements) is not a whole number of 16-byte lanes ({kp} elements)")
    n, k = x.shape[-2], x.shape[-1]
    if n % bn:
        raise ValueError(f"{name} dim -2 (N) = {n} is not a multiple of {bn}; shuffle_weight "
                         f"tiles N by layout[0]={bn}: pad N to a multiple of {bn}")
    if k % bk:
        raise ValueError(f"{name} dim -1 (K, in elements of {x.element_size()} byte(s); packed fp4 "
                         f"counts bytes) = {k} is not a multiple of {bk} = 2 * layout[1]; pad K")
    return bn, bk, kp


def shuffle_weight(w: torch.Tensor, layout: tuple[int, int] = SHUFFLE_LAYOUT) -> torch.Tensor:
    """AITER ``shuffle_weight(w, layout)`` for a [..., N, K] weight (packed fp4 as bytes).

    ``view(-1, N/BN, BN, K/BK, BK/KP, KP).permute(0, 1, 3, 4, 2, 5)`` with ``BN =
    layout[0]``, ``BK = 2 * layout[1]`` and ``KP = 16 // element_size`` (16 for packed fp4,
    fp8 and int8, which share this code; 8 for bf16). For fp4 bytes with (16, 16) the byte
    at (n, kb) moves to ``n//16 * 16*K + kb//32 * 512 + (kb%32)//16 * 256 + n%16 * 16 +
    kb%16``, the index Primus-Turbo's ``compute_shuffled_index`` writes.

    Requires N % layout[0] == 0 and K % (2 * layout[1]) == 0 in elements (fp4: K % 64
    values); no padding is applied (AITER asserts instead). The int4 variant
    (``use_int4=True``, KP = 32) is not reproduced. Returns the input's dtype and shape.
    """
    bn, bk, kp = _weight_tiles(w, layout, "w")
    n, k = w.shape[-2], w.shape[-1]
    x = _as_bytes(w, "w") if w.dtype == getattr(torch, "float4_e2m1fn_x2", None) else w
    y = x.reshape(-1, n // bn, bn, k // bk, bk // kp, kp).permute(0, 1, 3, 4, 2, 5)
    return y.contiguous().view(w.shape).view(w.dtype)


def unshuffle_weight(w: torch.Tensor, layout: tuple[int, int] = SHUFFLE_LAYOUT) -> torch.Tensor:
    """Inverse of :func:`shuffle_weight` (same shape rules): row-major [..., N, K] again."""
    bn, bk, kp = _weight_tiles(w, layout, "shuffled w")
    n, k = w.shape[-2], w.shape[-1]
    x = _as_bytes(w, "w") if w.dtype == getattr(torch, "float4_e2m1fn_x2", None) else w
    # The shuffled memory is (B, N/BN, K/BK, BK/KP, BN, KP); permute (0, 1, 4, 2, 3, 5) undoes
    # (0, 1, 3, 4, 2, 5).
    y = x.reshape(-1, n // bn, k // bk, bk // kp, bn, kp).permute(0, 1, 4, 2, 3, 5)
    return y.contiguous().view(w.shape).view(w.dtype)


# ---------------------------------------------------------------------------------------
# E8M0 scale shuffle: aiter shuffle_scale / e8m0_shuffle, Primus-Turbo shuffle_scale([16,16]).
# ---------------------------------------------------------------------------------------


def shuffle_scale(scale: torch.Tensor, *, pad_value: int = 0) -> torch.Tensor:
    """AITER ``e8m0_shuffle(scale)`` (= ``shuffle_scale``) for [rows, K/32] E8M0 bytes.

    Pads to ``(ceil(rows, 256), ceil(cols, 8))`` with ``pad_value`` (AITER leaves the
    padding as ``torch.empty`` memory, Primus-Turbo writes 0: the kernel multiplies padded
    K blocks, whose codes are zero, and never reads padded rows into the kept output), then
    ``view(R/32, 2, 16, C/8, 2, 4).permute(0, 3, 5, 2, 4, 1)``: entry (r, c) moves to
    ``r//32 * 32*C + c//8 * 256 + c%4 * 64 + r%16 * 4 + (c%8)//4 * 2 + (r%32)//16``.
    Any 2D shape tiles. Returns the padded shape in the input's (1-byte) dtype.
    """
    if not isinstance(scale, torch.Tensor) or scale.dim() != 2 or scale.element_size() != 1:
        got = f"shape {tuple(scale.shape)} dtype {scale.dtype}" if isinstance(scale, torch.Tensor) else type(scale)
        raise ValueError(f"scale: expected a 2D tensor of E8M0 bytes (uint8 or float8_e8m0fnu), got {got}")
    if not isinstance(pad_value, int) or not 0 <= pad_value <= 255:
        raise ValueError(f"pad_value={pad_value!r}; expected a byte in [0, 255]")
    rows, cols = scale.shape
    sm, sn = _ceil(max(rows, 1), _SCALE_ROW_PAD), _ceil(max(cols, 1), _SCALE_COL_PAD)
    padded = torch.full((sm, sn), pad_value, dtype=torch.uint8, device=scale.device)
    padded[:rows, :cols] = scale.view(torch.uint8)
    out = padded.view(sm // 32, 2, 16, sn // 8, 2, 4).permute(0, 3, 5, 2, 4, 1)
    return out.contiguous().view(sm, sn).view(scale.dtype)


def unshuffle_scale(shuffled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`shuffle_scale`: the [rows, cols] scales, padding dropped."""
    if not isinstance(shuffled, torch.Tensor) or shuffled.dim() != 2 or shuffled.element_size() != 1:
        raise ValueError("shuffled: expected a 2D tensor of E8M0 bytes from shuffle_scale")
    sm, sn = shuffled.shape
    for dim, size, pad, want in ((0, sm, _SCALE_ROW_PAD, rows), (1, sn, _SCALE_COL_PAD, cols)):
        if size % pad:
            raise ValueError(f"shuffled dim {dim} = {size} is not a multiple of {pad}; "
                             "shuffle_scale output always is (rows pad to 256, columns to 8)")
        if not 0 <= want <= size or size != _ceil(max(want, 1), pad):
            raise ValueError(f"shuffled dim {dim} = {size} is not the padding of {want} "
                             f"{'rows' if dim == 0 else 'columns'} (expected {_ceil(max(want, 1), pad)})")
    # Shuffled memory is (R/32, C/8, 4, 16, 2, 2) = (i0, i3, i5, i2, i4, i1); permute back to
    # (i0, i1, i2, i3, i4, i5).
    x = shuffled.view(torch.uint8).view(sm // 32, sn // 8, 4, 16, 2, 2).permute(0, 5, 3, 1, 4, 2)
    return x.contiguous().view(sm, sn)[:rows, :cols].contiguous().view(shuffled.dtype)


# ---------------------------------------------------------------------------------------
# MXFP6 blob: gemm_op_a6w6.py pack_big_torch / pack_scale_torch ("mxfp6_c0c1_256_padk2").
# ---------------------------------------------------------------------------------------


def mxfp6_blob_sizes(rows: int, k: int) -> tuple[int, int]:
    """Bytes of the (operand, scale) blobs for [rows, k]: AITER ``mxfp6_gemm_pack_size``."""
    nt = _ceil(rows, MXFP6_ROW_TILE) // MXFP6_ROW_TILE
    nk_pad = _ceil(k, MXFP6_K_TILE) // MXFP6_K_TILE + MXFP6_GUARD_K_TILES
    return nt * nk_pad * _MXFP6_TILE_BYTES, nt * nk_pad * _MXFP6_SCALE_TILE_BYTES


def _check_mxfp6_shape(rows: int, k: int) -> None:
    if not (isinstance(rows, int) and isinstance(k, int)) or rows < 1 or k < 1:
        raise ValueError(f"rows={rows!r}, k={k!r}; expected positive ints")
    if k % 32:
        raise ValueError(f"k (the contraction dim) = {k} is not a multiple of 32, the MXFP6 block size")


def pack_mxfp6_blob(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, K] 6-bit codes and [rows, K/32] E8M0 bytes -> AITER's (operand, scale) blobs.

    Rows pad to 256 and K to 128 with code 0 / scale 127 (what AITER's packer produces for
    zero input); two guard K-tiles per row tile follow (codes 0, scales 127 as AITER's
    torch packer writes; the kernel never reads them). In a tile (row tile t, K tile s),
    the 32-block of row r (rem = r % 256) and group g (kg = g % 4) is block
    ``(rem//16)*64 + kg*16 + rem%16``: its 24 packed bytes go 16 to C0 at ``block*16`` and
    8 to C1 at ``16384 + block*8``; its scale byte goes to ``(rem//128)*512 + kg*128 +
    (rem%16)*8 + (rem%128)//16`` of the tile's 1024 scale bytes. Tiles are ordered
    ``t * (K/128 + 2) + s``. Requires K % 32 == 0.
    """
    if codes.dim() != 2 or codes.dtype != torch.uint8:
        raise ValueError(f"codes: expected 2D uint8 6-bit codes [rows, K], got {codes.dtype} {tuple(codes.shape)}")
    rows, k = codes.shape
    _check_mxfp6_shape(rows, k)
    if tuple(scales.shape) != (rows, k // 32) or scales.element_size() != 1:
        raise ValueError(f"scales: expected E8M0 bytes of shape {(rows, k // 32)}, got {tuple(scales.shape)}")
    pr, pk = _ceil(rows, MXFP6_ROW_TILE), _ceil(k, MXFP6_K_TILE)
    nt, nk = pr // MXFP6_ROW_TILE, pk // MXFP6_K_TILE
    dev = codes.device
    c = torch.zeros(pr, pk, dtype=torch.uint8, device=dev)
    c[:rows, :k] = codes
    s = torch.full((pr, pk // 32), _MXFP6_PAD_SCALE, dtype=torch.uint8, device=dev)
    s[:rows, : k // 32] = scales.view(torch.uint8)

    # rows (t, rb, r16), K (s, kg, 32 codes) -> tile (t, s), block order (rb, kg, r16)
    blocks = pack_fp6(c.view(nt, 16, 16, nk, 4, 32)).permute(0, 3, 1, 4, 2, 5)  # 24 bytes each
    tile = torch.cat([blocks[..., :16].reshape(nt, nk, -1), blocks[..., 16:].reshape(nt, nk, -1)], dim=-1)
    blob = torch.zeros(nt, nk + MXFP6_GUARD_K_TILES, _MXFP6_TILE_BYTES, dtype=torch.uint8, device=dev)
    blob[:, :nk] = tile
    # rows (t, su, sub, r16), K blocks (s, kg) -> tile (t, s), byte order (su, kg, r16, sub)
    stile = s.view(nt, 2, 8, 16, nk, 4).permute(0, 4, 1, 5, 3, 2).reshape(nt, nk, -1)
    sblob = torch.full((nt, nk + MXFP6_GUARD_K_TILES, _MXFP6_SCALE_TILE_BYTES), _MXFP6_PAD_SCALE,
                       dtype=torch.uint8, device=dev)
    sblob[:, :nk] = stile
    return blob.view(-1), sblob.view(-1)


def unpack_mxfp6_blob(blob: torch.Tensor, scale_blob: torch.Tensor, rows: int,
                      k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_mxfp6_blob`: ([rows, k] codes, [rows, k/32] scale bytes).

    The blobs carry no shape, so ``rows`` and ``k`` (the logical, unpadded dims) must be
    the ones they were packed with; sizes are checked against :func:`mxfp6_blob_sizes`.
    Guard tiles and padding are ignored (AITER leaves them unspecified).
    """
    _check_mxfp6_shape(rows, k)
    want = mxfp6_blob_sizes(rows, k)
    for name, t, n in (("blob", blob, want[0]), ("scale_blob", scale_blob, want[1])):
        if not isinstance(t, torch.Tensor) or t.element_size() != 1 or t.numel() != n:
            got = t.numel() if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: expected {n} bytes for rows={rows} k={k} "
                             f"(rows pad to 256, K to 128, plus 2 guard K tiles), got {got}")
    pr, pk = _ceil(rows, MXFP6_ROW_TILE), _ceil(k, MXFP6_K_TILE)
    nt, nk = pr // MXFP6_ROW_TILE, pk // MXFP6_K_TILE
    tiles = blob.reshape(-1).view(torch.uint8).view(nt, nk + MXFP6_GUARD_K_TILES, -1)[:, :nk]
    c0 = tiles[..., :_MXFP6_C0_BYTES].reshape(nt, nk, 16, 4, 16, 16)
    c1 = tiles[..., _MXFP6_C0_BYTES:].reshape(nt, nk, 16, 4, 16, 8)
    blocks = torch.cat([c0, c1], dim=-1)  # (t, s, rb, kg, r16, 24)
    codes = unpack_fp6(blocks.permute(0, 2, 4, 1, 3, 5).contiguous()).reshape(pr, pk)
    stile = scale_blob.reshape(-1).view(torch.uint8).view(nt, nk + MXFP6_GUARD_K_TILES, -1)[:, :nk]
    s = stile.reshape(nt, nk, 2, 4, 16, 8).permute(0, 2, 5, 4, 1, 3).reshape(pr, pk // 32)
    return codes[:rows, :k].contiguous(), s[:rows, : k // 32].contiguous()
