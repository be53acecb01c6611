"""The Triton kernels of ``mxcheck.scaling.mx_cuda`` (which documents them and loads this
module only where Triton is installed). They sit at module level, not in a closure: Triton's
interpreter runs a kernel with its module's globals only, so a helper another kernel calls
must be one of them.
"""

import triton
import triton.language as tl


@triton.jit
def encode_scaled(x, mult, u, MBITS: tl.constexpr, EMIN: tl.constexpr, FMAX: tl.constexpr,
                  BITS: tl.constexpr, FNUZ: tl.constexpr, ROUNDING: tl.constexpr, HW_CAST: tl.constexpr = False):
    """(codes as int32, x * mult is NaN) for float32 x and mult >= 0, as
    formats.encode_bits_float with saturation: x * mult (one rounded float32 multiply),
    |.| clamped to max (Inf -> max), divided by its quantum (a power-of-two multiply),
    rounded to an integer significand r; the code is ((E - emin) << mbits) + r with x's
    sign (none on an fnuz zero). Every step is exact but the first multiply. A NaN's
    code is the caller's to set. u: the uniforms of SR (ROUNDING 3), unused otherwise.
    HW_CAST (OCP e4m3 / e5m2 under RNE only: mx_cuda._hw_cast): the same codes from the
    hardware's cvt.rn.satfinite on x * mult clamped to +-max."""
    a = x * mult
    is_nan = a != a
    if HW_CAST:
        # A max then a min keep a -0 (a first version negated |a| as Triton negates, 0 - |a|,
        # and made -0 +0: tools/h200/hw_fp8_cast_probe.py found it on the H200). A NaN
        # becomes a bound here; its code is the caller's.
        a = tl.minimum(tl.maximum(a, -FMAX), FMAX)
        code = (a.to(tl.float8e4nv) if MBITS == 3 else a.to(tl.float8e5)).to(tl.uint8, bitcast=True).to(tl.int32)
    else:
        code = _encode_bits(x, a, u, MBITS, EMIN, FMAX, BITS, FNUZ, ROUNDING)
    return code, is_nan


@triton.jit
def _encode_bits(x, a, u, MBITS: tl.constexpr, EMIN: tl.constexpr, FMAX: tl.constexpr, BITS: tl.constexpr,
                 FNUZ: tl.constexpr, ROUNDING: tl.constexpr):
    """encode_scaled's software encode of a = x * mult, with x's sign."""
    negative = x.to(tl.int32, bitcast=True) < 0  # mult >= 0: the product's sign but for NaN
    a = tl.minimum(tl.abs(a), FMAX)
    field = tl.maximum(a.to(tl.int32, bitcast=True) >> 23, EMIN + 127)  # E + 127, a >= 0
    q = a * ((2 * 127 + MBITS - field) << 23).to(tl.float32, bitcast=True)  # a / 2**(E - mbits)
    t = q.to(tl.int32)  # q >= 0: truncation is floor
    if ROUNDING == 0:  # rne: the float32 add of 2**23 rounds q (< 2**(mbits + 1)) to an
        # integer, to nearest even, and leaves it in the low bits (2 instructions, not 7)
        r = (q + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
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
    return mag | sign


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
def _round_to_bf16(x):
    """float32 x rounded to bf16 (RNE, overflow to Inf), kept in float32: the integer form of
    the rounding, so Triton's interpreter, whose cast truncates, gives the GPU's bits."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -0x10000).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, rounded)


@triton.jit
def _block_offsets(n_blocks, rows, stride_row, stride_col, ROW_FASTEST: tl.constexpr, MX_BLOCK: tl.constexpr,
                   GROUPS: tl.constexpr, CONTIGUOUS: tl.constexpr, WIDE: tl.constexpr):
    """(x_offs, offs, sblk, in_range) of this program's GROUPS blocks of MX_BLOCK elements:
    their offsets into x, their offsets in the contiguous (rows, C) output, their block index
    there, and which blocks exist.

    Block blk is (row, block column) of the output; x is read through its strides: a
    transposed operand (stride_row 1) is read in place, with a program's blocks on
    consecutive rows so the loads are coalesced across them (ROW_FASTEST). Offsets are int64
    only where the tensor needs them (WIDE). Helpers take offsets and values, never a
    pointer: torch.compile's analysis of which arguments a user kernel writes then reads the
    loads and stores in the kernel itself (a pointer handed to a helper, it took as written
    and copied the input around every call)."""
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    blk = pid * GROUPS + tl.arange(0, GROUPS)
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
    return x_offs, offs, sblk, in_range


@triton.jit
def _rotate(x, GROUPS: tl.constexpr, MX_BLOCK: tl.constexpr, H_SIZE: tl.constexpr, H_LOG2: tl.constexpr,
            H_NORM: tl.constexpr, H_INPUT_BF16: tl.constexpr, H_SIGNS: tl.constexpr, H_OUTPUT_BF16: tl.constexpr):
    """x (GROUPS, MX_BLOCK) float32 rotated along each run of H_SIZE (none where H_SIZE is 1):
    hadamard.apply_hadamard's steps in float32, the input rounded to bf16 (H_INPUT_BF16),
    times the signs (bit i of H_SIGNS set: element i of each run is negated), the radix-2
    butterflies (pairs (i, i + h) of each 2h run -> (a + b, a - b)), one multiply by the
    norm, the output rounded to bf16 (H_OUTPUT_BF16)."""
    if H_SIZE > 1:
        if H_INPUT_BF16:
            x = _round_to_bf16(x)
        if H_SIGNS != 0:
            negated = (H_SIGNS >> (tl.arange(0, MX_BLOCK) % H_SIZE)) & 1
            x = x * tl.where(negated == 1, -1.0, 1.0)[None, :]
        for i in tl.static_range(H_LOG2):
            y = tl.permute(tl.reshape(x, (GROUPS * MX_BLOCK // (2 << i), 2, 1 << i)), (0, 2, 1))
            a, b = tl.split(y)
            y = tl.permute(tl.join(a + b, a - b), (0, 2, 1))
            x = tl.reshape(y, (GROUPS, MX_BLOCK))
        x = x * H_NORM
        if H_OUTPUT_BF16:
            x = _round_to_bf16(x)
    return x


@triton.jit
def blocks_amax(x_ptr, amax_ptr, n_blocks, rows, stride_row, stride_col, ROW_FASTEST: tl.constexpr,
                MX_BLOCK: tl.constexpr, GROUPS: tl.constexpr, H_SIZE: tl.constexpr, H_LOG2: tl.constexpr,
                H_NORM: tl.constexpr, H_INPUT_BF16: tl.constexpr, H_SIGNS: tl.constexpr,
                H_OUTPUT_BF16: tl.constexpr, CONTIGUOUS: tl.constexpr, WIDE: tl.constexpr):
    # max |x| over the whole (rotated) tensor, as the float32 bits of a value >= +0 in the
    # int32 at amax_ptr (zeroed by the caller): for those bits the integer order is the
    # float order, so an integer atomic max is the float max. A NaN is the quiet NaN
    # 0x7FC00000, above every other value: it propagates, as torch's amax.
    x_offs, _, _, in_range = _block_offsets(n_blocks, rows, stride_row, stride_col, ROW_FASTEST, MX_BLOCK, GROUPS,
                                            CONTIGUOUS, WIDE)
    x = tl.load(x_ptr + x_offs, mask=in_range[:, None], other=0.0).to(tl.float32)
    x = _rotate(x, GROUPS, MX_BLOCK, H_SIZE, H_LOG2, H_NORM, H_INPUT_BF16, H_SIGNS, H_OUTPUT_BF16)
    bits = tl.where(x != x, 0x7FC00000, tl.abs(x).to(tl.int32, bitcast=True))
    tl.atomic_max(amax_ptr, tl.max(tl.max(tl.where(in_range[:, None], bits, 0), axis=1), axis=0))


@triton.jit
def _f32_quotient(a, b):
    """a / b correctly rounded to float32 (float32 / is not, in Triton: div.full.f32). The
    float64 quotient rounded to float32 is: a double rounding is innocuous for a quotient of
    float32s."""
    return (a.to(tl.float64) / b.to(tl.float64)).to(tl.float32)


@triton.jit
def _nvfp4_block_scales(amax, g, rcp_e2m1_max, FLT_MAX: tl.constexpr, E2M1_X_E4M3: tl.constexpr):
    """(ue4m3 scale codes, S_dec) of blocks with float32 amax under the global amax g, as
    nvfp4.nvfp4_quantize computes them."""
    # _global_encode_scale: min(2688 / amax, FLT_MAX) (NaN kept), 1 where amax or it is 0
    s_enc = _f32_quotient(tl.full([], E2M1_X_E4M3, tl.float32), g)
    s_enc = tl.where(s_enc > FLT_MAX, FLT_MAX, s_enc)
    s_enc = tl.where((g == 0) | (s_enc == 0), 1.0, s_enc)
    # block scale: e4m3 RNE satfinite of amax * (S_enc * fl32(1/6)) (_encode_block_scales;
    # the FLT_MAX clamp is below the saturation), NaN 0x7F; amax >= +0 leaves no sign bit
    code, is_nan = encode_scaled(amax * (s_enc * rcp_e2m1_max), 1.0, 0.0, 3, -6, 448.0, 8, False, 0)
    return tl.where(is_nan, 0x7F, code), _f32_quotient(tl.full([], 1.0, tl.float32), s_enc)


@triton.jit
def _nvfp4_element_mult(scale, s_dec, FLT_MAX: tl.constexpr):
    """The element multiplier from the rounded block scale: min(1 / (s * S_dec), FLT_MAX), NaN kept."""
    enc = _f32_quotient(tl.full([], 1.0, tl.float32), scale * s_dec)
    return tl.where(enc > FLT_MAX, FLT_MAX, enc)


@triton.jit
def mx_quantize_blocks(x_ptr, u_ptr, scales_ptr, codes_ptr, global_ptr, ue4m3_ptr, rcp_e2m1_max, n_blocks, rows,
                       stride_row, stride_col,
                       ROW_FASTEST: tl.constexpr, MX_BLOCK: tl.constexpr, GROUPS: tl.constexpr, MBITS: tl.constexpr,
                       EMIN: tl.constexpr, EMAX: tl.constexpr, FMAX: tl.constexpr, BITS: tl.constexpr,
                       FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, RULE: tl.constexpr,
                       ROUNDING: tl.constexpr, RAND_BITS: tl.constexpr, ZERO_SCALE: tl.constexpr,
                       SCALES_GIVEN: tl.constexpr, H_SIZE: tl.constexpr, H_LOG2: tl.constexpr, H_NORM: tl.constexpr,
                       H_INPUT_BF16: tl.constexpr, H_SIGNS: tl.constexpr, H_OUTPUT_BF16: tl.constexpr,
                       TILE_ROWS: tl.constexpr, CONTIGUOUS: tl.constexpr, WIDE: tl.constexpr,
                       HW_CAST: tl.constexpr = False):
    # Codes, scales and u are contiguous in the (rows, C) output (_block_offsets). 2D tiles
    # (TILE_ROWS > 1, ROW_FASTEST) are TILE_ROWS consecutive blocks of a program, which share
    # their amax. RULE 0-3 are MX's E8M0 scale rules; RULE 4 is NVFP4: ue4m3 block scales
    # from the global amax at global_ptr (whose tensor scale program 0 writes after it).
    x_offs, offs, sblk, in_range = _block_offsets(n_blocks, rows, stride_row, stride_col, ROW_FASTEST, MX_BLOCK,
                                                  GROUPS, CONTIGUOUS, WIDE)
    x = tl.load(x_ptr + x_offs, mask=in_range[:, None], other=0.0).to(tl.float32)
    x = _rotate(x, GROUPS, MX_BLOCK, H_SIZE, H_LOG2, H_NORM, H_INPUT_BF16, H_SIGNS, H_OUTPUT_BF16)
    if ROUNDING == 3:
        if RAND_BITS:  # uint8 bits: u = bits / 256, exact (formats.uniforms)
            u = tl.load(u_ptr + offs, mask=in_range[:, None], other=0).to(tl.float64) * (1.0 / 256)
        else:
            u = tl.load(u_ptr + offs, mask=in_range[:, None], other=0.0)
    else:
        u = 0.0
    if SCALES_GIVEN:
        s = tl.load(scales_ptr + sblk, mask=in_range, other=0).to(tl.int32)
    else:
        # blocks.block_amax (2D tiles: the max of their rows' block maxima), as one integer
        # max over the bits of |x|: for values >= +0 the integer order is the float order,
        # and a NaN is above +Inf (0x7F800000)
        top = tl.max(tl.abs(x).to(tl.int32, bitcast=True), axis=1)
        if TILE_ROWS > 1:
            top = _tile_max(top, GROUPS, TILE_ROWS)
        amax = top.to(tl.float32, bitcast=True)
        has_nan = top > 0x7F800000
        if RULE == 4:
            g = tl.load(global_ptr).to(tl.float32, bitcast=True)
            s, s_dec = _nvfp4_block_scales(amax, g, rcp_e2m1_max, 3.4028234663852886e38, 2688.0)
            tl.store(scales_ptr + sblk, s.to(tl.uint8), mask=in_range)
            mult = _nvfp4_element_mult(tl.load(ue4m3_ptr + s), s_dec, 3.4028234663852886e38)
            if tl.program_id(0) == 0:  # the tensor scale amax / (6 * 448), beside the amax
                tl.store(global_ptr + 1, _f32_quotient(g, tl.full([], 2688.0, tl.float32)).to(tl.int32, bitcast=True))
        else:
            # rules.SCALE_RULES on the float32 bits of the block amax, then scale_bytes
            bits = top
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
    if RULE == 4:
        # NVFP4: x * enc saturated; a NaN (from a NaN anywhere: the global amax) is NAN_CODE
        code, is_nan = encode_scaled(x, mult[:, None], u, MBITS, EMIN, FMAX, BITS, FNUZ, ROUNDING)
        code = tl.where(is_nan, NAN_CODE, code)
    else:
        # x * 2**(127 - s), a power of two: s 255 gives NaN, and the block NaN code below
        inv_bits = tl.where(s < 254, (254 - s) << 23, tl.where(s == 254, 1 << 22, 0x7FC00000))
        mult = inv_bits.to(tl.float32, bitcast=True)[:, None]
        code, _ = encode_scaled(x, mult, u, MBITS, EMIN, FMAX, BITS, FNUZ, ROUNDING, HW_CAST)
        code = tl.where((s == 255)[:, None], NAN_CODE, code)
    tl.store(codes_ptr + offs, code.to(tl.uint8), mask=in_range[:, None])


@triton.jit
def _flat_offsets(n, WIDE: tl.constexpr, BLOCK: tl.constexpr):
    """(offs, mask): this program's BLOCK consecutive offsets, and which are below n; int64
    only where n needs them (WIDE)."""
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    return offs, offs < n


@triton.jit
def fp8_scaled_encode(x_ptr, scale_ptr, scale_value, rand_ptr, codes_ptr, n, k, stride_r, stride_c,
                      SCALE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, ROUNDING: tl.constexpr,
                      MBITS: tl.constexpr, EMIN: tl.constexpr, FMAX: tl.constexpr, BITS: tl.constexpr,
                      FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, NAN_SIGNED: tl.constexpr,
                      WIDE: tl.constexpr, BLOCK: tl.constexpr, HW_CAST: tl.constexpr = False):
    # x is (n / k, k), contiguous. SCALE: 0 the value scale_value (a scale held on the host),
    # 1 the one float32 at scale_ptr, 2 the scale of (row // ROWS, col // COLS) at those
    # strides (0 along a dimension one scale spans). Offsets are int64 only where n needs
    # them (WIDE): an int64 division by k costs several times the memory traffic. ROUNDING 0
    # is RNE; 3 is SR with u = rand / 256 from uint8 bits (formats.check_rounding), exact.
    offs, mask = _flat_offsets(n, WIDE, BLOCK)
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
    code, is_nan = encode_scaled(x, scale, u, MBITS, EMIN, FMAX, BITS, FNUZ, ROUNDING, HW_CAST)
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
    offs, mask = _flat_offsets(n, WIDE, BLOCK)
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


@triton.jit
def transpose_bytes(src_ptr, dst_ptr, rows, cols, TILE: tl.constexpr):
    # dst (cols, rows) = src (rows, cols)^T, both contiguous, one TILE x TILE tile a
    # program: the tile is loaded along src's rows and stored along dst's (coalesced both
    # ways; a byte-wise strided copy is not)
    r = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    c = tl.program_id(1).to(tl.int64) * TILE + tl.arange(0, TILE)
    tile = tl.load(src_ptr + r[:, None] * cols + c[None, :], mask=(r[:, None] < rows) & (c[None, :] < cols))
    tl.store(dst_ptr + c[:, None] * rows + r[None, :], tl.trans(tile), mask=(c[:, None] < cols) & (r[None, :] < rows))
