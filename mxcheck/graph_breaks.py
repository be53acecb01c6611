"""Counting the graph breaks torch.compile meets in a function's forward and backward
(``torch._dynamo.explain`` and compiled autograd), refusing an input without an autograd
graph, whose backward dynamo never traces (DESIGN.md trap 3)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from mxcheck.nested import tensors

__all__ = ["count_graph_breaks"]


def _autograd_leaves(roots: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every leaf tensor the autograd graph of roots accumulates into."""
    seen, out, stack = set(), [], [t.grad_fn for t in roots]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            leaf = getattr(node, "variable", None)  # only AccumulateGrad nodes have one
            out += [leaf] if leaf is not None else []
            stack += [n for n, _ in node.next_functions]
    return out


def _backward_graphs(fn: Callable[..., Any], args: tuple, kwargs: dict) -> int:
    """Graphs dynamo compiles for the backward of one eager call, under compiled autograd."""
    import torch._dynamo.compiled_autograd as compiled_autograd  # noqa: PLC0415

    roots = [t for t in tensors(fn(*args, **kwargs)) if t.grad_fn is not None]
    if not roots:
        raise ValueError("no output of fn carries an autograd graph, so there is no backward "
                         "to trace; pass backward=False to count the forward only")
    graphs = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append(gm)
        return gm.forward

    loss = sum(t.float().sum() for t in roots)
    with compiled_autograd._enable(lambda gm: torch.compile(gm, backend=counting_backend)):
        # autograd.grad, not .backward(): the caller's .grad fields stay as they were.
        torch.autograd.grad(loss, _autograd_leaves(roots), allow_unused=True)
    return len(graphs)


def count_graph_breaks(fn: Callable[..., Any], *args: Any, backward: bool = True,
                       **kwargs: Any) -> int:
    """Graph breaks torch.compile meets in fn's forward and (by default) its backward.

    Forward: ``torch._dynamo.explain(fn)(*args, **kwargs).graph_break_count``. With an input
    that requires grad, dynamo (torch 2.13) traces each custom autograd Function's backward
    while tracing the forward, so a break inside it shows as a break at ``apply``; without
    one it is never traced and reads zero (DESIGN.md trap 3): refused with a ValueError.
    Backward: fn runs eagerly once more and the gradient of the sum of its outputs is taken
    under compiled autograd, counting graphs - 1 as explain does; custom Functions' Python
    backward and tensor hooks are traced there, and one break in them counts more than
    once (the compiled-autograd graph splits around the call too). So 0 means clean; the
    size of a positive count is dynamo's. No ``.grad`` is changed. A module ``fn`` (or its
    bound method) counts its parameters as inputs. Dynamo is reset before and after, and
    warnings torch raises from inside its own tracing are silenced.
    """
    found = tensors((args, kwargs))
    found += [p for m in (fn, getattr(fn, "__self__", None)) if isinstance(m, torch.nn.Module)
              for p in m.parameters()]
    if not any(t.requires_grad for t in found):
        raise ValueError(
            f"none of the {len(found)} tensor inputs requires grad: without an autograd graph "
            "dynamo never traces the backward (custom Functions' backward included), so the "
            "count reads zero whatever it holds (DESIGN.md trap 3); call requires_grad_() on "
            "the inputs or weights the backward differentiates")
    import torch._dynamo as dynamo  # noqa: PLC0415

    with warnings.catch_warnings():
        # torch warns from inside its own tracing (an autograd.Function instantiated, .grad
        # of a non-leaf read); under pytest's -W error those would abort the trace.
        warnings.filterwarnings("ignore", module=r"torch(\.|$)")
        dynamo.reset()
        try:
            breaks = dynamo.explain(fn)(*args, **kwargs).graph_break_count
            if backward:
                dynamo.reset()
                breaks += max(_backward_graphs(fn, args, kwargs) - 1, 0)
        finally:
            dynamo.reset()
    return breaks
