"""Helpers several test modules share: running the CLI, one-block inputs, torchao's to_mx."""

from __future__ import annotations

import pytest
import torch

from mxcheck.cli import main
from mxcheck.plugin import needs

# mxcheck format -> torchao 0.18 elem_dtype (a torch dtype name, else torchao's constant)
TORCHAO_DTYPE = {"e2m1": "float4_e2m1fn_x2", "e2m3": "fp6_e2m3", "e3m2": "fp6_e3m2",
                 "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    """``mxcheck *argv`` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_block(*values: float) -> torch.Tensor:
    """One [1, 32] float32 block: the values, then zeros."""
    x = torch.zeros(1, 32)
    x[0, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return x


def torchao_to_mx(x: torch.Tensor, fmt: str, rule: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scale bytes, one code per element, raw data bytes) from torchao's to_mx."""
    with needs("torchao"):
        from torchao.prototype.mx_formats import config, mx_tensor
    name = TORCHAO_DTYPE[fmt]
    scale, data = mx_tensor.to_mx(x, getattr(torch, name, name), 32, config.ScaleCalculationMode(rule))
    raw = data.view(torch.uint8)
    if fmt == "e2m1":  # torchao >= 2025-10 packs element 0 in the low nibble, as torch core
        codes = torch.stack([raw & 0xF, raw >> 4], dim=-1).reshape(x.shape)
    else:
        codes = raw
    return scale.view(torch.uint8).reshape(*x.shape[:-1], -1), codes, raw
