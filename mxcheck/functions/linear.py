"""The reference quantized linear: one autograd Function for every recipe.

``Y = X W^T + b`` runs the three NT GEMMs of ``mxcheck.recipes`` on emulated quantized
operands (``mxcheck.gemm``):

- fwd   ``Y[M,N]  = q(x_row: X[M,K])    . q(w_row: W[N,K])``     + b inside, in recipe.out_dtype
- dgrad ``dX[M,K] = q(g_row: dY[M,N])   . q(w_col: W^T[K,N])``
- wgrad ``dW[N,K] = q(g_col: dY^T[N,M]) . q(x_col: X^T[K,M])``
- bgrad ``db[N]   = sum_M dY``, summed in float32 (a column sum of the unquantized dY)

The Function saves the unquantized X and W (in the caller's dtype, bf16 in training) and
quantizes the column copies in backward: every recipe then re-quantizes from the same
bf16 tensors, which is what a backward in another precision (mxfp4-fp8bwd) requires.
Where a column copy has its row copy's spec and that spec's blocks are symmetric
(tensorwise FP8, square tiles), it is the row copy's codes and scales transposed
(``mxcheck.gemm.transposed_operand``): the bits quantizing the transpose gives, without a
second pass. The row copies x_row and w_row are then kept from forward to backward.

Stochastic rounding draws uint8 bits from ``generator`` in a fixed order (forward x_row,
w_row; backward g_row, w_col, g_col, x_col; only for operands that round with "sr" and
GEMMs that run), so a seed fixes the result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from mxcheck.gemm import PlainTensor, QTensor, emulated_gemm, quantize_operand, transposed_operand
from mxcheck.recipes import OPERANDS, Recipe, get_recipe
from mxcheck.scaling import DelayedScaling
from mxcheck.scaling.fp8 import FP8_GRANULARITIES
from mxcheck.scaling.nvfp4 import NVFP4Tensor
from mxcheck.trace_ops import announce_gemm, announce_quantize, oracle_scope

__all__ = [
    "QuantLinearFunction",
    "make_delayed_states",
    "quant_linear",
    "reset_main_grad_step",
]

_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_BACKWARD_OPERANDS = ("g_row", "w_col", "g_col", "x_col")
# Each column copy quantizes the transpose of a row copy's tensor (the same storage).
TRANSPOSE_OF = {"x_col": "x_row", "w_col": "w_row", "g_col": "g_row"}
# Scalings that make a GEMM an FP8 (tensor/row/block/delayed scaled) GEMM.
_FP8_SCALINGS = (*FP8_GRANULARITIES, "delayed")

States = Mapping[str, DelayedScaling]
# ``gemm(a, b, *, out_dtype, bias=None)`` on quantized operands, NT: emulated_gemm's signature.
Gemm = Callable[..., torch.Tensor]
# ``quantize(x, spec, *, rand=None, state=None) -> QTensor``: quantize_operand's signature.
Quantize = Callable[..., QTensor]


def make_delayed_states(recipe: str | Recipe, *, amax_history_len: int = 1024,
                        amax_compute_algo: str = "max") -> dict[str, DelayedScaling]:
    """A fresh ``DelayedScaling`` for each operand the recipe scales with "delayed".

    Keep the dict across steps (it holds the amax histories) and pass it as ``states``.
    """
    recipe = get_recipe(recipe)
    return {op: DelayedScaling(recipe.spec(op).fmt, amax_history_len, amax_compute_algo,
                               margin=recipe.spec(op).margin)
            for op in OPERANDS if recipe.spec(op).scaling == "delayed"}


class OperandQuantizer:
    """Quantizes operand copies of one layer as its recipe says, with SR bits and states."""

    def __init__(self, recipe: Recipe, layer: str, generator: torch.Generator | None,
                 states: States | None, gemm: Gemm | None = None, quantize: Quantize | None = None) -> None:
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"layer {layer}: generator must be a torch.Generator or None, "
                            f"got {type(generator).__name__}")
        if states is not None and not isinstance(states, Mapping):
            raise TypeError(f"layer {layer}: states must map operand -> DelayedScaling, "
                            f"got {type(states).__name__}")
        self.recipe, self.layer, self.generator = recipe, layer, generator
        self.states = dict(states or {})
        # The GEMM the layer runs: the oracle's, or a backend's on the same quantized operands.
        self.gemm: Gemm = emulated_gemm if gemm is None else gemm
        # The quantizer: the oracle's, or a backend's (its fake-quantized values as operands).
        self.quantize: Quantize | None = quantize
        # row copy -> (its tensor, that tensor's version, its quantized operand), kept when
        # the column copy has the same spec: see _as_transpose
        self._row_copies: dict[str, tuple[torch.Tensor, int, QTensor]] = {}

    def __call__(self, operand: str, t: torch.Tensor) -> QTensor:
        spec = self.recipe.spec(operand)
        state = None
        if spec.scaling == "delayed":
            state = self.states.get(operand)
            if state is None:
                raise ValueError(f"layer {self.layer}: recipe {self.recipe.name} scales {operand} with "
                                 f"delayed scaling; pass states (make_delayed_states(recipe)) holding "
                                 f"{operand!r}, kept across steps")
        # Random bits are drawn where the generator lives (a CPU generator serves a CUDA
        # tensor too), then moved: the same seed gives the same bits on any device.
        rand = None
        if spec.rounding == "sr":
            device = self.generator.device if self.generator is not None else t.device
            rand = torch.randint(0, 256, tuple(t.shape), dtype=torch.uint8, generator=self.generator,
                                 device=device).to(t.device)
        announce_quantize(t, self.layer, operand, spec.fmt, spec.scaling, spec.scale_rule, spec.block_size,
                          spec.rounding)
        if self.quantize is not None:  # each copy through the backend, as its training step runs it
            return self.quantize(t.contiguous(), spec, rand=rand, state=state)
        transposed = self._as_transpose(operand, t)
        if transposed is not None:
            return transposed
        # The fused CUDA MX and NVFP4 quantizers read a transposed copy (w_col, g_col, x_col)
        # in place.
        operand_in = t if spec.scaling in ("mx", "nvfp4") and t.is_cuda else t.contiguous()
        try:
            with oracle_scope():
                out = quantize_operand(operand_in, spec, rand=rand, state=state)
        except ValueError as e:  # e.g. a token count the block size does not tile (wgrad K = M)
            raise ValueError(f"layer {self.layer}: recipe {self.recipe.name} cannot quantize {operand} "
                             f"(shape {tuple(t.shape)}): {e}") from e
        if operand in TRANSPOSE_OF.values() and spec == self.recipe.spec(_column_copy(operand)):
            self._row_copies[operand] = (t, t._version, out)
        return out

    def _as_transpose(self, operand: str, t: torch.Tensor) -> QTensor | None:
        """A column copy as the transpose of its row copy's quantized operand, where t is
        that tensor transposed (same storage, unchanged since) and the spec's blocks are
        symmetric (``transposed_operand``): the same bits without a second quantization."""
        row = self._row_copies.pop(TRANSPOSE_OF.get(operand, ""), None)
        if row is None:
            return None
        src, version, q = row
        same_storage = (t.data_ptr() == src.data_ptr() and t.shape == src.shape[::-1]
                        and t.stride() == src.stride()[::-1] and t._version == version)
        return transposed_operand(q, self.recipe.spec(operand)) if same_storage else None


    def run_gemm(self, direction: str, a: QTensor, b: QTensor, **kw: Any) -> torch.Tensor:
        """The layer's GEMM, announced as ``mxcheck::gemm``; the oracle's runs in oracle_scope."""
        oracle = self.gemm is emulated_gemm
        backend = "emulated" if oracle else getattr(getattr(self.gemm, "__self__", None), "name",
                                                     getattr(self.gemm, "__name__", "gemm"))
        announce_gemm(_codes(a), self.layer, direction, _fmt(a), _fmt(b), backend)
        if not oracle:  # a backend's own ops (aten::_scaled_mm, ...) stay visible to tracers
            return self.gemm(a, b, **kw)
        with oracle_scope():
            return self.gemm(a, b, **kw)


def _column_copy(row_operand: str) -> str:
    return next(col for col, row in TRANSPOSE_OF.items() if row == row_operand)


def _codes(q: QTensor) -> torch.Tensor:
    """What a quantized operand stores per element: codes, or a plain operand's values."""
    return q.codes if hasattr(q, "codes") else q.value


def _fmt(q: QTensor) -> str:
    """The element format a GEMM operand carries (NVFP4 is always e2m1)."""
    if isinstance(q, PlainTensor):
        return str(q.value.dtype).removeprefix("torch.")
    return "e2m1" if isinstance(q, NVFP4Tensor) else q.fmt.name


# The three GEMMs and the bias gradient, shared with the fused MLP so the two agree bit for bit.

def linear_fwd(q: OperandQuantizer, x2d: torch.Tensor, w: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor:
    return q.run_gemm("fwd", q("x_row", x2d), q("w_row", w), out_dtype=q.recipe.out_dtype, bias=bias)


def linear_dgrad(q: OperandQuantizer, g2d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return q.run_gemm("dgrad", q("g_row", g2d), q("w_col", w.t()), out_dtype=q.recipe.out_dtype)


def linear_wgrad(q: OperandQuantizer, g2d: torch.Tensor, x2d: torch.Tensor,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    return q.run_gemm("wgrad", q("g_col", g2d.t()), q("x_col", x2d.t()),
                      out_dtype=out_dtype or q.recipe.out_dtype)


def bias_grad(g2d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Column sum of dY in float32, then one cast (a bf16 running sum would lose bits)."""
    return g2d.to(torch.float32).sum(0).to(dtype)


def check_linear_args(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      layer: str) -> tuple[int, int, int]:
    """(M, N, K) of a linear, or an error naming the layer and the shapes."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"layer {layer}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _INPUT_DTYPES:
            raise TypeError(f"layer {layer}: {name}.dtype={t.dtype}; expected one of "
                            f"{[str(d) for d in _INPUT_DTYPES]}")
        if t.device != x.device:
            raise ValueError(f"layer {layer}: {name} is on {t.device}, x on {x.device}")
    if weight.ndim != 2:
        raise ValueError(f"layer {layer}: weight must be [N, K], got shape {tuple(weight.shape)}")
    n, k = weight.shape
    if x.ndim < 2 or x.shape[-1] != k:
        raise ValueError(f"layer {layer}: x must be [..., K] with K={k} (weight {tuple(weight.shape)}), "
                         f"got shape {tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"layer {layer}: bias must be [N]=({n},), got shape {tuple(bias.shape)}")
    return x.numel() // k, n, k


def is_fp8_backward(recipe: Recipe) -> bool:
    """True when a backward operand is FP8 with tensor/row/block/delayed scaling."""
    return any(recipe.spec(op).scaling in _FP8_SCALINGS for op in _BACKWARD_OPERANDS)


def _check_main_grad(weight: torch.Tensor, recipe: Recipe, layer: str) -> None:
    main_grad = getattr(weight, "main_grad", None)
    if not isinstance(main_grad, torch.Tensor):
        raise ValueError(f"layer {layer}: fuse_wgrad_into_main_grad needs weight.main_grad, a bf16 tensor "
                         f"of shape {tuple(weight.shape)}; weight has none")
    if main_grad.dtype != torch.bfloat16:
        raise ValueError(f"layer {layer}: weight.main_grad.dtype={main_grad.dtype}; the fused wgrad stores "
                         "bf16 (a store, not an fp32 accumulation): use a bf16 main_grad or the unfused path")
    if main_grad.shape != weight.shape or main_grad.device != weight.device:
        raise ValueError(f"layer {layer}: weight.main_grad is {tuple(main_grad.shape)} on {main_grad.device}; "
                         f"expected {tuple(weight.shape)} on {weight.device}")
    if is_fp8_backward(recipe):
        raise ValueError(f"layer {layer}: recipe {recipe.name} has an FP8 backward; the fused wgrad store into "
                         "bf16 main_grad is for MX/bf16 backward GEMMs only")


def _store_main_grad(weight: torch.Tensor, wgrad: torch.Tensor, layer: str) -> None:
    # The GEMM writes main_grad with beta=0 (no accumulate epilogue): a second microbatch
    # would overwrite the first instead of adding to it (Primus PR#1046 lost 31 of 32).
    if getattr(weight, "grad_added_to_main_grad", False):
        raise RuntimeError(f"layer {layer}: wgrad was already stored into main_grad this step; the fused "
                           "store supports one microbatch per step (a second would overwrite the first). "
                           "Call reset_main_grad_step(weight) after the optimizer step, or use the unfused path")
    weight.main_grad.copy_(wgrad)
    weight.grad_added_to_main_grad = True


def reset_main_grad_step(weight: torch.Tensor) -> None:
    """Start a new step: the next backward may store into ``weight.main_grad`` again."""
    weight.grad_added_to_main_grad = False


class QuantLinearFunction(torch.autograd.Function):
    """``apply(x, weight, bias, recipe, layer, generator, states, fuse_wgrad_into_main_grad, gemm, quantize)``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                recipe: str | Recipe, layer: str = "linear", generator: torch.Generator | None = None,
                states: States | None = None, fuse_wgrad_into_main_grad: bool = False,
                gemm: Gemm | None = None, quantize: Quantize | None = None) -> torch.Tensor:
        recipe = get_recipe(recipe)
        m, n, k = check_linear_args(x, weight, bias, layer)
        recipe.check_shape(m, n, k, layer)
        if fuse_wgrad_into_main_grad:
            _check_main_grad(weight, recipe, layer)
        q = OperandQuantizer(recipe, layer, generator, states, gemm, quantize)
        x2d = x.reshape(m, k)
        y = linear_fwd(q, x2d, weight, bias)
        ctx.save_for_backward(x2d, weight)
        ctx.q, ctx.x_shape, ctx.x_dtype = q, x.shape, x.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        # The parameter object itself: main_grad and the step flag live on it.
        ctx.fused_weight = weight if fuse_wgrad_into_main_grad else None
        return y.reshape(*x.shape[:-1], n)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2d, weight = ctx.saved_tensors
        q: OperandQuantizer = ctx.q
        g2d = dy.reshape(-1, weight.shape[0])
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        dx = dw = db = None
        if need_dx:
            dx = linear_dgrad(q, g2d, weight).to(ctx.x_dtype).reshape(ctx.x_shape)
        if need_dw and ctx.fused_weight is not None:
            _store_main_grad(ctx.fused_weight, linear_wgrad(q, g2d, x2d, torch.bfloat16), q.layer)
        elif need_dw:
            dw = linear_wgrad(q, g2d, x2d).to(weight.dtype)
        if need_db:
            db = bias_grad(g2d, ctx.bias_dtype)
        return dx, dw, db, None, None, None, None, None, None, None


def quant_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    recipe: str | Recipe,
    *,
    layer: str = "linear",
    generator: torch.Generator | None = None,
    states: States | None = None,
    fuse_wgrad_into_main_grad: bool = False,
    gemm: Gemm | None = None,
    quantize: Quantize | None = None,
) -> torch.Tensor:
    """``x[..., K] @ weight[N, K]^T + bias[N]`` through the recipe's quantized GEMMs.

    ``layer`` names the linear in errors (e.g. ``double_blocks.0.img_mlp.0``).
    ``generator`` supplies stochastic-rounding bits (None: torch's default generator).
    ``states``: operand -> DelayedScaling for "delayed" recipes (``make_delayed_states``).
    ``fuse_wgrad_into_main_grad``: store (not add) the wgrad into the bf16
    ``weight.main_grad``, set ``weight.grad_added_to_main_grad`` and return no weight grad;
    one microbatch per step (``reset_main_grad_step`` starts the next step).
    ``gemm``: run the three GEMMs with this function (a backend's ``gemm``) on the operands
    quantized here; None runs the oracle's ``emulated_gemm``.
    ``quantize``: quantize each operand copy with this function (``quantize_operand``'s
    signature; a fake-quant backend's values wrapped as ``PlainTensor``) instead of the
    oracle's; None runs ``quantize_operand``.
    """
    if not isinstance(layer, str):
        raise TypeError(f"layer={layer!r} ({type(layer).__name__}); expected a str naming the linear "
                        "(e.g. 'double_blocks.0.img_mlp.0')")
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"layer {layer}: {name}={t!r} ({type(t).__name__}); expected a torch.Tensor")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"layer {layer}: bias={bias!r} ({type(bias).__name__}); expected a torch.Tensor or None")
    if gemm is not None and not callable(gemm):
        raise TypeError(f"layer {layer}: gemm={gemm!r} ({type(gemm).__name__}); expected a callable "
                        "gemm(a, b, *, out_dtype, bias=None) (a backend's gemm) or None")
    if quantize is not None and not callable(quantize):
        raise TypeError(f"layer {layer}: quantize={quantize!r} ({type(quantize).__name__}); expected a callable "
                        "quantize(x, spec, *, rand=None, state=None) or None")
    return QuantLinearFunction.apply(x, weight, bias, get_recipe(recipe), layer, generator, states,
                                     fuse_wgrad_into_main_grad, gemm, quantize)
