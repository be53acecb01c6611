"""Determinism: a function called several times gives bit-identical outputs (tensors in
nested lists, tuples and dicts compared through integer views; other leaves by ==)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mxcheck.metrics import bit_diff
from mxcheck.nested import leaves
from mxcheck.outcome import Context, Outcome, raise_unless, say

__all__ = ["assert_deterministic", "check_deterministic"]


def _first_difference(a: list[tuple[str, Any]], b: list[tuple[str, Any]]) -> tuple[str, int]:
    """(where the first difference is, how many elements differ there), or ("", 0)."""
    if [p for p, _ in a] != [p for p, _ in b]:
        return f"output structure differs: {[p for p, _ in a]} vs {[p for p, _ in b]}", 1
    for (path, x), (_, y) in zip(a, b, strict=True):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            if type(x) is not type(y) or (x != y and not (x != x and y != y)):  # NaN == NaN
                return f"{path}: {x!r} vs {y!r}", 1
        elif x.dtype != y.dtype or x.shape != y.shape:
            return f"{path}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}", x.numel()
        else:
            x, y = (x.to(torch.uint8), y.to(torch.uint8)) if x.dtype == torch.bool else (x, y)
            x, y = (torch.view_as_real(x), torch.view_as_real(y)) if x.is_complex() else (x, y)
            d = bit_diff(x.detach(), y.detach(), limit=1)
            if not d.equal:
                i = d.indices[0]
                return (f"{path}: {d.n_diff:,} of {d.total:,} elements differ; first {list(i)}: "
                        f"{x[i].item()!r} (bits {d.test_codes[0]:#x}) vs {y[i].item()!r} "
                        f"(bits {d.ref_codes[0]:#x})"), d.n_diff
    return "", 0


def check_deterministic(fn: Callable[..., Any], args: tuple, kwargs: dict, runs: int,
                         context: Context) -> Outcome:
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"runs={runs!r}; expected an int >= 2")
    output = fn(*args, **kwargs)
    # Cloned: a function that returns one reused buffer would otherwise match itself.
    first = [(p, v.detach().clone() if isinstance(v, torch.Tensor) else v)
             for p, v in leaves(output)]
    total = sum(v.numel() for _, v in first if isinstance(v, torch.Tensor))
    fields = {"total": total, "extra": {"runs": runs}}
    for run in range(2, runs + 1):
        problem, n_diff = _first_difference(first, list(leaves(fn(*args, **kwargs))))
        if problem:
            msg = say(f"not deterministic: run {run} of {runs} differs from run 1", context,
                       problem)
            return Outcome(None, False, msg, {**fields, "passed": False, "mismatches": n_diff})
    msg = say(f"deterministic: {runs} runs bit-identical ({total:,} tensor elements)", context)
    return Outcome(output, True, msg, {**fields, "passed": True, "mismatches": 0})


def assert_deterministic(fn: Callable[..., Any], *args: Any, runs: int = 3,
                         context: Context = None, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) called ``runs`` times gives bit-identical outputs (tensors in
    nested lists, tuples and dicts through integer views; other leaves by ==). Returns
    the first run's output; the failure names the first differing output and element.
    """
    return raise_unless(check_deterministic(fn, args, kwargs, runs, context))
