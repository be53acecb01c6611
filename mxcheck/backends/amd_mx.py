"""What the AMD MX adapters (AITER, Primus-Turbo) share: whether a vendor kernel can run
here (the package imports and the device is an MI355X), and MX operands in and out of the
vendors' layouts (2D, blocked axis last, 1x32 blocks), with the spec checks that refuse what
a vendor quantizer cannot produce."""

from __future__ import annotations

from typing import Any

import torch

from mxcheck import hardware
from mxcheck.backends import import_vendor
from mxcheck.backends.contract import Refusal
from mxcheck.formats import get_format
from mxcheck.hadamard import get_hadamard
from mxcheck.recipes import OperandSpec
from mxcheck.scaling.mx import MXTensor

__all__ = ["check_nt_pair", "check_spec", "gfx950_missing", "mx_operand", "mx_tensor", "vendor_available"]


def gfx950_missing(what: str) -> str | None:
    """Why this machine cannot run a gfx950 kernel (from mxcheck.hardware), or None."""
    hw = hardware.detect()
    if hw.vendor == "amd" and hw.arch == "gfx950":
        return None
    return f"{what} needs an AMD MI355X (gfx950); this machine has {hw.describe()}"


def vendor_available(module: str, what: str) -> tuple[bool, str]:
    """(True, "") when ``module`` imports and the device is gfx950, else every reason why not."""
    reasons = [why] if (why := import_vendor(module)) is not None else []
    if (why := gfx950_missing(what)) is not None:
        reasons.append(why)
    return (not reasons), "; ".join(reasons)


def mx_operand(q: MXTensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [rows, K], E8M0 bytes [rows, K/32]) of a 2D MXTensor, blocked axis last (NT)."""
    if not isinstance(q, MXTensor):
        raise TypeError(f"{name} must be an MXTensor (from quantize or mxcheck.mx_quantize), got {type(q).__name__}")
    if q.codes.dim() != 2 or q.block_size != 32:
        raise Refusal(f"{name}: expected a 2D MXTensor in 32-blocks, got codes {tuple(q.codes.shape)} "
                         f"block_size={q.block_size}")
    return q.codes.movedim(q.axis, -1).contiguous(), q.scales.movedim(q.axis, -1).contiguous()


def mx_tensor(codes: torch.Tensor, scales: torch.Tensor, spec: OperandSpec,
              shape: tuple[int, ...]) -> MXTensor:
    """An MXTensor along the last axis from a vendor's codes, padded to ``spec.pad_to`` with
    code 0 and ``spec.zero_scale`` (what the vendor quantizers give an all-zero block)."""
    if spec.pad_to is not None and codes.shape[-1] % spec.pad_to:
        extra = -codes.shape[-1] % spec.pad_to
        codes = torch.nn.functional.pad(codes, (0, extra))
        scales = torch.nn.functional.pad(scales, (0, extra // 32), value=spec.zero_scale)
    return MXTensor(codes=codes, scales=scales, fmt=get_format(spec.fmt), block_size=32, axis=codes.dim() - 1,
                    shape=tuple(shape), scale_rule=spec.scale_rule, rounding=spec.rounding,
                    block_2d=spec.block_2d, hadamard=get_hadamard(spec.hadamard), zero_scale=spec.zero_scale)


def check_nt_pair(a: MXTensor, b: MXTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both operands' (codes, scales), checked to share format, K and rotation."""
    ac, asc = mx_operand(a, "a")
    bc, bsc = mx_operand(b, "b")
    if a.fmt.name != b.fmt.name:
        raise Refusal(f"a is {a.fmt.name} and b is {b.fmt.name}; this GEMM takes one format for both")
    if ac.shape[1] != bc.shape[1]:
        raise ValueError(f"K mismatch: a has K={ac.shape[1]} and b has K={bc.shape[1]} (padded codes); "
                         "quantize both with the same pad_to")
    if a.hadamard != b.hadamard:
        raise Refusal(f"a and b carry different rotations along K ({a.hadamard} vs {b.hadamard}); "
                         "(A R)(B R)^T = A B^T only when both are rotated alike")
    return ac, asc, bc, bsc


def check_spec(spec: OperandSpec, want: dict[str, Any], who: str, *, allow_2d: bool = False) -> None:
    """ValueError naming the first spec field a vendor quantizer cannot honour."""
    if spec.scaling != "mx" or spec.block_size != 32 or (spec.block_2d and not allow_2d):
        raise Refusal(f"{who} quantizes 1x32 MX blocks; spec has scaling={spec.scaling!r} "
                         f"block_size={spec.block_size} block_2d={spec.block_2d}")
    for field, value in want.items():
        got = getattr(spec, field)
        if field == "hadamard":
            got, value = get_hadamard(got), get_hadamard(value)
        if got != value:
            raise Refusal(f"{who} produces {field}={value!r} for {spec.fmt}; the spec asks for {got!r}. "
                             "Quantize with mxcheck.mx_quantize and pass the MXTensor to gemm instead")
