"""Triton ``tl.dot_scaled`` MX GEMMs (MXFP4 e2m1, MXFP8 e4m3/e5m2), NT convention.

On Hopper (sm90) Triton lowers ``dot_scaled`` by upcasting the operands to bf16 and
running a bf16 MMA with fp32 accumulation; on sm100 it uses the native block-scaled MMA.
Operands arrive as ``MXTensor`` (one code per element, E8M0 bytes per 32-block along K);
the kernel reads fp4 packed two per byte (low nibble = even index), as ``MXTensor.pack``.
"""

from __future__ import annotations

from typing import Any

import torch

from mxcheck import hardware
from mxcheck.backends import import_vendor
from mxcheck.backends.contract import Refusal
from mxcheck.scaling.mx import MXTensor

__all__ = ["TritonMXBackend", "triton_mx_gemm"]

_TRITON_FORMATS = {"e2m1": "e2m1", "e4m3": "e4m3", "e5m2": "e5m2"}
_kernel_cache: dict[str, Any] = {}


def _kernel() -> Any:
    if "k" in _kernel_cache:
        return _kernel_cache["k"]
    import triton  # noqa: PLC0415  (vendor packages load late)
    import triton.language as tl  # noqa: PLC0415

    @triton.jit
    def mx_gemm_nt(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, M, N, K,
                   stride_am, stride_bn, stride_as, stride_bs, stride_cm,
                   FMT_A: tl.constexpr, FMT_B: tl.constexpr, PACK_A: tl.constexpr, PACK_B: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_ka = tl.arange(0, BLOCK_K // PACK_A)
        offs_kb = tl.arange(0, BLOCK_K // PACK_B)
        offs_ks = tl.arange(0, BLOCK_K // 32)
        mask_m = offs_m < M
        mask_n = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = tl.load(a_ptr + offs_m[:, None] * stride_am + (k0 // PACK_A + offs_ka)[None, :],
                        mask=mask_m[:, None], other=0)
            # b is stored [N, K/PACK]; dot_scaled wants rhs as [K/PACK, N]
            b = tl.load(b_ptr + offs_n[None, :] * stride_bn + (k0 // PACK_B + offs_kb)[:, None],
                        mask=mask_n[None, :], other=0)
            sa = tl.load(a_scale_ptr + offs_m[:, None] * stride_as + (k0 // 32 + offs_ks)[None, :],
                         mask=mask_m[:, None], other=127)
            sb = tl.load(b_scale_ptr + offs_n[:, None] * stride_bs + (k0 // 32 + offs_ks)[None, :],
                         mask=mask_n[:, None], other=127)
            acc = tl.dot_scaled(a, sa, FMT_A, b, sb, FMT_B, acc)
        c = acc.to(c_ptr.dtype.element_ty)
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], c,
                 mask=mask_m[:, None] & mask_n[None, :])

    _kernel_cache["k"] = mx_gemm_nt
    return mx_gemm_nt


def _operand(q: MXTensor, name: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    if q.fmt.name not in _TRITON_FORMATS or q.block_size != 32 or q.axis != q.codes.ndim - 1:
        raise Refusal(f"{name}: triton dot_scaled takes e2m1/e4m3/e5m2 in 32-blocks along the last "
                         f"axis, got fmt={q.fmt.name} block_size={q.block_size} axis={q.axis}")
    data = q.pack().contiguous()
    return data, q.scales.contiguous(), 8 // q.fmt.bits  # codes per byte: fp4 2, fp8 1


def triton_mx_gemm(a: MXTensor, b: MXTensor, *, out_dtype: torch.dtype = torch.bfloat16,
                   block_k: int = 128) -> torch.Tensor:
    """a[M, K] @ b[N, K]^T from MX operands with ``tl.dot_scaled`` (fp32 accumulation)."""
    a_data, a_scales, pack_a = _operand(a, "a")
    b_data, b_scales, pack_b = _operand(b, "b")
    m, k = a.codes.shape
    n, kb = b.codes.shape
    if k != kb or k % block_k:
        raise Refusal(f"K of a ({k}) and b ({kb}) must match and be a multiple of {block_k}")
    c = torch.empty(m, n, dtype=out_dtype, device=a.codes.device)
    block_m, block_n = 128, 128
    grid = ((m + block_m - 1) // block_m, (n + block_n - 1) // block_n)
    _kernel()[grid](a_data, a_scales, b_data, b_scales, c, m, n, k,
                    a_data.stride(0), b_data.stride(0), a_scales.stride(0), b_scales.stride(0), c.stride(0),
                    _TRITON_FORMATS[a.fmt.name], _TRITON_FORMATS[b.fmt.name], pack_a, pack_b,
                    block_m, block_n, block_k)
    return c


class TritonMXBackend:
    """GEMMs through Triton's ``tl.dot_scaled`` on an NVIDIA GPU (sm90 or newer)."""

    name = "triton"
    device = "cuda"

    def available(self) -> tuple[bool, str]:
        if (why := import_vendor("triton")) is not None:
            return False, why
        hw = hardware.detect()
        if hw.vendor != "nvidia":
            return False, f"needs an NVIDIA GPU (sm90+); this machine has {hw.describe()}"
        if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
            return False, f"needs sm90 or newer; found {hw.arch}"
        return True, ""

    def supports(self, recipe: Any) -> tuple[bool, str]:
        for op in ("x_row", "w_row", "g_row", "w_col", "g_col", "x_col"):
            spec = recipe.spec(op)
            if spec.scaling != "mx" or spec.fmt not in _TRITON_FORMATS:
                return False, f"{op}: triton dot_scaled takes MX e2m1/e4m3/e5m2, got {spec.scaling} {spec.fmt}"
        return True, ""

    def gemm(self, a: MXTensor, b: MXTensor, *, out_dtype: torch.dtype = torch.bfloat16,
             bias: torch.Tensor | None = None) -> torch.Tensor:
        out = triton_mx_gemm(a, b, out_dtype=torch.float32)
        if bias is not None:
            out = out + bias.float()
        return out.to(out_dtype)
