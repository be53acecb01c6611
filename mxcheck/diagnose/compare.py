"""Comparing a quantized tensor with another, field by field and block by block.

The primitives attribution (``quantize``) and the fit (``fit``) share: which fields of the
contract are compared (scales first), their bits (any NaN equals any NaN in a float
field; codes under a NaN block scale are not compared), the block each element belongs
to, and restricting a comparison to some rows.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from mxcheck.scaling.fp8 import FP8Tensor
from mxcheck.scaling.mx import MXTensor
from mxcheck.scaling.nvfp4 import NVFP4Tensor
from mxcheck.scaling.rules import E8M0_NAN

__all__ = ["QUANTIZE_FIELDS", "compared_fields", "field_problem", "nan_scale_blocks"]

QUANTIZE_FIELDS = ("tensor_scale", "scale_inv", "scales", "block_scales", "codes")
_BLOCK_FIELDS = ("scales", "block_scales", "scale_inv")  # the field whose entries are the blocks
def compared_fields(oracle: Any) -> tuple[str, ...]:
    return tuple(f for f in QUANTIZE_FIELDS if isinstance(getattr(oracle, f, None), torch.Tensor))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Integer bits of t, so signs and -0 count; every NaN of a float field is one NaN (its
    payload and sign are not part of the contract: any NaN equals any NaN)."""
    t = t.detach().cpu()
    if t.dtype.is_floating_point:
        t = torch.where(torch.isnan(t), torch.tensor(math.nan, dtype=t.dtype), t)
        return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).to(torch.int64)
    return t.to(torch.int64)


def _expand(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A per-block field spread over the elements it scales (a 0-dim one over all)."""
    if t.ndim == 0:
        return t.expand(shape)
    for dim, (have, want) in enumerate(zip(t.shape, shape, strict=True)):
        if have != want:
            t = t.repeat_interleave(-(-want // have), dim=dim).narrow(dim, 0, want)
    return t


def _block_ids(oracle: Any) -> tuple[str, torch.Tensor, int]:
    """(block field, block index of every element, number of blocks)."""
    codes = oracle.codes
    name = next((f for f in _BLOCK_FIELDS if isinstance(getattr(oracle, f, None), torch.Tensor)), None)
    if name is None or getattr(oracle, name).ndim == 0:  # one scale for the tensor: rows are the units
        rows = codes.shape[0] if codes.ndim else 1
        return "rows", torch.arange(rows).reshape(-1, *[1] * (codes.ndim - 1)).expand(codes.shape), rows
    scale = getattr(oracle, name)
    ids = torch.arange(scale.numel()).reshape(scale.shape)
    return name, _expand(ids, codes.shape), scale.numel()


def nan_scale_blocks(q: Any) -> torch.Tensor | None:
    """Per block, its scale is NaN (MX: E8M0 byte 0xFF; NVFP4: the ue4m3 NaN 0x7F, either
    sign bit), or None for a tensor with no block scales."""
    if isinstance(q, MXTensor) and isinstance(q.scales, torch.Tensor):
        return q.scales == E8M0_NAN
    if isinstance(q, NVFP4Tensor) and isinstance(q.block_scales, torch.Tensor):
        return (q.block_scales & 0x7F) == 0x7F
    return None


def _nan_blocks(q: Any) -> torch.Tensor | None:
    """Elements of blocks whose scale is NaN: every element decodes to NaN (OCP MX 6.3; an
    NVFP4 block scale of 0x7F), so their codes are not part of the contract (check_quantize
    does the same)."""
    nan = nan_scale_blocks(q)
    return None if nan is None else _expand(nan.cpu(), q.codes.shape)


def field_problem(name: str, got: Any, want: torch.Tensor) -> str:
    if not isinstance(got, torch.Tensor):
        return f"{name} is {type(got).__name__}, expected a tensor"
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return f"{name} is {got.dtype} {list(got.shape)}, expected {want.dtype} {list(want.shape)}"
    return ""


def _element_diffs(q: Any, oracle: Any, fields: tuple[str, ...]) -> dict[str, torch.Tensor] | str:
    """Per field, where q differs from oracle, spread over the elements; or what is wrong with q."""
    out, shape = {}, oracle.codes.shape
    skip = _nan_blocks(oracle)
    other = _nan_blocks(q)
    skip = skip if other is None else other if skip is None else skip & other
    for name in fields:
        got, want = getattr(q, name, None), getattr(oracle, name)
        if problem := field_problem(name, got, want):
            return problem
        diff = _expand(_bits(got) != _bits(want), shape)
        if name == "codes" and skip is not None:
            diff = diff & ~skip
        out[name] = diff
    return out


def _per_block(mask: torch.Tensor, ids: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int64).index_add_(0, ids.flatten(), mask.flatten().to(torch.int64)) > 0


def _cpu(q: Any) -> Any:
    """q with its tensor fields on the CPU (a report reads them element by element)."""
    if not hasattr(q, "__dataclass_fields__"):
        return q
    moved = {f: getattr(q, f).cpu() for f in q.__dataclass_fields__ if isinstance(getattr(q, f), torch.Tensor)}
    return replace(q, **moved) if moved else q


def _row_separable(q: Any) -> bool:
    """A behaviour may run on some rows: blocks lie within rows (1D MX and NVFP4 blocks, FP8
    rows, tensors and 1x128 blocks), and a per-tensor amax is kept by the anchor rows
    (``_anchor_rows``). Not 2D tiles, nor an NVFP4 rotation (its amax is taken after it)."""
    if isinstance(q, MXTensor):
        return not q.block_2d and q.codes.ndim == 2
    if isinstance(q, NVFP4Tensor):
        return not q.block_2d and q.hadamard is None and q.codes.ndim == 2
    return isinstance(q, FP8Tensor) and q.granularity in ("tensor", "row", "block1x128") and q.codes.ndim == 2


def _anchor_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows that keep a tensor-wide reduction of x what it is on the whole tensor: the row of
    the largest finite magnitude, the first row with a NaN, the first with an Inf."""
    a = x.abs().float()
    finite = torch.where(torch.isfinite(a), a, 0).amax(dim=1)
    rows = [int(finite.argmax())]
    for special in (torch.isnan(a), torch.isinf(a)):
        hit = special.any(dim=1).nonzero().flatten()
        rows += hit[:1].tolist()
    return torch.tensor(rows, dtype=torch.int64)


def _take_rows(q: Any, rows: torch.Tensor) -> Any:
    n = q.codes.shape[0]
    moved = {f: getattr(q, f)[rows] for f in q.__dataclass_fields__
             if isinstance(getattr(q, f), torch.Tensor) and getattr(q, f).ndim and getattr(q, f).shape[0] == n}
    if isinstance(q, MXTensor):
        moved["shape"] = (len(rows), *q.shape[1:])
    return replace(q, **moved)


