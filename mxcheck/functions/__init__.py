"""Reference autograd Functions built from a recipe: the quantized linear and the fused MLP."""

from mxcheck.functions.linear import (
    QuantLinearFunction,
    make_delayed_states,
    quant_linear,
    reset_main_grad_step,
)
from mxcheck.functions.mlp import QuantMLPFunction, gelu_tanh, quant_mlp

__all__ = [
    "QuantLinearFunction",
    "QuantMLPFunction",
    "gelu_tanh",
    "make_delayed_states",
    "quant_linear",
    "quant_mlp",
    "reset_main_grad_step",
]
