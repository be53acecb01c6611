"""The Triton kernels of ``mxcheck.scaling.mx_cuda`` (which documents them and loads this
module only where Triton is installed). They sit at module level, not in a closure: Triton's
interpreter runs a kernel with its module's globals only, so a helper another kernel calls
must be one of them.
"""

import triton
import triton.language as tl


@triton.jit
def encode_scaled(x, mult, u, MBITS: tl.constexpr, EMIN: tl.constexpr, FMAX: tl.constexpr,
                  BITS: tl.constexpr, FNUZ: tl.constexpr, ROUNDING: tl.constexpr):
    """(codes as int32, x * mult is NaN) for float32 x and mult >= 0, as
    formats.encode_bits_float with saturation: x * mult (one rounded float32 multiply),
    |.| clamped to max (Inf -> max), divided by its quantum (a power-of-two multiply),
    rounded to an integer significand r; the code is ((E - emin) << mbits) + r with x's
    sign (none on an fnuz zero). Every step is exact but the first multiply. A NaN's
    code is the caller's to set. u: the uniforms of SR (ROUNDING 3), unused otherwise."""
    a = x * mult
    is_nan = a != a
    negative = x.to(tl.int32, bitcast=True) < 0  # mult >= 0: the product's sign but for NaN
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
        r = (q.to(tl.float64) + u).to(tl.int32)
    mag = ((field - 127 - EMIN) << MBITS) + r
    sign = negative.to(tl.int32) << (BITS - 1)
    if FNUZ:  # no negative zero
        sign = tl.where(mag != 0, sign, 0)
    return mag | sign, is_nan


@triton.jit
def _mx_values(codes_ptr, scales_ptr, table_ptr, scale_table_ptr, offs, row, col, mask, scale_k,
               MX_BLOCK: tl.constexpr, SCALE_TABLE: tl.constexpr):
    """float32 table[code] * its block's scale of the code at offs, (row, col), exact
    (MXTensor.dequantize, NVFP4Tensor.block_values); (the code, the scale code) too. The
    scale is 2**(s - 127) of an E8M0 byte s (0 the subnormal 2**-127, 255 NaN), or with
    SCALE_TABLE scale_table[s] (NVFP4's ue4m3). offs is passed apart from row * k + col so
    contiguous loads stay vectorized."""
    code = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    s = tl.load(scales_ptr + row * scale_k + col // MX_BLOCK, mask=mask, other=127).to(tl.int32)
    if SCALE_TABLE:
        scale = tl.load(scale_table_ptr + s, mask=mask, other=1.0)
    else:
        scale = tl.where(s == 0, 1 << 22, tl.where(s == 255, 0x7FC00000, s << 23)).to(tl.float32, bitcast=True)
    return tl.load(table_ptr + code, mask=mask, other=0.0) * scale, code, s


@triton.jit
def mx_dequant_bf16(codes_ptr, scales_ptr, table_ptr, scale_table_ptr, out_ptr, inexact_ptr, n, k, scale_k,
                    MX_BLOCK: tl.constexpr, BLOCK: tl.constexpr, LOWEST_BYTE: tl.constexpr,
                    MAGNITUDE_MASK: tl.constexpr, SCALE_TABLE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    value, code, s = _mx_values(codes_ptr, scales_ptr, table_ptr, scale_table_ptr, offs, offs // k, offs % k, mask,
                                scale_k, MX_BLOCK, SCALE_TABLE)
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
        a, _, _ = _mx_values(a_ptr, sa_ptr, ta_ptr, ta_ptr, rm[:, None] * ka + rk[None, :], rm[:, None],
                             rk[None, :], (rm[:, None] < m) & (rk[None, :] < ka), sa_k, BLOCK_A, False)
        b, _, _ = _mx_values(b_ptr, sb_ptr, tb_ptr, tb_ptr, rn[:, None] * kb + rk[None, :], rn[:, None],
                             rk[None, :], (rn[:, None] < n) & (rk[None, :] < kb), sb_k, BLOCK_B, False)
        acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
        k0 += BK
    tl.store(y_ptr + rm[:, None] * n + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < m) & (rn[None, :] < n))


@triton.jit
def _tile_max(v, GROUPS: tl.constexpr, TILE_ROWS: tl.constexpr):
    """Each run of TILE_ROWS values replaced by its max."""
    m = tl.max(tl.reshape(v, (GROUPS // TILE_ROWS, TILE_ROWS)), axis=1)
    return tl.reshape(tl.broadcast_to(m[:, None], (GROUPS // TILE_ROWS, TILE_ROWS)), (GROUPS,))


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
    # x * 2**(127 - s), a power of two: s 255 gives NaN, and the block NaN code below
    inv_bits = tl.where(s < 254, (254 - s) << 23, tl.where(s == 254, 1 << 22, 0x7FC00000))
    if ROUNDING == 3:
        u = tl.load(u_ptr + offs, mask=in_range[:, None], other=0.0)
    else:
        u = 0.0
    code, _ = encode_scaled(x, inv_bits.to(tl.float32, bitcast=True)[:, None], u, MBITS, EMIN, FMAX, BITS,
                            FNUZ, ROUNDING)
    code = tl.where((s == 255)[:, None], NAN_CODE, code)
    tl.store(codes_ptr + offs, code.to(tl.uint8), mask=in_range[:, None])


@triton.jit
def fp8_scaled_encode(x_ptr, scale_ptr, scale_value, rand_ptr, codes_ptr, n, k, stride_r, stride_c,
                      SCALE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, ROUNDING: tl.constexpr,
                      MBITS: tl.constexpr, EMIN: tl.constexpr, FMAX: tl.constexpr, BITS: tl.constexpr,
                      FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, NAN_SIGNED: tl.constexpr,
                      WIDE: tl.constexpr, BLOCK: tl.constexpr):
    # x is (n / k, k), contiguous. SCALE: 0 the value scale_value (a scale held on the host),
    # 1 the one float32 at scale_ptr, 2 the scale of (row // ROWS, col // COLS) at those
    # strides (0 along a dimension one scale spans). Offsets are int64 only where n needs
    # them (WIDE): an int64 division by k costs several times the memory traffic. ROUNDING 0
    # is RNE; 3 is SR with u = rand / 256 from uint8 bits (formats.check_rounding), exact.
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    raw = tl.load(x_ptr + offs, mask=mask, other=0.0)
    x = raw.to(tl.float32)
    if SCALE == 0:
        scale = scale_value
    elif SCALE == 1:
        scale = tl.load(scale_ptr)
    else:
        row, col = offs // k, offs % k
        scale = tl.load(scale_ptr + (row // ROWS) * stride_r + (col // COLS) * stride_c, mask=mask, other=1.0)
    if ROUNDING == 3:
        u = tl.load(rand_ptr + offs, mask=mask, other=0).to(tl.float64) * (1.0 / 256)
    else:
        u = 0.0
    code, is_nan = encode_scaled(x, scale, u, MBITS, EMIN, FMAX, BITS, FNUZ, ROUNDING)
    if NAN_SIGNED:
        # A NaN x keeps its sign, read from its own bits (as formats.encode; a widening
        # may drop it). A NaN the multiply makes (Inf * 0) is negative, as the torch path's
        # multiply on an x86 CPU makes it (its default NaN is 0xFFC00000; an aarch64 CPU's
        # is positive, and there the torch path gives the positive code).
        if raw.dtype.primitive_bitwidth == 16:
            x_negative = raw.to(tl.int16, bitcast=True) < 0
        else:
            x_negative = raw.to(tl.int32, bitcast=True) < 0
        nan_negative = tl.where(x != x, x_negative, True)
        nan_code = NAN_CODE | (nan_negative.to(tl.int32) << (BITS - 1))
    else:
        nan_code = NAN_CODE
    code = tl.where(is_nan, nan_code, code)
    tl.store(codes_ptr + offs, code.to(tl.uint8), mask=mask)


@triton.jit
def outer_scaled_epilogue(acc_ptr, sa_ptr, sb_ptr, bias_ptr, out_ptr, n, cols,
                          SA_PER_ROW: tl.constexpr, SB_PER_COL: tl.constexpr, HAS_BIAS: tl.constexpr,
                          WIDE: tl.constexpr, BLOCK: tl.constexpr):
    # out = cast((acc * (sa * sb)) + bias): three float32 roundings and the cast's, each
    # apart (launched with FMA contraction off). acc is (n / cols, cols), contiguous; sa is
    # one value or one per row, sb one value or one per column.
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if SA_PER_ROW:
        sa = tl.load(sa_ptr + offs // cols, mask=mask, other=1.0)
    else:
        sa = tl.load(sa_ptr)
    if SB_PER_COL:
        sb = tl.load(sb_ptr + offs % cols, mask=mask, other=1.0)
    else:
        sb = tl.load(sb_ptr)
    y = tl.load(acc_ptr + offs, mask=mask, other=0.0) * (sa * sb)
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + offs % cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)
