"""TransformerEngine's ``te.pytorch.Linear`` under its FP8 / FP4 autocast, behind the Backend protocol.

Recipe map (``transformer_engine/common/recipe/__init__.py``):

* ``fp8-delayed`` -> ``DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=1024,
  amax_compute_algo="max", margin=...)``;
* FP8 tensorwise current scaling (``fp8``, ``fp8-hybrid``) -> ``Float8CurrentScaling(
  fp8_format=Format.E4M3 | Format.HYBRID)``. TE's scale is ``fp8_max / amax`` (1.0 for a
  zero amax), which equals Primus-Turbo's ``fp8_max / max(amax, 1e-12)`` for amax >= 1e-12;
* ``fp8-block`` -> ``Float8BlockScaling(fp8_format=Format.E4M3)`` (1x128 x and dY, 128x128 W,
  power-of-2 scales; sm90);
* ``mxfp8`` -> ``MXFP8BlockScaling(fp8_format=Format.E4M3)`` (sm100);
* ``nvfp4`` -> ``NVFP4BlockScaling()`` (sm100).

``linear`` builds one ``te.pytorch.Linear(K, N, bias=..., params_dtype=torch.bfloat16)`` per
(shape, bias, recipe, device), copies the caller's weight and bias in on every call, and runs
it under ``te.pytorch.autocast(enabled=True, recipe=...)`` (TE >= 2.8) or
``fp8_autocast(enabled=True, fp8_recipe=...)`` (older TE). Gradients reach the caller's
x, weight and bias through a bridging autograd Function. A kept module keeps its delayed
scaling amax history across calls, as in training.

TE quantizes and multiplies through pybind11 calls (``tex.quantize``, ``tex.generic_gemm``)
that a ``TorchDispatchMode`` never sees, so the precision manifest cannot observe what ran.
The adapter announces each direction as ``mxcheck::gemm`` with format ``UNTRACED`` and
``manifest.check`` reports those layers as not proven (rather than "no GEMM recorded", or a
format the adapter merely asked for).

TE reads several recipe defaults from ``NVTE_*`` environment variables when
``transformer_engine.common.recipe`` is imported (``recipe/__init__.py`` @ d0067d0:
``NVTE_BACKWARD_OVERRIDE``, ``NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES``,
``NVTE_NVFP4_DISABLE_RHT``, ``..._DISABLE_STOCHASTIC_ROUNDING``, ``..._DISABLE_2D_QUANTIZATION``,
``NVTE_NVFP4_ROW_SCALED_ACTIVATION``, ``NVTE_NVFP4_4OVER6``). Each field that changes
numerics is pinned here to the value mxcheck's recipe models (``_PINNED``), where the
installed recipe class has it; the report environment lists every ``NVTE_*`` variable set.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mxcheck.backends import import_vendor
from mxcheck.backends.contract import Refusal
from mxcheck.backends.torch_scaled_mm import MIN_CAPABILITY, nvidia_missing
from mxcheck.recipes import OPERANDS, RECIPES, Recipe, get_recipe
from mxcheck.trace_ops import UNTRACED, announce_gemm

__all__ = ["TransformerEngineBackend", "te_recipe_args"]

SM100 = (10, 0)
TE_FP8_DIM_MULTIPLE = 16
_DELAYED_HISTORY, _DELAYED_ALGO = 1024, "max"
# Recipe fields whose defaults come from NVTE_* variables, pinned to what mxcheck models.
_PINNED: dict[str, Any] = {
    "backward_override": None,  # NVTE_BACKWARD_OVERRIDE: high_precision/dequantized backward
    "use_power_2_scales": False,  # NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES
    "disable_rht": False,  # NVTE_NVFP4_DISABLE_RHT
    "disable_stochastic_rounding": False,  # NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING
    "disable_2d_quantization": False,  # NVTE_NVFP4_DISABLE_2D_QUANTIZATION
    "row_scaled_activation": False,  # NVTE_NVFP4_ROW_SCALED_ACTIVATION
    "nvfp4_4over6": "none",  # NVTE_NVFP4_4OVER6
}


def _fwd_bwd_format(r: Recipe, scaling: str) -> str | None:
    """"E4M3" or "HYBRID" when every operand is FP8 with ``scaling`` (e4m3 forward), else None."""
    specs = {op: r.spec(op) for op in OPERANDS}
    if any(s.scaling != scaling or s.rounding != "rne" for s in specs.values()):
        return None
    fwd = {specs[op].fmt for op in ("x_row", "w_row", "w_col", "x_col")}
    bwd = {specs[op].fmt for op in ("g_row", "g_col")}
    if fwd != {"e4m3"} or len(bwd) != 1:
        return None
    return {"e4m3": "E4M3", "e5m2": "HYBRID"}[bwd.pop()]


def te_recipe_args(recipe: Recipe | str) -> tuple[str, dict[str, Any], tuple[int, int]] | str:
    """(TE recipe class name, its keyword arguments with Format members named as strings,
    the compute capability it needs), or why the recipe has no TE equivalent."""
    r = get_recipe(recipe)
    if (fmt := _fwd_bwd_format(r, "delayed")) is not None:
        margins = {r.spec(op).margin for op in OPERANDS}
        if len(margins) > 1:
            return f"recipe {r.name} uses different margins {sorted(margins)}; TE DelayedScaling has one"
        return ("DelayedScaling", {"fp8_format": fmt, "margin": margins.pop(), "amax_history_len": _DELAYED_HISTORY,
                                   "amax_compute_algo": _DELAYED_ALGO}, MIN_CAPABILITY)
    if (fmt := _fwd_bwd_format(r, "tensor")) is not None:
        if any(r.spec(op).margin or r.spec(op).power_of_2 for op in OPERANDS):
            return f"recipe {r.name} sets margin / power_of_2, which Float8CurrentScaling is not given here"
        return "Float8CurrentScaling", {"fp8_format": fmt}, MIN_CAPABILITY
    if all(r.spec(op) == RECIPES["fp8-block"].spec(op) for op in OPERANDS):
        return "Float8BlockScaling", {"fp8_format": "E4M3"}, MIN_CAPABILITY
    mxfp8 = RECIPES["mxfp8"]
    if all(r.spec(op) == mxfp8.spec(op) for op in OPERANDS):
        return "MXFP8BlockScaling", {"fp8_format": "E4M3"}, SM100
    nvfp4 = RECIPES["nvfp4"]
    if all(r.spec(op) == nvfp4.spec(op) for op in OPERANDS):
        return "NVFP4BlockScaling", {}, SM100
    return (f"recipe {r.name} is none of TE's DelayedScaling (fp8-delayed), Float8BlockScaling (fp8-block), Float8CurrentScaling (FP8 "
            "tensorwise, e4m3 forward), MXFP8BlockScaling (mxfp8) or NVFP4BlockScaling (nvfp4) as mxcheck "
            "models them")


class _Bridge(torch.autograd.Function):
    """Forward: the TE module on detached inputs; backward: its gradients handed back to the
    caller's x, weight and bias."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                module: Any, autocast: Any, out_dtype: torch.dtype) -> torch.Tensor:
        with torch.no_grad():
            module.weight.copy_(weight)
            module.weight.grad = None
            if bias is not None:
                module.bias.copy_(bias)
                module.bias.grad = None
        xi = x.detach().to(torch.bfloat16).requires_grad_(True)
        announce_gemm(xi, "", "fwd", UNTRACED, UNTRACED, "transformer_engine")
        with torch.enable_grad(), autocast():
            y = module(xi)
        ctx.save_for_backward(xi)
        ctx.y, ctx.module, ctx.dtypes = y, module, (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y.detach().to(out_dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):
        (xi,) = ctx.saved_tensors
        for direction in ("dgrad", "wgrad"):
            announce_gemm(g, "", direction, UNTRACED, UNTRACED, "transformer_engine")
        torch.autograd.backward(ctx.y, g.to(ctx.y.dtype))
        m, (xd, wd, bd) = ctx.module, ctx.dtypes
        gb = None if bd is None or m.bias.grad is None else m.bias.grad.to(bd)
        gw = None if m.weight.grad is None else m.weight.grad.to(wd)
        return (None if xi.grad is None else xi.grad.to(xd)), gw, gb, None, None, None


class TransformerEngineBackend:
    """``transformer_engine.pytorch.Linear`` under TE's autocast with the recipe's TE equivalent."""

    name = "transformer_engine"
    device = "cuda"

    def __init__(self) -> None:
        self._modules: dict[tuple, Any] = {}

    def available(self) -> tuple[bool, str]:
        reasons = [why] if (why := import_vendor("transformer_engine.pytorch")) is not None else []
        if (why := nvidia_missing("transformer_engine", MIN_CAPABILITY)) is not None:
            reasons.append(why)
        return (not reasons), "; ".join(reasons)

    def supports(self, recipe: Recipe | str) -> tuple[bool, str]:
        """fp8-delayed, FP8 tensorwise current scaling, mxfp8 and nvfp4 (the last two need sm100)."""
        r = get_recipe(recipe)
        got = te_recipe_args(r)
        if isinstance(got, str):
            return False, f"transformer_engine: {got}"
        cls, _, need = got
        if need != MIN_CAPABILITY and (why := nvidia_missing(f"TE {cls}", need)) is not None:
            return False, f"transformer_engine: recipe {r.name}: {why}"
        return True, ""

    def te_recipe(self, recipe: Recipe | str) -> Any:
        """The ``transformer_engine.common.recipe`` object for an mxcheck recipe."""
        got = te_recipe_args(recipe)
        if isinstance(got, str):
            raise Refusal(got)
        cls, kwargs, _ = got
        from transformer_engine.common import recipe as te_recipe  # noqa: PLC0415

        kwargs = {k: getattr(te_recipe.Format, v) if k == "fp8_format" else v for k, v in kwargs.items()}
        klass = getattr(te_recipe, cls)
        have = {f.name for f in dataclasses.fields(klass)} if dataclasses.is_dataclass(klass) else set()
        return klass(**{k: v for k, v in _PINNED.items() if k in have}, **kwargs)

    @staticmethod
    def _autocast(te_recipe: Any) -> Any:
        import transformer_engine.pytorch as te  # noqa: PLC0415

        if (autocast := getattr(te, "autocast", None)) is not None:  # TE >= 2.8; fp8_autocast warns there
            return lambda: autocast(enabled=True, recipe=te_recipe)
        return lambda: te.fp8_autocast(enabled=True, fp8_recipe=te_recipe)

    def _module(self, k: int, n: int, has_bias: bool, r: Recipe, device: torch.device,
                states: Any = None) -> tuple[Any, Any]:
        # A caller's delayed-scaling ``states`` object stands for one amax history: a new
        # object gets a new te.Linear (a fresh history), the same object keeps TE's.
        key = (k, n, has_bias, r, str(device), None if states is None else id(states))
        if key not in self._modules:
            import transformer_engine.pytorch as te  # noqa: PLC0415

            te_recipe = self.te_recipe(r)
            module = te.Linear(k, n, bias=has_bias, params_dtype=torch.bfloat16, device=device)
            self._modules[key] = (module, self._autocast(te_recipe), states)  # states kept alive: ids stay unique
        module, autocast, _ = self._modules[key]
        return module, autocast

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               recipe: Recipe | str, states: Any = None) -> torch.Tensor:
        """``x[..., K] @ weight[N, K]^T + bias`` on te.pytorch.Linear; autograd-capable.

        ``states`` (delayed scaling) names an amax history: TE keeps its own in the module,
        one module per ``states`` object, so the oracle's fresh state and TE's start together.
        """
        r = get_recipe(recipe)
        n, k = weight.shape
        if x.shape[-1] != k:
            raise ValueError(f"x has K={x.shape[-1]} but weight is {tuple(weight.shape)} ([N, K])")
        m = x.numel() // k if k else 0
        # cuBLASLt FP8 GEMMs need every leading dimension a multiple of 16 bytes: K (fprop),
        # N (dgrad) and M, the wgrad contraction (TE 2.20 raises "lda % 16 == 0 ... Caller must
        # pad" from cublaslt_gemm.cu::CanonicalizeGemmInput, seen on an H200 at M=40 and M=200).
        bad = [f"{d}={v}" for d, v in (("M", m), ("N", n), ("K", k)) if v % TE_FP8_DIM_MULTIPLE]
        if bad:
            raise Refusal(f"transformer_engine FP8 GEMMs need M, N and K multiples of {TE_FP8_DIM_MULTIPLE} "
                             f"(cuBLASLt leading dimensions); got {', '.join(bad)} (M={m} N={n} K={k}): pad "
                             "the tokens or the layer")
        module, autocast = self._module(k, n, bias is not None, r, x.device, states)
        y = _Bridge.apply(x.reshape(-1, k), weight, bias, module, autocast, r.out_dtype)
        return y.reshape(*x.shape[:-1], n)
