"""MX block scaling (OCP MX v1.0 and the scale rules vendors actually ship)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mxcheck.formats import (
    FloatFormat,
    check_bool,
    check_quantize_input,
    check_rounding,
    decode_table,
    encode_bits_float,
    get_format,
)
from mxcheck.hadamard import Hadamard, apply_hadamard, get_hadamard
from mxcheck.packing import pack_codes
from mxcheck.scaling.blocks import (
    block_amax,
    by_row_chunks,
    check_axis,
    check_tiles,
    chunk_rows,
    pad_last,
    per_row,
)
from mxcheck.scaling.mx_cuda import dequantize_bf16, quantize_blocks
from mxcheck.scaling.rules import E8M0_NAN, check_scale_rule, scale_bytes

__all__ = ["MX_ELEMENT_FORMATS", "MXTensor", "e8m0_reciprocal", "e8m0_value", "mx_quantize"]

MX_ELEMENT_FORMATS = ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz")


@dataclass(frozen=True)
class MXTensor:
    """An MX-quantized tensor: one element code per element and one E8M0 byte per block.

    ``codes`` has the shape of the input (the blocked axis padded when ``pad_to`` was
    given); ``scales`` has it with the blocked axis divided by ``block_size`` (for 2D
    tiles each row of a tile carries the tile's byte). With ``hadamard`` the codes hold
    the rotated tensor, which is what a GEMM consumes.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    fmt: FloatFormat
    block_size: int
    axis: int
    shape: tuple[int, ...]
    scale_rule: str
    rounding: str
    block_2d: bool = False
    hadamard: Hadamard | None = None
    zero_scale: int = 0

    def dequantize(self, *, padded: bool = False, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Values (exact: element * 2**(scale - 127)); NaN where the scale is 255.

        ``dtype=torch.bfloat16`` computes in bf16 directly (a GEMM's fast path); it is exact
        only where every value is a bf16, which ``mxcheck.gemm.mx_fits_bf16`` checks."""
        codes = self.codes.movedim(self.axis, -1)
        scales = self.scales.movedim(self.axis, -1)
        fused = None
        if dtype == torch.bfloat16 and codes.is_cuda:  # one Triton pass instead of four
            fused = dequantize_bf16(codes, scales, decode_table(self.fmt, codes.device, torch.float32),
                                    self.block_size)
        if fused is not None:
            out = fused if padded else fused[..., : self.shape[self.axis]]
            return out.movedim(-1, self.axis)
        table = decode_table(self.fmt, codes.device, dtype)

        def chunk(c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            values = table[c.to(torch.int32)]
            # element * 2**(s - 127) in float32 is exact: every product is a float32 (subnormal
            # ones included: elements carry <= 4 significant bits), or overflows to Inf either way.
            values.unflatten(-1, (-1, self.block_size)).mul_(e8m0_value(s).to(dtype).unsqueeze(-1))
            return values

        values = by_row_chunks(chunk, codes, scales)
        out = values
        if not padded:
            out = out[..., : self.shape[self.axis]]
        return out.movedim(-1, self.axis)

    def pack(self) -> torch.Tensor:
        """Codes packed along the blocked axis: fp4 two per byte (low nibble = even index),
        fp6 four in three bytes, fp8 one per byte."""
        return pack_codes(self.codes.movedim(self.axis, -1), self.fmt.bits).movedim(-1, self.axis)


def mx_quantize(
    x: torch.Tensor,
    fmt: str | FloatFormat,
    *,
    block_size: int = 32,
    axis: int = -1,
    scale_rule: str = "floor",
    rounding: str = "rne",
    block_2d: bool = False,
    hadamard: str | Hadamard | None = None,
    zero_scale: int = 0,
    pad_to: int | None = None,
    rand: torch.Tensor | None = None,
) -> MXTensor:
    """Quantize x to MX blocks of ``block_size`` along ``axis``.

    Steps: zero-pad the blocked axis to ``pad_to``; rotate (``hadamard``) along it;
    take each block's float32 amax (``block_2d``: block_size x block_size tiles over the
    blocked axis and the axis before it); pick the E8M0 byte by ``scale_rule``; divide by
    2**e exactly and round each element with ``rounding``, saturating to +-max.
    """
    fmt = _check_element_format(fmt)
    check_quantize_input(x, "mx_quantize")
    axis = check_axis(x, axis)
    check_scale_rule(scale_rule)
    u = check_rounding(rounding, rand, x)
    _check_block_args(x, block_size, block_2d, zero_scale, pad_to, axis)
    rot = get_hadamard(hadamard)
    xs, u = _blocked_axis_last(x, u, axis, block_size, pad_to, rot)
    if block_2d:
        check_tiles(xs.shape[-2], block_size, f"the row axis of x for 2D blocks (shape {tuple(x.shape)})", False)
    # CUDA: one fused Triton pass, rotation and 2D tiles included; where it does not take a
    # case (a rotation with signs, a tile column that a program would split) the bytes are
    # taken here and the kernel encodes. Same bits as the torch path, which
    # tests/test_mx_fused.py holds it to; elsewhere it returns None.
    kw = dict(block_size=block_size, scale_rule=scale_rule, zero_scale=zero_scale, rounding=rounding, u=u)
    fused = quantize_blocks(xs, fmt, hadamard=rot, block_2d=block_2d, **kw)
    if fused is not None:
        codes, scales = fused
    elif rot is not None and not block_2d and not xs.is_cuda:
        codes, scales = _quantize_rotated_rows(xs, rot, fmt, **kw)
    else:
        if rot is not None:
            xs = by_row_chunks(lambda t: apply_hadamard(t, rot, axis=-1), xs)
        rows = block_size if block_2d else 1
        scales = per_row(scale_bytes(block_amax(xs, rows, block_size), fmt, scale_rule, zero_scale), rows)
        fused = quantize_blocks(xs, fmt, scales=scales, **kw)
        codes = fused[0] if fused is not None else _encode_blocks(xs, scales, fmt, rounding, u, block_size)
    if axis != x.ndim - 1:
        codes, scales = codes.movedim(-1, axis), scales.movedim(-1, axis)
    return MXTensor(codes=codes, scales=scales, fmt=fmt,
                    block_size=block_size, axis=axis, shape=tuple(x.shape), scale_rule=scale_rule,
                    rounding=rounding, block_2d=block_2d, hadamard=rot, zero_scale=zero_scale)


def _quantize_rotated_rows(xs: torch.Tensor, rot: Hadamard, fmt: FloatFormat, *, block_size: int, scale_rule: str,
                           zero_scale: int, rounding: str,
                           u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scale bytes) of xs (..., C) rotated along its last axis, one row chunk at a
    time: rotate, amax, bytes, encode. Every step stays inside a row, so the bits are those
    of rotating the whole tensor first, without its full-size float32 copy (1D blocks only:
    a 2D tile spans rows that a chunk may split)."""
    codes = torch.empty(xs.shape, dtype=torch.uint8, device=xs.device)
    scales = torch.empty((*xs.shape[:-1], xs.shape[-1] // block_size), dtype=torch.uint8, device=xs.device)
    for rows in chunk_rows(xs):
        r = apply_hadamard(xs[rows], rot, axis=-1)
        scales[rows] = scale_bytes(block_amax(r, 1, block_size), fmt, scale_rule, zero_scale)
        codes[rows] = _encode_blocks(r, scales[rows], fmt, rounding, None if u is None else u[rows], block_size)
    return codes, scales


def _blocked_axis_last(x: torch.Tensor, u: torch.Tensor | None, axis: int, block_size: int,
                       pad_to: int | None, rot: Hadamard | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x (and u) with the blocked axis last and zero-padded to ``pad_to``, checked to tile
    (the caller rotates). x keeps its dtype: abs and amax are exact there, and cheaper."""
    last = axis == x.ndim - 1  # the usual case: no view to make
    xs = x if last else x.movedim(axis, -1)
    u = u if u is None or last else u.movedim(axis, -1)
    if pad_to is not None:
        xs = pad_last(xs, pad_to)
        u = None if u is None else pad_last(u, pad_to)
    check_tiles(xs.shape[-1], block_size, f"axis {axis} of x (shape {tuple(x.shape)})")
    if rot is not None:
        check_tiles(xs.shape[-1], rot.size, f"axis {axis} of x for the {rot.size}-point Hadamard", False)
    return xs, u


def _encode_blocks(xs: torch.Tensor, scales: torch.Tensor, fmt: FloatFormat, rounding: str,
                   u: torch.Tensor | None, block_size: int) -> torch.Tensor:
    """Element codes of xs (..., C) under its E8M0 bytes (..., C / block_size)."""
    # Dividing by 2**e is a float32 multiply by 2**-e: exact wherever the result can matter
    # (a product that falls into float32 subnormals lies far below the element's smallest
    # subnormal and rounds to zero either way). A NaN scale makes the whole block NaN.
    inv_scale = e8m0_reciprocal(scales).unsqueeze(-1)
    blocks = xs.unflatten(-1, (-1, block_size))
    u = None if u is None else u.unflatten(-1, (-1, block_size))
    codes = by_row_chunks(lambda b, s, uu: encode_bits_float(b, fmt, rounding, uu, scale=s, nan_codes=False),
                          blocks, inv_scale, u)
    # Store the format's NaN code (0 where it has none) for a NaN block, whatever the sign
    # of its NaNs, so the bytes are deterministic; they read NaN through the scale anyway.
    nan_code = fmt.nan_code if fmt.nan_code is not None else 0
    return codes.masked_fill_((scales == E8M0_NAN).unsqueeze(-1), nan_code).flatten(-2)


def e8m0_value(scales: torch.Tensor) -> torch.Tensor:
    """float32 2**(byte - 127) from bits: byte 0 is the subnormal 2**-127, 255 is NaN."""
    b = scales.to(torch.int32)
    special = torch.where(b == 0, 1 << 22, 0x7FC00000).to(torch.int32)
    return torch.where((b > 0) & (b < 255), b << 23, special).view(torch.float32)


def e8m0_reciprocal(scales: torch.Tensor) -> torch.Tensor:
    """float32 2**(127 - byte), built from bits: byte 254 gives the subnormal 2**-127 and
    255 (E8M0 NaN) gives NaN. No float64 and no exp2, so a compiled kernel stays cheap."""
    b = scales.to(torch.int32)
    special = torch.where(b == 254, 1 << 22, 0x7FC00000).to(torch.int32)
    bits = torch.where(b < 254, (254 - b) << 23, special)
    return bits.view(torch.float32)


def _check_element_format(fmt: str | FloatFormat) -> FloatFormat:
    fmt = get_format(fmt)
    if fmt.name not in MX_ELEMENT_FORMATS:
        raise ValueError(f"fmt={fmt.name!r} is not an MX element format; expected one of {list(MX_ELEMENT_FORMATS)}")
    return fmt


def _check_block_args(x, block_size, block_2d, zero_scale, pad_to, axis) -> None:
    check_bool(block_2d, "block_2d")
    # bool is an int: zero_scale=True would be byte 1 and pad_to=True a pad to 1
    for name, v in (("zero_scale", zero_scale), ("pad_to", pad_to)):
        if isinstance(v, bool):
            raise TypeError(f"{name}={v!r}; expected an int ({'an E8M0 byte in [0, 254]' if name == 'zero_scale' else 'a positive multiple of block_size, or None'})")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size={block_size!r}; expected a positive int (32 for MX, 16 for NVFP4)")
    if not isinstance(zero_scale, int) or not 0 <= zero_scale <= 254:
        raise ValueError(f"zero_scale={zero_scale!r}; expected an E8M0 byte in [0, 254] (0, or 127 as AITER MXFP6)")
    if pad_to is not None and (not isinstance(pad_to, int) or pad_to < 1 or pad_to % block_size):
        raise ValueError(f"pad_to={pad_to!r}; expected a positive multiple of block_size={block_size}")
    if block_2d and x.ndim < 2:
        raise ValueError(f"block_2d=True needs a tensor of at least 2 dims, got shape {tuple(x.shape)}")
