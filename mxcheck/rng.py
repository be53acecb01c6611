"""A seeded default generator for code that torch or a backend gives no generator argument.

``nn.Linear.reset_parameters`` and a backend's stochastic rounding draw from torch's
global stream. Library code must not leave the caller's stream moved or reseeded, so it
draws inside :func:`seeded_default_rng`, which forks the CPU state (and the CUDA state of
the device the tensors live on) and restores it on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["seeded_default_rng"]


@contextlib.contextmanager
def seeded_default_rng(seed: int, device: torch.device | str = "cpu") -> Iterator[None]:
    """Inside the block the default generators of the CPU and of ``device`` (a CUDA device)
    start from ``seed``, as after ``torch.manual_seed(seed)``; outside, the caller's states
    are as they were."""
    device = torch.device(device)
    cuda = [] if device.type != "cuda" else [
        device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(seed)
        for index in cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        yield
