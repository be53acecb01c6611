"""Fused quantized MLP: fc1 -> tanh-GELU -> fc2 in one autograd Function.

Flux's MLP is ``Sequential(Linear(C, 4C), GELU(approximate="tanh"), Linear(4C, C))``
(BFL names ``img_mlp.0`` and ``img_mlp.2``). The fused Function saves only the bf16
pre-activation ``h_pre`` (besides X and the weights) and recomputes the GELU and its
derivative in backward, as a fused packer does (Primus ``MXFP6FusedMLP``).

It runs the same GEMMs (``mxcheck.functions.linear``), the same GELU arithmetic (float32,
then one cast to the hidden dtype) and draws stochastic-rounding bits in the same order
as the unfused composition ``quant_linear -> gelu -> quant_linear`` under autograd, so the
two agree bit for bit in forward and in every gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mxcheck.functions.linear import (
    OperandQuantizer,
    States,
    bias_grad,
    check_linear_args,
    linear_dgrad,
    linear_fwd,
    linear_wgrad,
)
from mxcheck.recipes import Recipe, get_recipe

__all__ = ["QuantMLPFunction", "gelu_tanh", "gelu_tanh_backward", "quant_mlp"]

_SUBLAYERS = ("fc1", "fc2")


def gelu_tanh(h_pre: torch.Tensor) -> torch.Tensor:
    """tanh-GELU in float32, cast once back to h_pre's dtype (the opmath of torch's bf16
    GELU, written out so the fused and unfused paths share the arithmetic)."""
    return torch.nn.functional.gelu(h_pre.to(torch.float32), approximate="tanh").to(h_pre.dtype)


def gelu_tanh_backward(dh: torch.Tensor, h_pre: torch.Tensor) -> torch.Tensor:
    """dL/dh_pre from dL/dh, recomputed from h_pre in float32 with ATen's own derivative
    (what autograd runs for ``gelu_tanh``), cast once to h_pre's dtype."""
    grad = torch.ops.aten.gelu_backward(dh.to(torch.float32), h_pre.to(torch.float32), approximate="tanh")
    return grad.to(h_pre.dtype)


def _sub_states(states: Mapping[str, States] | None, layer: str) -> tuple[States | None, States | None]:
    if states is None:
        return None, None
    unknown = sorted(set(states) - set(_SUBLAYERS))
    if unknown:
        raise ValueError(f"layer {layer}: states keys {unknown}; expected {list(_SUBLAYERS)}, each an "
                         "operand -> DelayedScaling mapping")
    return states.get("fc1"), states.get("fc2")


class QuantMLPFunction(torch.autograd.Function):
    """``apply(x, w1, b1, w2, b2, recipe, layer, generator, states)``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None,
                w2: torch.Tensor, b2: torch.Tensor | None, recipe: str | Recipe, layer: str = "mlp",
                generator: torch.Generator | None = None,
                states: Mapping[str, States] | None = None) -> torch.Tensor:
        recipe = get_recipe(recipe)
        names = (f"{layer}.0", f"{layer}.2")  # BFL's Sequential indices of the two linears
        m, hidden, k = check_linear_args(x, w1, b1, names[0])
        x2d = x.reshape(m, k)
        recipe.check_shape(m, hidden, k, names[0])
        s1, s2 = _sub_states(states, layer)
        q1 = OperandQuantizer(recipe, names[0], generator, s1)
        q2 = OperandQuantizer(recipe, names[1], generator, s2)
        h_pre = linear_fwd(q1, x2d, w1, b1)
        h = gelu_tanh(h_pre)
        _, n, _ = check_linear_args(h, w2, b2, names[1])
        recipe.check_shape(m, n, hidden, names[1])
        y = linear_fwd(q2, h, w2, b2)
        ctx.save_for_backward(x2d, w1, w2, h_pre)
        ctx.q1, ctx.q2, ctx.x_shape, ctx.x_dtype = q1, q2, x.shape, x.dtype
        ctx.bias_dtypes = tuple(None if b is None else b.dtype for b in (b1, b2))
        return y.reshape(*x.shape[:-1], n)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2d, w1, w2, h_pre = ctx.saved_tensors
        q1, q2 = ctx.q1, ctx.q2
        need = ctx.needs_input_grad
        g2 = dy.reshape(-1, w2.shape[0])
        dx = dw1 = db1 = dw2 = db2 = None
        # fc2, in the order the unfused fc2 backward runs: dgrad, wgrad, bias.
        need_fc1 = any(need[:3])  # the unfused hidden tensor needs a grad iff fc1 does
        dh = linear_dgrad(q2, g2, w2).to(h_pre.dtype) if need_fc1 else None
        if need[3]:
            dw2 = linear_wgrad(q2, g2, gelu_tanh(h_pre)).to(w2.dtype)
        if need[4]:
            db2 = bias_grad(g2, ctx.bias_dtypes[1])
        if dh is not None:
            g1 = gelu_tanh_backward(dh, h_pre)
            if need[0]:
                dx = linear_dgrad(q1, g1, w1).to(ctx.x_dtype).reshape(ctx.x_shape)
            if need[1]:
                dw1 = linear_wgrad(q1, g1, x2d).to(w1.dtype)
            if need[2]:
                db1 = bias_grad(g1, ctx.bias_dtypes[0])
        return dx, dw1, db1, dw2, db2, None, None, None, None


def quant_mlp(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    recipe: str | Recipe,
    *,
    layer: str = "mlp",
    generator: torch.Generator | None = None,
    states: Mapping[str, States] | None = None,
) -> torch.Tensor:
    """``fc2(gelu_tanh(fc1(x)))`` through the recipe's quantized GEMMs, as one Function.

    x is [..., K], w1 [H, K], b1 [H], w2 [N, H], b2 [N]. The two linears are named
    ``{layer}.0`` and ``{layer}.2`` in errors. ``states``: {"fc1": ..., "fc2": ...}, each
    operand -> DelayedScaling (``make_delayed_states``) for "delayed" recipes.
    """
    return QuantMLPFunction.apply(x, w1, b1, w2, b2, get_recipe(recipe), layer, generator, states)
