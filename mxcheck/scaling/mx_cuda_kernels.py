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
def mx_dequant_bf16(codes_ptr, scales_ptr, table_ptr, out_ptr, n, k, scale_k, MX_BLOCK: tl.constexpr,
                    BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    code = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
    value = tl.load(table_ptr + code, mask=mask, other=0.0)
    row, col = offs // k, offs % k
    s = tl.load(scales_ptr + row * scale_k + col // MX_BLOCK, mask=mask, other=127).to(tl.int32)
    bits = tl.where(s == 0, 1 << 22, tl.where(s == 255, 0x7FC00000, s << 23))
    scale = bits.to(tl.float32, bitcast=True)
    tl.store(out_ptr + offs, (value * scale).to(tl.bfloat16), mask=mask)


@triton.jit
def mx_quantize_blocks(x_ptr, u_ptr, scales_ptr, codes_ptr, n_blocks, rows, stride_row, stride_col,
                       ROW_FASTEST: tl.constexpr, MX_BLOCK: tl.constexpr, GROUPS: tl.constexpr, MBITS: tl.constexpr,
                       EMIN: tl.constexpr, EMAX: tl.constexpr, FMAX: tl.constexpr, BITS: tl.constexpr,
                       FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, RULE: tl.constexpr,
                       ROUNDING: tl.constexpr, ZERO_SCALE: tl.constexpr, SCALES_GIVEN: tl.constexpr,
                       H_SIZE: tl.constexpr, H_LOG2: tl.constexpr, H_NORM: tl.constexpr,
                       H_INPUT_BF16: tl.constexpr):
    # Block blk is (row, block column) of the (rows, C) output; codes, scales and u are
    # contiguous there. x is read through its strides: a transposed operand (stride_row
    # 1) is read in place, with a program's blocks on consecutive rows so the loads are
    # coalesced across them (ROW_FASTEST).
    blk = tl.program_id(0).to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
    in_range = blk < n_blocks
    blocks_per_row = n_blocks // rows
    if ROW_FASTEST:
        row, col_block = blk % rows, blk // rows
    else:
        row, col_block = blk // blocks_per_row, blk % blocks_per_row
    col = col_block[:, None] * MX_BLOCK + tl.arange(0, MX_BLOCK)[None, :]
    offs = row[:, None] * (blocks_per_row * MX_BLOCK) + col
    sblk = row * blocks_per_row + col_block
    x = tl.load(x_ptr + row[:, None] * stride_row + col * stride_col, mask=in_range[:, None],
                other=0.0).to(tl.float32)
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
        has_nan = tl.max((x != x).to(tl.int32), axis=1) > 0
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
def fp8_scaled_encode(x_ptr, scale_ptr, scale_value, codes_ptr, n, k, stride_r, stride_c,
                      SCALE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
                      MBITS: tl.constexpr, EMIN: tl.constexpr, FMAX: tl.constexpr, BITS: tl.constexpr,
                      FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, NAN_SIGNED: tl.constexpr,
                      WIDE: tl.constexpr, BLOCK: tl.constexpr):
    # x is (n / k, k), contiguous. SCALE: 0 the value scale_value (a scale held on the host),
    # 1 the one float32 at scale_ptr, 2 the scale of (row // ROWS, col // COLS) at those
    # strides (0 along a dimension one scale spans). Offsets are int64 only where n needs
    # them (WIDE): an int64 division by k costs several times the memory traffic.
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
    code, is_nan = encode_scaled(x, scale, 0.0, MBITS, EMIN, FMAX, BITS, FNUZ, 0)
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
