"""(path, leaf) pairs of nested outputs: tensors and other values in lists, tuples and
dicts, with a path such as ``out[0]['loss']`` that a failure message can name."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

__all__ = ["leaves", "tensors"]


def leaves(obj: Any, path: str = "out") -> Iterator[tuple[str, Any]]:
    """(path, leaf) for tensors and other leaves in nested lists, tuples and dicts."""
    if isinstance(obj, Mapping):
        for key, v in obj.items():
            yield from leaves(v, f"{path}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, obj


def tensors(obj: Any) -> list[torch.Tensor]:
    return [v for _, v in leaves(obj) if isinstance(v, torch.Tensor)]
