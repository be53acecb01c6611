"""The codes of a block whose E8M0 scale is NaN (byte 255).

Such a block reads NaN through its scale whatever its codes hold, so the codes are set to
the element format's NaN code (0 where the format has none), whatever the sign of the
block's NaNs: the bytes are then deterministic. ``mxcheck.profiles`` re-encodes blocks with
this; ``mxcheck.scaling.mx.mx_quantize`` does the same in its own three lines (a candidate
to call this instead, left to the owner of scaling/).
"""

from __future__ import annotations

import torch

from mxcheck.formats import FloatFormat

__all__ = ["nan_block_codes"]


def nan_block_codes(codes: torch.Tensor, nan_block: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """``codes`` [..., blocks, block_size] with each block where ``nan_block`` [..., blocks]
    is True set to ``fmt``'s NaN code (0 where it has none); same dtype as codes."""
    nan_code = torch.tensor(fmt.nan_code if fmt.nan_code is not None else 0, dtype=codes.dtype)
    return torch.where(nan_block.unsqueeze(-1), nan_code, codes)
