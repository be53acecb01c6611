"""Pack narrow codes into bytes, least significant bits first, and unpack them.

One generic little-endian bit stream serves every width: code i of a row occupies bits
``[i * bits, (i + 1) * bits)`` of the row's bytes read as one little-endian integer.
So 4-bit codes give ``byte = c0 | c1 << 4`` (low nibble = even index, as PyTorch's
``float4_e2m1fn_x2``, torchao's ``pack_uint4`` and TransformerEngine's ``cast_to_fp4x2``
lay them out), 6-bit codes give four codes in three bytes
(``b0 = c0 | c1 << 6``, ``b1 = c1 >> 2 | c2 << 4``, ``b2 = c2 >> 4 | c3 << 2``), and
8-bit codes pass through unchanged.

The fp6 layout is mxcheck's own: current torchao stores fp6 one code per byte, and the
two layouts it used to have were not this one (research/reference_emulators.md section 4,
section 8 item 20).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "SUPPORTED_BITS",
    "group_shape",
    "pack_codes",
    "pack_fp4",
    "pack_fp6",
    "unpack_codes",
    "unpack_fp4",
    "unpack_fp6",
]

SUPPORTED_BITS = (1, 2, 3, 4, 5, 6, 7, 8)


def group_shape(bits: int) -> tuple[int, int]:
    """(codes, bytes) of the smallest whole-byte group of ``bits``-wide codes: (2, 1) for 4."""
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in SUPPORTED_BITS:
        raise ValueError(f"bits={bits!r} is not a supported code width; expected one of {SUPPORTED_BITS}")
    g = math.gcd(bits, 8)
    return 8 // g, bits // g


def _check_uint8(t: torch.Tensor, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.uint8:
        raise TypeError(f"{name}.dtype={t.dtype}; expected torch.uint8 (one code per byte, or packed bytes)")
    if t.dim() == 0:
        raise ValueError(f"{name} is 0-dimensional; packing works along the last dim, so give it at least one")


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``bits``-wide codes (uint8, one per byte) along the last dim into uint8 bytes.

    The last dim must hold whole groups (2 codes for 4 bits, 4 for 6 bits, 1 for 8 bits);
    the result's last dim is ``codes.shape[-1] * bits // 8``. Codes must fit in ``bits``.
    """
    n_codes, n_bytes = group_shape(bits)
    _check_uint8(codes, "codes")
    n = codes.shape[-1]
    if n % n_codes:
        raise ValueError(
            f"codes.shape[-1]={n} (the last dim, dim {codes.dim() - 1} of shape {tuple(codes.shape)}) "
            f"does not fill whole bytes: {bits}-bit codes pack in groups of {n_codes} codes into "
            f"{n_bytes} byte(s); pad the last dim to a multiple of {n_codes}"
        )
    if codes.numel() and int(codes.max()) >> bits:
        where = tuple((codes >> bits).nonzero()[0].tolist())
        bad = int(codes[where])
        raise ValueError(
            f"codes{list(where)} = {bad:#04x} has bits above the {bits}-bit width set; "
            f"codes must lie in [0, {(1 << bits) - 1}]"
        )
    # A group is at most 8 codes of 7 bits = 56 bits, so it fits an int64 without its sign bit.
    groups = codes.reshape(*codes.shape[:-1], n // n_codes, n_codes).to(torch.int64)
    code_shift = torch.arange(n_codes, device=codes.device, dtype=torch.int64) * bits
    word = (groups << code_shift).sum(dim=-1, keepdim=True)  # disjoint bits: sum == or
    byte_shift = torch.arange(n_bytes, device=codes.device, dtype=torch.int64) * 8
    packed = (word >> byte_shift) & 0xFF
    return packed.reshape(*codes.shape[:-1], n // n_codes * n_bytes).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int, n: int | None = None) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: uint8 codes, one per byte, along the last dim.

    ``n`` is the number of codes the caller packed (after padding to whole groups) and
    keeps only the first ``n``; the packed length must be exactly what ``n`` codes
    padded to a whole group take. By default every code in the bytes is returned.
    """
    n_codes, n_bytes = group_shape(bits)
    _check_uint8(packed, "packed")
    m = packed.shape[-1]
    if m % n_bytes:
        raise ValueError(
            f"packed.shape[-1]={m} (the last dim, dim {packed.dim() - 1} of shape {tuple(packed.shape)}) "
            f"is not a whole number of {bits}-bit groups: each group of {n_codes} codes takes "
            f"{n_bytes} bytes, so the last dim must be a multiple of {n_bytes}"
        )
    total = m // n_bytes * n_codes
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n={n!r} must be a non-negative int (the number of codes to keep)")
        if -(-n // n_codes) * n_bytes != m:
            raise ValueError(
                f"n={n} codes of {bits} bits pack into {-(-n // n_codes) * n_bytes} bytes "
                f"(groups of {n_codes} codes in {n_bytes} bytes), but packed.shape[-1]={m}"
            )
    groups = packed.reshape(*packed.shape[:-1], m // n_bytes, n_bytes).to(torch.int64)
    byte_shift = torch.arange(n_bytes, device=packed.device, dtype=torch.int64) * 8
    word = (groups << byte_shift).sum(dim=-1, keepdim=True)
    code_shift = torch.arange(n_codes, device=packed.device, dtype=torch.int64) * bits
    codes = ((word >> code_shift) & ((1 << bits) - 1)).reshape(*packed.shape[:-1], total)
    return codes[..., : total if n is None else n].to(torch.uint8)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Two e2m1 codes per byte, element 0 in the low nibble."""
    return pack_codes(codes, 4)


def unpack_fp4(packed: torch.Tensor, n: int | None = None) -> torch.Tensor:
    return unpack_codes(packed, 4, n)


def pack_fp6(codes: torch.Tensor) -> torch.Tensor:
    """Four e2m3 or e3m2 codes in three bytes, least significant bits first."""
    return pack_codes(codes, 6)


def unpack_fp6(packed: torch.Tensor, n: int | None = None) -> torch.Tensor:
    return unpack_codes(packed, 6, n)
