"""Fused MX kernels for CUDA with Triton: quantize in one pass, dequantize to bf16 in one.

They are fast paths of the pure-PyTorch oracle in ``mxcheck.scaling.mx``, not a second
definition: the same integer and power-of-two float32 arithmetic, so the same bits, and
``tests/test_mx_fused.py`` compares them with the torch path on every code, tie and scale
byte. Each returns None where it cannot run (no Triton, not CUDA, a case it does not
take), and the caller then uses the torch path. ``MXCHECK_FUSED_MX=0`` turns both off
(an A/B switch for benchmarks and for bisecting). Under ``TRITON_INTERPRET=1`` they run on
CPU tensors too, in Triton's interpreter, which is how the CPU tests reach them.

- ``dequantize_bf16``: the torch path (``MXTensor.dequantize``) makes several full-size
  passes (index cast, table gather, scale broadcast, multiply); this kernel reads each code
  and its block's E8M0 byte once and writes the bf16 value once.
- ``quantize_blocks``: the torch path makes about twenty full-size passes (Hadamard
  butterflies, amax, the scale rule, the element encode); this kernel reads each element
  once (and its SR uniform) and writes its code, and each block's scale byte. The rotation
  is the same radix-2 butterfly in float32 as ``mxcheck.hadamard`` (the same sums in the
  same order, then one multiply by the norm), so its values are the same bits.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from mxcheck.formats import FloatFormat
from mxcheck.hadamard import Hadamard

__all__ = ["dequantize_bf16", "gemm_f32_where_inexact", "quantize_blocks"]

_cache: dict[tuple[str, bool], Any] = {}
_BLOCK = 2048
# Elements per program and warps of the quantize kernel (benchmarks/bench_fused_configs.py
# measured these on an H200; the bits do not depend on them).
_QUANT_BLOCK = 2048
_QUANT_WARPS = 4
# Kernel constants: the scale rules and roundings mxcheck.scaling.rules / formats define.
_RULES = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3}
_ROUNDINGS = {"rne": 0, "half_away": 1, "trunc": 2, "sr": 3}


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _runs_here(t: torch.Tensor) -> bool:
    return os.environ.get("MXCHECK_FUSED_MX", "1") != "0" and (t.is_cuda or _interpreted())


def _kernels() -> dict[str, Any] | None:
    # keyed by the interpreter flag: triton.jit picks the interpreter when it decorates
    key = ("kernels", _interpreted())
    if key in _cache:
        return _cache[key]
    try:
        import triton  # noqa: PLC0415  (optional, CUDA only)
        import triton.language as tl  # noqa: PLC0415
    except ImportError:
        _cache[key] = None
        return None

    @triton.jit
    def _mx_values(codes_ptr, scales_ptr, table_ptr, offs, row, col, mask, scale_k, MX_BLOCK: tl.constexpr):
        """float32 table[code] * 2**(s - 127) of the code at offs, (row, col), exact
        (MXTensor.dequantize); (the code, the byte) too. Byte 0 is the subnormal 2**-127 and
        255 NaN. offs is passed apart from row * k + col so contiguous loads stay vectorized."""
        code = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
        s = tl.load(scales_ptr + row * scale_k + col // MX_BLOCK, mask=mask, other=127).to(tl.int32)
        bits = tl.where(s == 0, 1 << 22, tl.where(s == 255, 0x7FC00000, s << 23))
        return tl.load(table_ptr + code, mask=mask, other=0.0) * bits.to(tl.float32, bitcast=True), code, s

    @triton.jit
    def mx_dequant_bf16(codes_ptr, scales_ptr, table_ptr, out_ptr, inexact_ptr, n, k, scale_k,
                        MX_BLOCK: tl.constexpr, BLOCK: tl.constexpr, LOWEST_BYTE: tl.constexpr,
                        MAGNITUDE_MASK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        value, code, s = _mx_values(codes_ptr, scales_ptr, table_ptr, offs, offs // k, offs % k, mask, scale_k,
                                    MX_BLOCK)
        tl.store(out_ptr + offs, value.to(tl.bfloat16), mask=mask)
        if LOWEST_BYTE > 0:  # gemm.mx_fits_bf16 on the device: a nonzero code under too small a byte
            inexact = tl.max((mask & (s < LOWEST_BYTE) & ((code & MAGNITUDE_MASK) != 0)).to(tl.int32))
            if inexact > 0:
                tl.atomic_max(inexact_ptr, inexact)

    @triton.jit
    def mx_gemm_f32_where_inexact(inexact_ptr, a_ptr, sa_ptr, ta_ptr, b_ptr, sb_ptr, tb_ptr, y_ptr, m, n,
                                  ka, kb, k, sa_k, sb_k, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
                                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        # y = A @ B^T from the exact float32 values, float32 accumulation (FMA, no TF32),
        # written over the bf16 GEMM's y; a no-op unless a dequantization flagged a value
        # bf16 cannot hold. One output tile per program.
        if tl.load(inexact_ptr) == 0:
            return
        rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
        rn = tl.program_id(1).to(tl.int64) * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        k0 = 0
        while k0 < k:  # not range(): Triton's interpreter cannot take a runtime bound there
            rk = k0 + tl.arange(0, BK)
            a, _, _ = _mx_values(a_ptr, sa_ptr, ta_ptr, rm[:, None] * ka + rk[None, :], rm[:, None], rk[None, :],
                                 (rm[:, None] < m) & (rk[None, :] < ka), sa_k, BLOCK_A)
            b, _, _ = _mx_values(b_ptr, sb_ptr, tb_ptr, rn[:, None] * kb + rk[None, :], rn[:, None], rk[None, :],
                                 (rn[:, None] < n) & (rk[None, :] < kb), sb_k, BLOCK_B)
            acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
            k0 += BK
        tl.store(y_ptr + rm[:, None] * n + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(rm[:, None] < m) & (rn[None, :] < n))

    @triton.jit
    def _tile_max(v, GROUPS: tl.constexpr, TILE_ROWS: tl.constexpr):
        """Each run of TILE_ROWS values replaced by its max."""
        m = tl.max(tl.reshape(v, (GROUPS // TILE_ROWS, TILE_ROWS)), axis=1)
        return tl.reshape(tl.broadcast_to(m[:, None], (GROUPS // TILE_ROWS, TILE_ROWS)), (GROUPS,))

    # Triton's interpreter runs a kernel's source in its module's globals, not in this
    # closure: the helpers a kernel calls are found there.
    globals().update(_tile_max=_tile_max, _mx_values=_mx_values)

    @triton.jit
    def mx_quantize_blocks(x_ptr, u_ptr, scales_ptr, codes_ptr, n_blocks, rows, stride_row, stride_col,
                           ROW_FASTEST: tl.constexpr, MX_BLOCK: tl.constexpr, GROUPS: tl.constexpr, MBITS: tl.constexpr,
                           EMIN: tl.constexpr, EMAX: tl.constexpr, FMAX: tl.constexpr, BITS: tl.constexpr,
                           FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, RULE: tl.constexpr,
                           ROUNDING: tl.constexpr, ZERO_SCALE: tl.constexpr, SCALES_GIVEN: tl.constexpr,
                           H_SIZE: tl.constexpr, H_LOG2: tl.constexpr, H_NORM: tl.constexpr,
                           H_INPUT_BF16: tl.constexpr, TILE_ROWS: tl.constexpr, CONTIGUOUS: tl.constexpr):
        # Block blk is (row, block column) of the (rows, C) output; codes, scales and u are
        # contiguous there. x is read through its strides: a transposed operand (stride_row
        # 1) is read in place, with a program's blocks on consecutive rows so the loads are
        # coalesced across them (ROW_FASTEST). 2D tiles (TILE_ROWS > 1, ROW_FASTEST) are
        # TILE_ROWS consecutive blocks of a program, which share their amax.
        blk = tl.program_id(0).to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
        in_range = blk < n_blocks
        blocks_per_row = n_blocks // rows
        if ROW_FASTEST:
            row, col_block = blk % rows, blk // rows
            sblk = row * blocks_per_row + col_block
        else:  # output block = input block: offsets the compiler sees as contiguous runs
            row, col_block, sblk = blk // blocks_per_row, blk % blocks_per_row, blk
        offs = sblk[:, None] * MX_BLOCK + tl.arange(0, MX_BLOCK)[None, :]
        if CONTIGUOUS:  # so the loads are vectorized too
            x_offs = offs
        else:
            x_offs = row[:, None] * stride_row + (col_block[:, None] * MX_BLOCK + tl.arange(0, MX_BLOCK)[None, :]) * stride_col
        x = tl.load(x_ptr + x_offs, mask=in_range[:, None], other=0.0).to(tl.float32)
        if H_SIZE > 1:  # hadamard._walsh_hadamard: pairs (i, i + h) of each 2h run -> (a + b, a - b)
            if H_INPUT_BF16:
                x = x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
            for i in tl.static_range(H_LOG2):
                y = tl.permute(tl.reshape(x, (GROUPS * MX_BLOCK // (2 << i), 2, 1 << i)), (0, 2, 1))
                a, b = tl.split(y)
                y = tl.permute(tl.join(a + b, a - b), (0, 2, 1))
                x = tl.reshape(y, (GROUPS, MX_BLOCK))
            x = x * H_NORM
        if SCALES_GIVEN:
            s = tl.load(scales_ptr + sblk, mask=in_range, other=0).to(tl.int32)
        else:
            # rules.SCALE_RULES on the float32 bits of the block amax, then scale_bytes
            amax = tl.max(tl.abs(x), axis=1)
            has_nan = tl.max((x != x).to(tl.int32), axis=1)
            if TILE_ROWS > 1:  # blocks.block_amax over the tile: the max of its rows' maxima
                amax = _tile_max(amax, GROUPS, TILE_ROWS)
                has_nan = _tile_max(has_nan, GROUPS, TILE_ROWS)
            has_nan = has_nan > 0
            bits = amax.to(tl.int32, bitcast=True)
            field = (bits >> 23) & 0xFF
            if RULE == 0:  # floor
                e = field - 127 - EMAX
            elif RULE == 1:  # ceil
                e = field - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32) - EMAX
            elif RULE == 2:  # even
                e = (((bits + (1 << (22 - MBITS))) >> 23) & 0xFF) - 127 - EMAX
            else:  # rceil: the float32 quotient, correctly rounded through float64
                d = (amax.to(tl.float64) / tl.full([GROUPS], FMAX, tl.float64)).to(tl.float32)
                dbits = d.to(tl.int32, bitcast=True)
                dfield = (dbits >> 23) & 0xFF
                normal = dfield > 0
                up = tl.where(normal, (dbits & 0x7FFFFF) != 0, (dbits & 0x7FFFFF) > (1 << 22))
                e = tl.where(normal, dfield, 0) - 127 + up.to(tl.int32)
            e = tl.minimum(tl.maximum(e, -127), 127) + 127
            e = tl.where(amax == 0, ZERO_SCALE, e)
            s = tl.where(has_nan, 255, e)
            tl.store(scales_ptr + sblk, s.to(tl.uint8), mask=in_range)
        # formats.encode_bits_float: x * 2**(127 - s), |.| clamped to max, divided by its
        # quantum (a power-of-two multiply), rounded to an integer significand r; the code
        # is ((E - emin) << mbits) + r. Every float32 step is exact but the first multiply.
        inv_bits = tl.where(s < 254, (254 - s) << 23, tl.where(s == 254, 1 << 22, 0x7FC00000))
        a = x * inv_bits.to(tl.float32, bitcast=True)[:, None]
        negative = x.to(tl.int32, bitcast=True) < 0
        a = tl.minimum(tl.abs(a), FMAX)
        field = tl.maximum(a.to(tl.int32, bitcast=True) >> 23, EMIN + 127)  # E + 127, a >= 0
        q = a * ((2 * 127 + MBITS - field) << 23).to(tl.float32, bitcast=True)  # a / 2**(E - mbits)
        t = q.to(tl.int32)  # q >= 0: truncation is floor
        if ROUNDING == 0:  # rne
            frac = q - t.to(tl.float32)
            r = t + ((frac > 0.5) | ((frac == 0.5) & ((t & 1) == 1))).to(tl.int32)
        elif ROUNDING == 1:  # half_away
            r = t + ((q - t.to(tl.float32)) >= 0.5).to(tl.int32)
        elif ROUNDING == 2:  # trunc
            r = t
        else:  # sr: floor(q + u) in float64, exact (formats._round_int_sr)
            u = tl.load(u_ptr + offs, mask=in_range[:, None], other=0.0)
            r = (q.to(tl.float64) + u).to(tl.int32)
        mag = ((field - 127 - EMIN) << MBITS) + r
        sign = negative.to(tl.int32) << (BITS - 1)
        if FNUZ:  # no negative zero
            sign = tl.where(mag != 0, sign, 0)
        code = tl.where((s == 255)[:, None], NAN_CODE, mag | sign)
        tl.store(codes_ptr + offs, code.to(tl.uint8), mask=in_range[:, None])

    _cache[key] = {"dequantize": mx_dequant_bf16, "quantize": mx_quantize_blocks,
                   "gemm_f32": mx_gemm_f32_where_inexact}
    return _cache[key]


def dequantize_bf16(codes: torch.Tensor, scales: torch.Tensor, table: torch.Tensor, block_size: int,
                    inexact: torch.Tensor | None = None, lowest_byte: int = 0,
                    magnitude_mask: int = 0) -> torch.Tensor | None:
    """bf16 ``table[codes] * 2**(scales - 127)`` per ``block_size`` run of the last axis, or
    None when the kernel cannot run here (no Triton, not CUDA). ``inexact`` (int32, one
    element): set to 1 on the device where a code with a nonzero ``magnitude_mask`` part
    sits under a byte below ``lowest_byte`` (its value is not a bf16), with no host read."""
    if not _runs_here(codes) or (kernels := _kernels()) is None:
        return None
    codes, scales = codes.contiguous(), scales.contiguous()
    k = codes.shape[-1]
    out = torch.empty(codes.shape, dtype=torch.bfloat16, device=codes.device)
    n = codes.numel()
    if n:
        kernels["dequantize"][((n + _BLOCK - 1) // _BLOCK,)](
            codes, scales, table.to(torch.float32).contiguous(), out, codes if inexact is None else inexact, n, k,
            scales.shape[-1], MX_BLOCK=block_size, BLOCK=_BLOCK,
            LOWEST_BYTE=lowest_byte if inexact is not None else 0, MAGNITUDE_MASK=magnitude_mask)
    return out


# Output tiles of the float32 fallback GEMM: when nothing is flagged each program reads one
# int and returns (a 16384 x 9216 output is 9,216 programs).
_GEMM_TILE = (128, 128, 32)


def gemm_f32_where_inexact(inexact: torch.Tensor, a: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int],
                           b: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], y: torch.Tensor) -> bool:
    """Where ``inexact`` (set by ``dequantize_bf16``) is nonzero on the device, overwrite y
    (M, N; float32 or bf16) with ``A @ B^T`` from the exact float32 values, summed in float32;
    else leave it. a and b: (codes, scale bytes, float32 decode table, block size), NT. False
    where the kernel cannot run here."""
    if not _runs_here(y) or (kernels := _kernels()) is None:
        return False
    (ca, sa, ta, block_a), (cb, sb, tb, block_b) = a, b
    ca, sa, cb, sb = ca.contiguous(), sa.contiguous(), cb.contiguous(), sb.contiguous()
    m, n = y.shape
    bm, bn, bk = _GEMM_TILE
    if m and n:
        kernels["gemm_f32"][(-(-m // bm), -(-n // bn))](
            inexact, ca, sa, ta.to(torch.float32).contiguous(), cb, sb, tb.to(torch.float32).contiguous(), y, m, n,
            ca.shape[-1], cb.shape[-1], max(ca.shape[-1], cb.shape[-1]), sa.shape[-1], sb.shape[-1],
            BLOCK_A=block_a, BLOCK_B=block_b, BM=bm, BN=bn, BK=bk, num_warps=8)
    return True


def _fused_rotation(hadamard: Hadamard | None) -> tuple[int, float, bool] | None:
    """(size, norm, round the input to bf16) for a rotation the kernel takes: no signs, no
    output rounding, input rounding none or bf16 (mxfp4's h16x2, mxfp6's h32). None else."""
    if hadamard is None:
        return 1, 1.0, False
    if (hadamard.signs is not None or hadamard.round_output_to is not None
            or hadamard.round_input_to not in (None, torch.bfloat16) or hadamard.size > _QUANT_BLOCK):
        return None
    return hadamard.size, hadamard.scale, hadamard.round_input_to is not None


def quantize_blocks(xs: torch.Tensor, fmt: FloatFormat, *, block_size: int, scale_rule: str, zero_scale: int,
                    rounding: str, u: torch.Tensor | None, scales: torch.Tensor | None = None,
                    hadamard: Hadamard | None = None, block_2d: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(codes, scale bytes) of xs (..., C) in MX blocks of ``block_size`` along the last axis,
    as ``mx_quantize`` computes them, or None where the kernel cannot run. ``scales``
    (..., C / block_size), when given, are used instead of each block's own amax.
    ``block_2d``: block_size x block_size tiles over the last two axes share their amax (each
    row of a tile carries the tile's byte). ``u``: float64 uniforms shaped like xs, for SR.
    ``hadamard``: rotate each run of its size along the last axis first (not with scales)."""
    rotation = _fused_rotation(hadamard)
    if (not _runs_here(xs) or block_size & (block_size - 1) or block_size > _QUANT_BLOCK or fmt.bits > 8
            or scale_rule not in _RULES or rounding not in _ROUNDINGS or rotation is None
            or (hadamard is not None and scales is not None) or (kernels := _kernels()) is None):
        return None
    h_size, h_norm, h_input_bf16 = rotation
    rows = xs.numel() // xs.shape[-1] if xs.dim() else 1
    groups = max(1, _QUANT_BLOCK // block_size)
    # A program's blocks lie on consecutive rows (ROW_FASTEST) for 2D tiles and for a
    # transposed operand; a rotation must then stay inside a block.
    if block_2d and (scales is not None or rows % block_size or groups % block_size or h_size > block_size):
        return None
    # 2D: read in place when the rows or the columns are contiguous (a transposed operand)
    transposed = xs.dim() == 2 and xs.stride(0) == 1 and xs.stride(1) != 1
    if xs.dim() != 2 or (xs.stride(1) != 1 and not (transposed and h_size <= block_size)):
        xs = xs.contiguous()
    row_fastest = block_2d or (xs.dim() == 2 and xs.stride(1) != 1)
    codes = torch.empty(xs.shape, dtype=torch.uint8, device=xs.device)
    out_scales = (torch.empty((*xs.shape[:-1], xs.shape[-1] // block_size), dtype=torch.uint8, device=xs.device)
                  if scales is None else scales.contiguous())
    n_blocks = xs.numel() // block_size
    if n_blocks:
        nan_code = 0 if fmt.nan_code is None else fmt.nan_code
        kernels["quantize"][((n_blocks + groups - 1) // groups,)](
            xs, xs if u is None else u.contiguous(), out_scales, codes, n_blocks, rows,
            xs.stride(0) if xs.dim() == 2 else xs.shape[-1], xs.stride(-1) if xs.dim() else 1,
            ROW_FASTEST=row_fastest, MX_BLOCK=block_size, GROUPS=groups, MBITS=fmt.mbits, EMIN=fmt.emin, EMAX=fmt.emax, FMAX=fmt.max,
            BITS=fmt.bits, FNUZ=fmt.nan == "fnuz", NAN_CODE=nan_code, RULE=_RULES[scale_rule],
            ROUNDING=_ROUNDINGS[rounding], ZERO_SCALE=zero_scale, SCALES_GIVEN=scales is not None,
            H_SIZE=h_size, H_LOG2=h_size.bit_length() - 1, H_NORM=h_norm, H_INPUT_BF16=h_input_bf16,
            TILE_ROWS=block_size if block_2d else 1, CONTIGUOUS=not row_fastest and xs.is_contiguous(),
            num_warps=_QUANT_WARPS)
    return codes, out_scales
