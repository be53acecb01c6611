"""PyTorch's ``torch._scaled_mm`` FP8 GEMM (cuBLASLt) behind the Backend protocol, NT convention.

``torch._scaled_mm(a, b, scale_a, scale_b, bias, out_dtype)`` computes
``(a * scale_a) @ (b * scale_b) + bias`` with fp32 accumulation, where ``a`` is row-major
``[M, K]`` and ``b`` column-major ``[K, N]`` (the transpose of a contiguous ``[N, K]``):
so an NT operand pair ``a[M, K]``, ``b[N, K]`` goes in as ``a``, ``b.t()``. The scales are
dequantization multipliers (mxcheck's ``scale_inv``): tensorwise both of shape ``()``, or
rowwise ``(M, 1)`` and ``(1, N)``; torch allows rowwise only with both operands
``float8_e4m3fn`` and not both operands e5m2. MX (E8M0 block) scales need sm100
(Blackwell) in torch and are not wired here.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from mxcheck import hardware
from mxcheck.backends.contract import Refusal
from mxcheck.recipes import Recipe, get_recipe
from mxcheck.scaling.fp8 import FP8Tensor

__all__ = ["MIN_CAPABILITY", "TorchScaledMMBackend", "capability", "scaled_mm_nt"]

MIN_CAPABILITY = (8, 9)  # Ada (sm89) and Hopper (sm90): the first chips with FP8 tensor cores
_GRANULARITIES = ("tensor", "row")
_ARCH = re.compile(r"^sm(\d+)(\d)$")


def capability(arch: str) -> tuple[int, int] | None:
    """(major, minor) of an NVIDIA arch name from mxcheck.hardware ("sm90" -> (9, 0)), or None."""
    m = _ARCH.match(arch)
    return (int(m.group(1)), int(m.group(2))) if m else None


def nvidia_missing(what: str, minimum: tuple[int, int]) -> str | None:
    """Why this machine cannot run ``what`` (needs an NVIDIA GPU of ``minimum`` or newer), or None."""
    hw = hardware.detect()
    need = f"sm{minimum[0]}{minimum[1]}"
    if hw.vendor != "nvidia":
        return f"{what} needs CUDA and an NVIDIA GPU of compute capability {minimum} ({need}) or newer; " \
               f"this machine has {hw.describe()}"
    cap = capability(hw.arch)
    if cap is None or cap < minimum:
        return f"{what} needs compute capability {minimum} ({need}) or newer; found {hw.arch} ({hw.describe()})"
    return None


def _check_operand(q: Any, name: str) -> None:
    if not isinstance(q, FP8Tensor):
        raise TypeError(f"{name} must be an FP8Tensor (mxcheck.fp8_quantize / quantize_operand), "
                        f"got {type(q).__name__}")
    if q.codes.dim() != 2:
        raise ValueError(f"{name}: expected 2D codes [rows, K], got shape {tuple(q.codes.shape)}")
    if q.granularity not in _GRANULARITIES:
        raise Refusal(f"{name}: torch._scaled_mm takes tensorwise or rowwise scales here, got "
                         f"granularity={q.granularity!r}")
    if q.fmt.torch_dtype is None:
        raise Refusal(f"{name}: this torch build has no dtype for {q.fmt.name}")


def scaled_mm_nt(a: FP8Tensor, b: FP8Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """a[M, K] @ b[N, K]^T (+ bias) with ``torch._scaled_mm`` (fp32 accumulation)."""
    _check_operand(a, "a")
    _check_operand(b, "b")
    m, k = a.codes.shape
    n, kb = b.codes.shape
    if k != kb:
        raise ValueError(f"K mismatch: a is {tuple(a.codes.shape)}, b is {tuple(b.codes.shape)} (NT: b is [N, K])")
    if k % 16 or n % 16:  # cuBLASLt FP8: else a RuntimeError from inside torch, not naming the dim
        raise Refusal(f"torch._scaled_mm (cuBLASLt FP8) needs K and N multiples of 16; got M={m} N={n} K={k}")
    if a.granularity != b.granularity:
        raise Refusal(f"a is {a.granularity}-scaled and b is {b.granularity}-scaled; torch._scaled_mm "
                         "takes both tensorwise or both rowwise")
    if a.fmt.name == "e5m2" and b.fmt.name == "e5m2":
        raise Refusal("torch._scaled_mm (cuBLASLt) has no e5m2 x e5m2 GEMM; one operand must be e4m3")
    if a.granularity == "row" and (a.fmt.name, b.fmt.name) != ("e4m3", "e4m3"):
        raise Refusal(f"torch._scaled_mm rowwise scaling takes e4m3 x e4m3, got {a.fmt.name} x {b.fmt.name}")
    a8 = a.codes.contiguous().view(a.fmt.torch_dtype)
    b8 = b.codes.contiguous().view(b.fmt.torch_dtype)  # [N, K] row-major; .t() is [K, N] column-major
    sa = a.scale_inv.to(torch.float32)
    sb = b.scale_inv.to(torch.float32)
    if a.granularity == "row":
        sa, sb = sa.reshape(m, 1).contiguous(), sb.reshape(1, n).contiguous()
    kw = {} if bias is None else {"bias": bias.to(out_dtype)}
    return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype, **kw)


class TorchScaledMMBackend:
    """FP8 tensorwise / rowwise GEMMs through ``torch._scaled_mm`` on sm89 or newer (gemm only)."""

    name = "torch"
    device = "cuda"

    def available(self) -> tuple[bool, str]:
        reasons = []
        if not hasattr(torch, "_scaled_mm"):
            reasons.append(f"torch {torch.__version__} has no torch._scaled_mm")
        if (why := nvidia_missing("torch._scaled_mm FP8", MIN_CAPABILITY)) is not None:
            reasons.append(why)
        return (not reasons), "; ".join(reasons)

    def supports(self, recipe: Recipe | str) -> tuple[bool, str]:
        """Forward operands (x_row, w_row) FP8 with tensorwise or rowwise (e4m3 only) scales."""
        r = get_recipe(recipe)
        specs = {op: r.spec(op) for op in ("x_row", "w_row")}
        for op, s in specs.items():
            if s.scaling in ("mx", "nvfp4"):
                return False, (f"torch: recipe {r.name} {op} is {s.scaling} ({s.fmt}); torch._scaled_mm's "
                               "block-scaled (E8M0 / E4M3 block) GEMMs need sm100 (Blackwell) and are not "
                               "wired here")
            if s.scaling == "delayed":
                return False, (f"torch: recipe {r.name} {op} uses delayed scaling, which needs an amax "
                               "history; quantize with mxcheck DelayedScaling and call gemm() directly "
                               "(its FP8Tensors are tensorwise)")
            if s.scaling not in _GRANULARITIES:
                return False, (f"torch: recipe {r.name} {op} is {s.fmt} scaling={s.scaling!r}; torch._scaled_mm "
                               "is wired here for FP8 tensorwise ('tensor') and rowwise ('row') scales")
        fmts = (specs["x_row"].fmt, specs["w_row"].fmt)
        grans = {s.scaling for s in specs.values()}
        if len(grans) > 1:
            return False, f"torch: recipe {r.name} mixes {sorted(grans)} scales in the forward GEMM"
        if fmts == ("e5m2", "e5m2"):
            return False, f"torch: recipe {r.name} forward is e5m2 x e5m2, which cuBLASLt has no GEMM for"
        if grans == {"row"} and fmts != ("e4m3", "e4m3"):
            return False, f"torch: rowwise torch._scaled_mm takes e4m3 x e4m3; recipe {r.name} has {fmts}"
        return True, ""

    def gemm(self, a: FP8Tensor, b: FP8Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
             bias: torch.Tensor | None = None) -> torch.Tensor:
        """a[M, K] @ b[N, K]^T (+ bias) from FP8Tensors on torch._scaled_mm."""
        return scaled_mm_nt(a, b, out_dtype=out_dtype, bias=bias)
