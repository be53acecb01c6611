"""Block geometry shared by every block-scaled quantizer (MX, NVFP4, FP8 blockwise).

A tensor is viewed as (..., R, C) with C the blocked axis; a block is ``rows x cols``
elements (rows = 1 for 1D blocks). Per-block values are (..., R / rows, C / cols); each
quantizer writes them back per row, (..., R, C / cols), or per element.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = [
    "block_amax",
    "by_row_chunks",
    "check_axis",
    "check_tiles",
    "chunk_rows",
    "pad_last",
    "per_element",
    "per_row",
]


def check_axis(x: torch.Tensor, axis: int, name: str = "axis") -> int:
    """Normalised non-negative axis, or ValueError naming it."""
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise TypeError(f"{name} must be an int, got {type(axis).__name__}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{name}={axis} is out of range for a tensor of {x.ndim} dims (shape {tuple(x.shape)})")
    return axis % x.ndim


def check_tiles(length: int, block: int, what: str, pad_hint: bool = True) -> None:
    """ValueError unless a block tiles an axis exactly."""
    if length % block:
        hint = "; pass pad_to to zero-pad it" if pad_hint else ""
        raise ValueError(f"{what} has length {length}, not a multiple of the block size {block}{hint}")


def pad_last(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Zero-pad the last dim up to a multiple."""
    extra = -x.shape[-1] % multiple
    return torch.nn.functional.pad(x, (0, extra)) if extra else x


def _tiled(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    *lead, r, c = x.shape
    return x.reshape(*lead, r // rows, rows, c // cols, cols)


_MAX_POOL_WINDOW = 1024


def block_amax(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """max |x| per block in float32, shape (..., R / rows, C / cols); NaN propagates.

    The reduction runs in x's own dtype (exact), then only the maxima widen. Each device
    gets its fastest exact reduction (measured at 16384x3072 bf16): on CUDA a max-pool over
    |x| (0.16 ms on an H200, where amax over 32-wide rows takes 0.49 ms); elsewhere 1D blocks
    take max and min in one read, max(hi, -lo), with no |x| tensor (2D tiles then reduce
    those per-row maxima over the tile's rows).
    """
    # max_pool2d is fast for small windows only: a tensorwise "block" (the whole tensor) as
    # one pooling window took 18 s at 16384x3072 on an H200, where a reduction takes 0.2 ms.
    if x.is_cuda and x.ndim >= 2 and x.numel() and rows * cols <= _MAX_POOL_WINDOW:
        pooled = torch.nn.functional.max_pool2d(x.abs().reshape(1, -1, *x.shape[-2:]), (rows, cols))
        return pooled.reshape(*x.shape[:-2], *pooled.shape[-2:]).float()
    if x.shape[-1] > 0:
        lo, hi = torch.aminmax(x.unflatten(-1, (-1, cols)), dim=-1)
        amax = torch.maximum(hi, -lo)
        if rows == 1:
            return amax.float()
        # tiles: the max over each tile's rows of the per-row block maxima, with no full-size
        # |x|; abs gives +0 for an all-zero tile whatever the signs of its zeros, as |x| did
        return amax.unflatten(-2, (-1, rows)).amax(dim=-2).abs_().float()
    return _tiled(x.abs(), rows, cols).amax(dim=(-3, -1)).float()


# Elementwise passes over a CPU tensor run on chunks of about this many elements: their
# float32/int32 temporaries then stay in cache and in malloc's pool. A full-size temporary
# over glibc's mmap threshold (32 MiB at most) is a fresh mapping whose pages the kernel
# zero-fills on first touch: on the sweep's weights that page faulting cost as much system
# time as the arithmetic's user time. Not smaller: each op is a parallel region, and on a
# loaded machine a region waits for a descheduled thread (2**16 was 20x slower than one
# pass; 2**21 to 2**23 measured alike, about 2x faster than one pass). A CUDA tensor is
# one chunk (one kernel per pass, and a compiled graph without a Python loop).
CPU_CHUNK_ELEMENTS = 1 << 21


def chunk_rows(x: torch.Tensor) -> list[slice]:
    """Slices of dim 0 that split x into chunks of about ``CPU_CHUNK_ELEMENTS`` elements
    (one slice on CUDA, for a 0-d or 1-d x, or a small one)."""
    if x.is_cuda or x.ndim < 2 or x.numel() <= CPU_CHUNK_ELEMENTS:
        return [slice(None)]
    step = max(1, CPU_CHUNK_ELEMENTS // (x.numel() // x.shape[0]))
    return [slice(i, i + step) for i in range(0, x.shape[0], step)]


def by_row_chunks(fn: Callable[..., torch.Tensor], *rows: torch.Tensor | None) -> torch.Tensor:
    """``fn(*rows)``, computed on row chunks (``chunk_rows`` of the first) and written into
    one output. Every tensor in ``rows`` shares the first one's dim 0 (None passes through);
    whatever broadcasts instead, ``fn`` takes from its closure. ``fn`` must be elementwise
    along dim 0, so the bits are those of one call on the whole tensors."""
    chunks = chunk_rows(rows[0])
    if len(chunks) == 1:
        return fn(*rows)
    out = None
    for s in chunks:
        part = fn(*(None if t is None else t[s] for t in rows))
        if out is None:
            out = torch.empty((rows[0].shape[0], *part.shape[1:]), dtype=part.dtype, device=part.device)
        out[s] = part
    return out


def per_row(values: torch.Tensor, rows: int) -> torch.Tensor:
    """(..., R / rows, C / cols) -> (..., R, C / cols): a tile's value on each of its rows."""
    return values.repeat_interleave(rows, dim=-2) if rows > 1 else values


def per_element(values: torch.Tensor, cols: int) -> torch.Tensor:
    """(..., R, C / cols) -> (..., R, C): a block's value on each of its elements."""
    return values.repeat_interleave(cols, dim=-1)
