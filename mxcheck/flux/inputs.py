"""Synthetic model inputs with the shapes and position ids of BFL's ``sampling.prepare``."""

from __future__ import annotations

import math

import torch

from mxcheck.flux.config import FluxConfig, get_config

__all__ = ["image_grid", "make_inputs"]


def image_grid(img_tokens: int) -> tuple[int, int]:
    """(rows, cols) of the latent token grid: the most nearly square factorisation."""
    if img_tokens < 1:
        raise ValueError(f"img_tokens={img_tokens!r}: expected a positive int")
    rows = max(d for d in range(1, math.isqrt(img_tokens) + 1) if img_tokens % d == 0)
    return rows, img_tokens // rows


def make_inputs(config: FluxConfig | str, batch: int, img_tokens: int, txt_tokens: int, *,
                generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Keyword arguments for ``Flux.forward``: random latents/text/vector, t in (0, 1).

    ``img_ids`` are (0, row, col) on the token grid and ``txt_ids`` zeros, as BFL builds them.
    """
    c = get_config(config)
    rows, cols = image_grid(img_tokens)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    img_ids = torch.zeros(rows, cols, 3)
    img_ids[..., 1] = torch.arange(rows)[:, None]
    img_ids[..., 2] = torch.arange(cols)[None, :]
    inputs = {
        "img": randn(batch, img_tokens, c.in_channels),
        "img_ids": img_ids.reshape(1, img_tokens, 3).repeat(batch, 1, 1).to(device),
        "txt": randn(batch, txt_tokens, c.context_in_dim),
        "txt_ids": torch.zeros(batch, txt_tokens, 3, device=device),
        "timesteps": torch.rand(batch, generator=generator).to(device=device, dtype=dtype),
        "y": randn(batch, c.vec_in_dim),
    }
    if c.guidance_embed:
        inputs["guidance"] = torch.full((batch,), 3.5, device=device, dtype=dtype)
    return inputs
