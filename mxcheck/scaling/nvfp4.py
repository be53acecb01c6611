"""NVFP4: e2m1 elements, one ue4m3 scale per 16 elements, and a float32 per-tensor scale.

The arithmetic is TransformerEngine's, operation for operation in float32:

- transformer_engine/pytorch/custom_recipes/reference_nvfp4.py @ 1498424bdc2a9953d3046735e763e1487320d520
  (``NVFP4QuantizerRef._quantize_blockwise_reference``)
- transformer_engine/common/cast/nvfp4/core_nvfp4.cuh @ 0718c016863048464893666999f6ae0cb64918db
  (``compute_global_encode_scaling_factor_FP4``, ``compute_decoding_scaling_factor``,
  ``compute_scaling_coefficient<float>``)
- transformer_engine/common/cast/nvfp4/dequantize_nvfp4.cuh @ 05f018392e819ec3cc7a6a966645fc4a616abb3a

::

    S_enc = min(fl32(448 * 6) / global_amax, FLT_MAX); 1.0 if global_amax == 0 or S_enc == 0
    S_dec = 1 / S_enc
    s     = ue4m3_rne_satfinite(min(vec_max * (S_enc * fl32(1/6)), FLT_MAX))   # the block scale
    enc   = min(1 / (fp32(s) * S_dec), FLT_MAX)
    code  = e2m1(clamp(x * enc, -6, 6))          # RNE, or SR from 8 random bits per element

Unlike torchao (which clamps block scales to >= 2**-6, the smallest e4m3 normal), TE keeps
ue4m3 subnormal and zero block scales; a zero block scale gives ``enc = FLT_MAX``.
NaN follows the reference (torch ``amax``/``min`` propagate NaN: a NaN anywhere makes the
global amax NaN, every block scale the NaN code 0x7F and every element code 0); TE's CUDA
kernels use ``fmaxf``/``fminf``, which skip NaN, a kernel detail not modelled here.
A -0.0 (or a negative that rounds to zero) keeps its sign (code 0x8), as the hardware
``cvt`` and torchao do; the reference's ``cast_to_fp4x2`` writes +0 for -0.0.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from mxcheck.formats import (
    FORMATS,
    check_quantize_input,
    check_rand,
    decode_table,
    encode_bits,
    uniforms,
)
from mxcheck.hadamard import Hadamard, apply_hadamard, check_length, get_hadamard
from mxcheck.scaling.blocks import block_amax, by_row_chunks, check_tiles, per_row
from mxcheck.scaling.fp8 import _host_float32 as _f32  # one cached 0-dim tensor per constant
from mxcheck.scaling.mx_cuda import dequantize_bf16, nvfp4_quantize_blocks, scaled_encode

__all__ = ["NVFP4_BLOCK", "NVFP4Tensor", "nvfp4_quantize"]

NVFP4_BLOCK = 16
_E2M1 = FORMATS["e2m1"]
_UE4M3 = FORMATS["ue4m3"]
_E4M3 = FORMATS["e4m3"]
_FLT_MAX = torch.finfo(torch.float32).max


def _ue4m3_values(device: torch.device) -> torch.Tensor:
    """float32 value of every ue4m3 code on device (one cached copy)."""
    return decode_table(_UE4M3, device, torch.float32)


@functools.cache
def _byte_values(fmt_name: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The value of every byte 0..255 read as a code of fmt, in dtype: the format's codes,
    then NaN for a byte past them (a kernel may write 0xFF, an e4m3 NaN with its sign bit, as
    a block scale, or set a 4-bit code's high bits): such a byte has no value, and a
    dequantization shows it as NaN instead of failing to index (one cached copy)."""
    table = decode_table(fmt_name, device, dtype)
    return torch.cat([table, torch.full((256 - len(table),), math.nan, dtype=dtype, device=device)])


# The product fp8_max * fp4_max is exact; 1/6 and 1/(6*448) are float32 constants as in the
# kernels (``constexpr float fp4_max_inv = 1.0f / 6.0f``, ``factor_inv = 1.0 / (6.0 * 448.0)``).
_E4M3_X_E2M1_MAX = _E4M3.max * _E2M1.max  # 2688
_RCP_E2M1_MAX = 1.0 / _E2M1.max


@dataclass(frozen=True, eq=False)
class NVFP4Tensor:
    """An NVFP4-quantized tensor.

    ``codes``: uint8 e2m1 codes, shape of x. ``block_scales``: uint8 ue4m3 codes, shape of x
    with the last dim divided by 16 (with ``block_2d`` each 16x16 tile's scale sits on each
    of its 16 rows). ``amax``: float32 global amax (TE's ``amax`` / ``global_amax_row``,
    taken after the Hadamard). ``tensor_scale``: float32 ``amax / (6 * 448)``, the
    per-tensor *decode* factor of TE (reference_nvfp4's dequantization and GEMM alpha,
    dequantize_nvfp4.cuh) and torchao's ``per_tensor_scale``; it is not TE's quantization
    ``S_dec = 1 / S_enc``, which can differ from it in the last bit. With ``hadamard`` the
    codes hold the rotated tensor, as a GEMM consumes it.
    """

    codes: torch.Tensor
    block_scales: torch.Tensor
    tensor_scale: torch.Tensor
    amax: torch.Tensor
    block_2d: bool = False
    hadamard: Hadamard | None = None

    def block_values(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``e2m1 * fp32(s)`` in dtype, exact in float32 and bf16 (at most 6 significant
        bits): what an NVFP4 GEMM multiplies before applying the tensor scales (TE's alpha).
        bf16 on CUDA is one fused pass (``mx_cuda.dequantize_bf16`` with the ue4m3 table)."""
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype={dtype!r}; expected a floating-point torch.dtype (float32 or bfloat16 hold "
                            "the values exactly)")
        if dtype == torch.bfloat16:
            device = self.codes.device
            fused = dequantize_bf16(self.codes, self.block_scales, decode_table(_E2M1, device, torch.float32),
                                    NVFP4_BLOCK, scale_table=_ue4m3_values(device))
            if fused is not None:
                return fused
        return self._times_block(self._scale_values().unsqueeze(-1)).to(dtype)

    def _scale_values(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return _byte_values(_UE4M3.name, self.codes.device, dtype)[self.block_scales.to(torch.int64)]

    def _times_block(self, factor: torch.Tensor) -> torch.Tensor:
        """e2m1 value * factor (one value per block of 16, shape (..., blocks, 1)), in factor's dtype."""
        table = _byte_values(_E2M1.name, self.codes.device, factor.dtype)
        codes = self.codes.unflatten(-1, (-1, NVFP4_BLOCK))
        if codes.ndim == 2:  # a 1D tensor: its blocks are the rows
            return (table[codes.to(torch.int32)] * factor).flatten(-2)
        return by_row_chunks(lambda c, f: table[c.to(torch.int32)] * f, codes, factor).flatten(-2)

    def decoded_factors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(e2m1 value, ue4m3 block scale, amax), float32, the first two per element (shaped
        like ``codes``): the three factors every dequantization order multiplies (a byte
        outside its format is NaN)."""
        e = _byte_values(_E2M1.name, self.codes.device, torch.float32)[self.codes.to(torch.int64)]
        s = self._scale_values().repeat_interleave(NVFP4_BLOCK, dim=-1)[..., : self.codes.shape[-1]]
        return e, s, self.amax.to(torch.float32)

    def dequantize(self) -> torch.Tensor:
        """float32 ``e2m1 * fp32(s) * amax / (6 * 448)``, the exact product rounded once.

        Why not a float32 order: every one rounds two or three times (TE's
        dequantize_nvfp4.cuh ``(fp32(s) * amax) * fl32(1/2688)``, torchao's and ModelOpt's
        ``s * (amax / 2688)``), each a last bit apart from the others on some elements, and
        TE's overflows to Inf above amax of about 7.6e35 where the true value (at most amax) is
        finite. The three factors multiply exactly in float64 (at most 2 + 4 + 24 significant
        bits), and their one division by 2688 = 2^7 * 21 lands either on a float32 midpoint
        exactly or at least 2^-29 (relative) from one, so the float32 cast of the float64
        quotient is the correctly rounded true value. Kernels are judged against every
        legitimate order (``conformance.values``)."""
        factor = (self._scale_values(torch.float64) * self.amax.to(torch.float64)).unsqueeze(-1)
        return (self._times_block(factor) / _E4M3_X_E2M1_MAX).to(torch.float32)


def _global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """core_nvfp4.cuh compute_global_encode_scaling_factor_FP4 (NaN propagates, as the reference)."""
    s_enc = torch.minimum(_f32(_E4M3_X_E2M1_MAX) / amax, _f32(_FLT_MAX))
    # ones on amax's device: where() copies a host tensor there, and the copy waits for the GPU
    return torch.where((amax == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)


def te_block_scale(vec_max: torch.Tensor, s_enc: torch.Tensor) -> torch.Tensor:
    """float32 block scale before its ue4m3 cast: vec_max * (S_enc * fl32(1/6)), min FLT_MAX."""
    return torch.minimum(vec_max * (s_enc * _f32(_RCP_E2M1_MAX)), _f32(_FLT_MAX))


def te_encode_scale(s_blk: torch.Tensor, s_dec: torch.Tensor) -> torch.Tensor:
    """float32 per-block element multiplier from the rounded block scale: min(1 / (s * S_dec), FLT_MAX)."""
    return torch.minimum(1.0 / (s_blk * s_dec), _f32(_FLT_MAX))


def rotate_rows(x: torch.Tensor, rot: Hadamard) -> torch.Tensor:
    """x rotated along its last dim in float32 on row chunks, kept in the dtype the rotation
    rounds its output to (TE's RHT: bf16, which holds those values exactly)."""
    kept = rot.round_output_to or torch.float32
    return by_row_chunks(lambda t: apply_hadamard(t.to(torch.float32), rot, axis=-1).to(kept), x)


def _encode_block_scales(s_f32: torch.Tensor, rounding: str = "rne") -> torch.Tensor:
    """ue4m3 codes of the float32 block scales (RNE, satfinite). They are >= 0 or NaN, so the
    e4m3 codes (the fused pass on CUDA, the float path elsewhere, lighter than the unsigned
    integer path) are theirs but for the sign bit, which ue4m3 does not have: it is cleared
    (a NaN's code is then 0x7F; a zero block's amax can be -0.0, as ``torch.maximum(hi,
    -lo)`` keeps either zero, and its code 0). tests/test_nvfp4.py holds this to the ue4m3
    encode on every value, midpoint and neighbour. ``rounding`` other than RNE (a profile's
    ``block_scale_rounding``) takes the float path."""
    codes = scaled_encode(s_f32, torch.ones(()), _E4M3, None, None) if rounding == "rne" else None
    return (encode_bits(s_f32, _E4M3, rounding, True) if codes is None else codes).bitwise_and_(0x7F)


def _check_args(x: torch.Tensor, block_2d: bool) -> None:
    check_quantize_input(x, "nvfp4_quantize")
    if not isinstance(block_2d, bool):
        raise TypeError(f"block_2d must be a bool, got {type(block_2d).__name__}")
    if x.ndim < (2 if block_2d else 1):
        raise ValueError(f"x of shape {tuple(x.shape)} has too few dims; nvfp4_quantize needs "
                         f"{'2 (16x16 tiles)' if block_2d else '1'} or more")
    check_tiles(x.shape[-1], NVFP4_BLOCK, f"x dim -1 (K) of shape {tuple(x.shape)}", pad_hint=False)
    if block_2d:
        check_tiles(x.shape[-2], NVFP4_BLOCK, f"x dim -2 (rows, for 16x16 tiles) of shape {tuple(x.shape)}",
                    pad_hint=False)


def nvfp4_quantize(
    x: torch.Tensor,
    *,
    block_2d: bool = False,
    hadamard: str | Hadamard | None = None,
    rand: torch.Tensor | None = None,
) -> NVFP4Tensor:
    """Quantize x (float32, bfloat16 or float16; last dim a multiple of 16) to NVFP4.

    ``block_2d``: 16x16 tiles over the last two dims share a scale (TE's weights).
    ``hadamard``: a rotation (e.g. ``"h16_te"``, TE's RHT) applied along the last dim
    before the amax; TE applies it to the columnwise (wgrad) copy, so pass the transposed
    tensor. ``rand``: uint8 random bits per element (shape of x) for stochastic rounding of
    the elements, as TE's SR fallback (round away iff frac + bits/256 >= 1); None is RNE.
    """
    _check_args(x, block_2d)
    if rand is not None:
        check_rand(rand, x)
    rot = get_hadamard(hadamard)
    if rot is not None:  # here, not only in apply_hadamard: the fused path rotates in its kernel
        check_length(x.shape[-1], rot, -1)
    scale_shape = (*x.shape[:-1], x.shape[-1] // NVFP4_BLOCK)
    # On CUDA two fused passes (mx_cuda.nvfp4_quantize_blocks: the global amax, then block
    # scales and codes, rotation included), the same bits as the torch passes below
    # (tests/test_nvfp4_fused.py).
    x2d = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])
    fused = nvfp4_quantize_blocks(x2d, _E2M1, _ue4m3_values(x.device), _RCP_E2M1_MAX, block_2d=block_2d,
                                  hadamard=rot, rand=None if rand is None else rand.reshape(x2d.shape))
    if fused is not None:
        codes, block_scales, amax, tensor_scale = fused
        if x.ndim != 2:
            codes, block_scales = codes.reshape(x.shape), block_scales.reshape(scale_shape)
        return NVFP4Tensor(codes=codes, block_scales=block_scales,
                           tensor_scale=tensor_scale, amax=amax, block_2d=block_2d, hadamard=rot)
    # Blocks are (..., rows, cols): a 1D input is one row. x keeps its dtype (amax is exact
    # there) unless rotated (rotate_rows).
    work = x if x.ndim >= 2 else x.unsqueeze(0)
    if rot is not None:
        work = rotate_rows(work, rot)

    # 1. Global amax and the global encode / decode scales.
    amax = block_amax(work.reshape(1, -1), 1, work.numel()).reshape(()) if work.numel() else torch.zeros((), device=x.device)
    s_enc = _global_encode_scale(amax)
    s_dec = 1.0 / s_enc
    # 2. Block scales: vec_max * (S_enc * fl32(1/6)), min FLT_MAX, ue4m3 RNE satfinite.
    rows = NVFP4_BLOCK if block_2d else 1
    vec_max = per_row(block_amax(work, rows, NVFP4_BLOCK), rows)
    s_f32 = te_block_scale(vec_max, s_enc)
    block_scales = _encode_block_scales(s_f32)
    # 3. Per-block encode scale from the *rounded* block scale, then the elements.
    s_blk = _ue4m3_values(x.device)[block_scales.to(torch.int64)]
    enc = te_encode_scale(s_blk, s_dec).unsqueeze(-1)
    rounding = "rne" if rand is None else "sr"

    def encode(xc: torch.Tensor, ec: torch.Tensor, rc: torch.Tensor | None) -> torch.Tensor:
        # x * enc in float32 (a float16 x widened first, as the reference reads it), clamped
        scaled = torch.clamp(xc.to(torch.float32) * ec, -_E2M1.max, _E2M1.max)
        return encode_bits(scaled, _E2M1, rounding, True, None if rc is None else uniforms(rc))

    # On CUDA one fused pass (mx_cuda.scaled_encode: x * enc, saturated, RNE or SR from the
    # uint8 bits), the same bits as the torch passes below (tests/test_nvfp4_fused.py).
    work2d = work.reshape(-1, work.shape[-1])
    codes = scaled_encode(work2d, enc.reshape(-1, enc.shape[-2]), _E2M1, 1, NVFP4_BLOCK,
                          None if rand is None else rand.reshape(work2d.shape))
    if codes is None:
        blocks = work.unflatten(-1, (-1, NVFP4_BLOCK))
        r = None if rand is None else rand.reshape(work.shape).unflatten(-1, (-1, NVFP4_BLOCK))
        codes = by_row_chunks(encode, blocks, enc, r).flatten(-2)
    return NVFP4Tensor(
        codes=codes.reshape(x.shape),
        block_scales=block_scales.reshape(scale_shape),
        # the divisor on amax's device (a fill, no host copy): CUDA divides by a CPU scalar as
        # a multiply by its reciprocal (aten BinaryDivTrueKernel.cu), one ulp off at times
        tensor_scale=amax / torch.full_like(amax, _E4M3_X_E2M1_MAX),
        amax=amax,
        block_2d=block_2d,
        hadamard=rot,
    )
