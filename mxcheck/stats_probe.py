"""A probe that gathers ``mxcheck.stats.block_stats`` of every operand copy of a model's
linears while the model runs forward and backward."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import torch
from torch import nn

from mxcheck.functions import make_delayed_states
from mxcheck.recipes import GEMMS, Recipe, get_recipe
from mxcheck.scaling import DelayedScaling
from mxcheck.stats import BlockStats, block_stats

__all__ = ["StatsKey", "StatsProbe"]

# operand -> the GEMM that consumes it (x_row -> fwd, ..., x_col -> wgrad)
_DIRECTION = {op: gemm for gemm, (a, b, _) in GEMMS.items() for op in (a, b)}
StatsKey = tuple[str, str, str]  # (layer, direction, operand)


class StatsProbe:
    """Collects ``block_stats`` of every operand copy of a model's linears while it runs.

    Probed modules: each quantized linear (a module with a ``Recipe`` as ``recipe`` and a
    ``weight``, e.g. ``mxcheck.flux.QuantLinear``) with its own recipe, and, when ``recipe``
    is given, each plain ``nn.Linear`` with that recipe (what it *would* see quantized).
    ``layers`` limits the probe to those module names.

    A forward hook quantizes copies of X and W as x_row and w_row (fwd); a hook on the
    output's gradient quantizes dY and the saved X and W as g_row, w_col (dgrad) and
    g_col, x_col (wgrad). The probe works on detached copies and returns no gradient, so
    the model's outputs and gradients are bit-identical with and without it. Stochastic
    rounding draws from the probe's own generator (seeded ``seed``), so its SR bits are
    not the model's. Delayed scaling uses a copy of a quantized layer's amax histories
    taken just before the layer quantizes (a plain linear gets histories the probe keeps).
    Operands a recipe leaves unquantized (scaling "none") are skipped. A layer run twice
    in one pass keeps its last call's statistics.

    ``results``: ``{(layer, direction, operand): BlockStats}``.
    """

    def __init__(self, model: nn.Module, recipe: str | Recipe | None = None, *,
                 layers: Iterable[str] | None = None, seed: int = 0) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        default = None if recipe is None else get_recipe(recipe)
        wanted = None if layers is None else set(layers)
        named = dict(model.named_modules())
        if wanted is not None and wanted - named.keys():
            raise ValueError(f"layers={sorted(wanted - named.keys())} are not modules of {type(model).__name__}")
        self._targets: dict[str, tuple[nn.Module, Recipe]] = {}
        for name, mod in named.items():
            own = getattr(mod, "recipe", None)
            if wanted is not None and name not in wanted:
                continue
            if isinstance(own, Recipe) and isinstance(getattr(mod, "weight", None), torch.Tensor):
                self._targets[name] = (mod, own)
            elif isinstance(mod, nn.Linear) and default is not None:
                self._targets[name] = (mod, default)
        if not self._targets:
            raise ValueError(f"no quantized linear in {type(model).__name__}"
                             + ("" if default else "; pass recipe= to probe its nn.Linear layers")
                             + ("" if wanted is None else f" among layers={sorted(wanted)}"))
        self._own_states = {name: make_delayed_states(r) for name, (_, r) in self._targets.items()}
        self._generator = torch.Generator().manual_seed(seed)
        self._results: dict[StatsKey, BlockStats] = {}
        self._snapshots: dict[str, dict[str, DelayedScaling]] = {}
        self._handles: list[Any] = []

    @property
    def layers(self) -> list[str]:
        return list(self._targets)

    @property
    def results(self) -> dict[StatsKey, BlockStats]:
        return dict(self._results)

    def to_json(self) -> dict[str, Any]:
        """``{"layer/direction/operand": BlockStats.to_json()}``; a report keeps it under
        its top-level ``block_stats`` key, which the HTML rendering draws."""
        return {"/".join(k): s.to_json() for k, s in self._results.items()}

    def __enter__(self) -> StatsProbe:
        if self._handles:
            raise RuntimeError("this StatsProbe is already active; a probe is entered once at a time")
        for name, (mod, _) in self._targets.items():
            self._handles.append(mod.register_forward_pre_hook(self._pre_hook(name)))
            self._handles.append(mod.register_forward_hook(self._fwd_hook(name), with_kwargs=True))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _states(self, name: str) -> dict[str, DelayedScaling]:
        mod, _ = self._targets[name]
        if isinstance(getattr(mod, "recipe", None), Recipe):
            # The layer's own histories, copied: the probe must not advance them.
            return copy.deepcopy(dict(getattr(mod, "states", None) or {}))
        return self._own_states[name]

    def _pre_hook(self, name: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: tuple[Any, ...]) -> None:
            self._snapshots[name] = self._states(name)
        return hook

    def _fwd_hook(self, name: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            x = args[0] if args else next(iter(kwargs.values()))
            w = mod.weight.detach()
            x2d = x.detach().reshape(-1, w.shape[1])
            states = self._snapshots.pop(name, {})
            self._record(name, "x_row", x2d, states)
            self._record(name, "w_row", w, states)
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(self._grad_hook(name, x2d, w))
        return hook

    def _grad_hook(self, name: str, x2d: torch.Tensor, w: torch.Tensor) -> Callable[[torch.Tensor], None]:
        # Runs with the output's full gradient dY, before the layer's own backward.
        def hook(g: torch.Tensor) -> None:
            states = self._states(name)
            g2d = g.detach().reshape(-1, w.shape[0])
            for op, t in (("g_row", g2d), ("w_col", w.t()), ("g_col", g2d.t()), ("x_col", x2d.t())):
                self._record(name, op, t, states)
        return hook

    def _record(self, name: str, operand: str, t: torch.Tensor, states: dict[str, DelayedScaling]) -> None:
        spec = self._targets[name][1].spec(operand)
        if not spec.quantized:
            return
        state = states.get(operand) if spec.scaling == "delayed" else None
        try:
            stats = block_stats(t, spec, generator=self._generator, state=state)
        except ValueError as e:
            raise ValueError(f"StatsProbe: layer {name} operand {operand} {tuple(t.shape)}: {e}") from None
        self._results[(name, _DIRECTION[operand], operand)] = stats

