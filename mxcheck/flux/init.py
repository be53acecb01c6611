"""Initialisation schemes and the zero-init trap.

``init_weights(model, "primus")`` is Primus' ``Flux.init_weights`` (MLPerf v5.1 / NeMo):
xavier-uniform for the image/text input projections and every block linear, N(0, 0.02)
for the timestep/vector/guidance embedders, zero bias everywhere, and adaLN-Zero: every
modulation tail, the final adaLN modulation and the output projection are exactly zero.
A model so initialised outputs exactly zero and every block linear receives an exactly
zero gradient (DESIGN.md trap 1), so ``break_zero_init`` must run before any test that
reads a gradient. ``"torch"`` keeps PyTorch's default ``nn.Linear`` init.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mxcheck.rng import seeded_default_rng

__all__ = ["SCHEMES", "ZERO_INIT_PATTERNS", "break_zero_init", "init_weights", "zero_init_linears"]


def zero_init_linears(model: nn.Module) -> list[str]:
    """Names of the linears adaLN-Zero initialises to zero: modulation tails and the final layer."""
    return [name for name, mod in model.named_modules() if _is_zero_init(name) and _is_linear(mod)]


ZERO_INIT_PATTERNS = ("_mod.lin", "modulation.lin", "final_layer.adaLN_modulation.1", "final_layer.linear")


def _is_zero_init(name: str) -> bool:
    return name.endswith(ZERO_INIT_PATTERNS)


def _is_linear(mod: nn.Module) -> bool:
    # quantized linears keep nn.Linear's weight/bias attributes
    return isinstance(getattr(mod, "weight", None), torch.Tensor) and hasattr(mod, "in_features")


def _embedder(name: str) -> bool:
    return name.split(".")[0] in ("time_in", "vector_in", "guidance_in")


@torch.no_grad()
def _init_primus(model: nn.Module, generator: torch.Generator | None) -> None:
    for name, mod in model.named_modules():
        if not _is_linear(mod):
            continue
        if _is_zero_init(name):
            mod.weight.zero_()
        elif _embedder(name):
            mod.weight.normal_(0.0, 0.02, generator=generator)
        else:
            _xavier_uniform(mod.weight, generator)
        if mod.bias is not None:
            mod.bias.zero_()
    for name, p in model.named_parameters():
        if name.endswith("norm.scale"):
            p.fill_(1.0)


def _xavier_uniform(w: torch.Tensor, generator: torch.Generator | None) -> None:
    fan_out, fan_in = w.shape
    bound = (6.0 / (fan_in + fan_out)) ** 0.5
    w.uniform_(-bound, bound, generator=generator)


@torch.no_grad()
def _init_torch(model: nn.Module, generator: torch.Generator | None) -> None:
    # nn.Linear.reset_parameters takes no generator and draws from the global stream: with
    # a generator, draw there under a seed taken from it, and leave the caller's stream as it was.
    if generator is None:
        _reset_linears(model)
        return
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    device = next(model.parameters(), torch.empty(0)).device
    with seeded_default_rng(seed, device):
        _reset_linears(model)


def _reset_linears(model: nn.Module) -> None:
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            mod.reset_parameters()


SCHEMES: dict[str, Callable[[nn.Module, torch.Generator | None], None]] = {
    "primus": _init_primus,
    "torch": _init_torch,
}


def init_weights(model: nn.Module, scheme: str = "primus", *, generator: torch.Generator | None = None) -> nn.Module:
    """Initialise ``model`` in place by ``scheme`` (``SCHEMES``); returns the model."""
    try:
        fn = SCHEMES[scheme]
    except KeyError:
        raise ValueError(f"scheme={scheme!r}: expected one of {sorted(SCHEMES)}") from None
    fn(model, generator)
    return model


@torch.no_grad()
def break_zero_init(model: nn.Module, std: float = 0.02, *, generator: torch.Generator | None = None) -> list[str]:
    """Draw the adaLN-Zero linears (weights and biases) from N(0, std); returns their names.

    After this the model's output and every block linear's gradient are non-zero, so a
    gradient check can fail.
    """
    if not std > 0:
        raise ValueError(f"std={std!r}: expected a positive standard deviation")
    names = zero_init_linears(model)
    if not names:
        raise ValueError("model has no adaLN modulation or final-layer linears to re-initialise")
    modules = dict(model.named_modules())
    for name in names:
        mod = modules[name]
        mod.weight.normal_(0.0, std, generator=generator)
        if mod.bias is not None:
            mod.bias.normal_(0.0, std, generator=generator)
    return names
