"""One-pass MX dequantization to bf16 on CUDA with Triton (the emulated GEMM's fast path).

The torch path (``MXTensor.dequantize``) makes several full-size passes (index cast, table
gather, scale broadcast, multiply); this kernel reads each code and its block's E8M0 byte
once and writes the bf16 value once. Same arithmetic, so the same bits: the element from
the format's decode table times ``2**(s - 127)`` built from bits (byte 0: 2**-127, 255:
NaN) in float32, exact, then one cast to bf16 (exact where ``mx_fits_bf16``). Without
Triton, or off CUDA, ``dequantize_bf16`` returns None and the caller uses the torch path.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["dequantize_bf16"]

_cache: dict[str, Any] = {}
_BLOCK = 2048


def _kernel() -> Any:
    if "k" in _cache:
        return _cache["k"]
    try:
        import triton  # noqa: PLC0415  (optional, CUDA only)
        import triton.language as tl  # noqa: PLC0415
    except ImportError:
        _cache["k"] = None
        return None

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

    _cache["k"] = mx_dequant_bf16
    return mx_dequant_bf16


def dequantize_bf16(codes: torch.Tensor, scales: torch.Tensor, table: torch.Tensor,
                    block_size: int) -> torch.Tensor | None:
    """bf16 ``table[codes] * 2**(scales - 127)`` per ``block_size`` run of the last axis, or
    None when the kernel cannot run here (no Triton, not CUDA)."""
    if not codes.is_cuda:
        return None
    kernel = _kernel()
    if kernel is None:
        return None
    codes, scales = codes.contiguous(), scales.contiguous()
    k = codes.shape[-1]
    out = torch.empty(codes.shape, dtype=torch.bfloat16, device=codes.device)
    n = codes.numel()
    if n:
        kernel[((n + _BLOCK - 1) // _BLOCK,)](codes, scales, table.to(torch.float32).contiguous(), out, n, k,
                                              scales.shape[-1], MX_BLOCK=block_size, BLOCK=_BLOCK)
    return out
