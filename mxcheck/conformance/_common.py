"""Helpers the conformance checks share: inputs, recording, a backend's linear, floors."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from mxcheck import thresholds
from mxcheck.assertions import NumericsError, assert_bitwise_equal, assert_snr
from mxcheck.backends.contract import Refusal
from mxcheck.conformance.inputs import training_like_cropped
from mxcheck.diagnose.outputs import (
    exact_and_bound,
    gemm_mismatch,
    outside_bound,
    reproduced_by_split_accumulation,
)
from mxcheck.functions import make_delayed_states, quant_linear
from mxcheck.gemm import PlainTensor, quantize_operand
from mxcheck.recipes import GEMMS, OPERANDS, OperandSpec, Recipe
from mxcheck.rng import seeded_default_rng

# Floors for fwd / dgrad / wgrad SNR of a whole linear against float64 truth: one table,
# mxcheck.thresholds (the derived recipes such as mxfp4+sr resolve through linear_floor).
LINEAR_SNR_FLOORS = {name: f.db for name, f in thresholds.LINEAR_SNR_FLOORS.items()}
SAME_OPERANDS_FLOOR_DB = thresholds.SAME_OPERANDS_FLOOR_DB
DELAYED_WARMUP_STEPS = 3  # steps that fill a delayed-scaling recipe's amax histories before it is judged


def _snr(numerics: Any, test: torch.Tensor, ref: torch.Tensor, threshold_db: float, **context: Any) -> None:
    """assert_snr, recorded into the report when the pytest ``numerics`` fixture is given."""
    if numerics is None:
        assert_snr(test, ref, threshold_db, context=context)
    else:
        numerics.context(**context).snr(test, ref, threshold_db)


def _bitwise(numerics: Any, test: torch.Tensor, ref: torch.Tensor, **context: Any) -> None:
    if numerics is None:
        assert_bitwise_equal(test, ref, context=context)
    else:
        numerics.context(**context).bitwise(test, ref)


def _device(backend: Any) -> str:
    return getattr(backend, "device", "cpu")


def fresh_state(recipe: Recipe, operand: str) -> dict[str, Any]:
    """quantize keywords for ``operand``: a delayed-scaling one takes its amax history, here
    a fresh one (a first step, scale 1); others take none."""
    return {"state": make_delayed_states(recipe)[operand]} if recipe.spec(operand).scaling == "delayed" else {}


def _fwd_operands(recipe: Recipe, x: torch.Tensor, w: torch.Tensor) -> tuple[Any, Any]:
    return (quantize_operand(x, recipe.x_row, **fresh_state(recipe, "x_row")),
            quantize_operand(w, recipe.w_row, **fresh_state(recipe, "w_row")))


NO_LINEAR = "backend has neither linear, gemm nor fake_quantize"  # the skip reason of every linear check


def _delayed(recipe: Recipe) -> bool:
    return any(recipe.spec(op).scaling == "delayed" for op in OPERANDS)


def linear_of(backend: Any) -> Callable[..., torch.Tensor] | None:
    """``linear(x, w, b, recipe, states=None)`` of a backend: its own, or for a GEMM-only
    backend (Triton, ``torch._scaled_mm``) the reference Function running its GEMMs on the
    oracle's operands, or for a fake-quant backend the reference Function on its values. A delayed-scaling recipe gets ``states`` (fresh ones when None: a
    first step, scale 1); other recipes never see the keyword."""
    if hasattr(backend, "linear"):
        base = backend.linear
    elif hasattr(backend, "gemm"):
        def base(x, w, b, recipe, **kw):
            return _reference_on_gemm(backend, x, w, b, recipe, **kw)
    elif hasattr(backend, "fake_quantize"):  # its values as every operand copy (conformance.values)
        def base(x, w, b, recipe, **kw):
            return _reference_on_fake_quantize(backend, x, w, b, recipe, **kw)
    else:
        return None

    def linear(x, w, b, recipe: Recipe, states: Any = None) -> torch.Tensor:
        if not _delayed(recipe):
            return base(x, w, b, recipe)
        return base(x, w, b, recipe, states=make_delayed_states(recipe) if states is None else states)
    return linear


_FROM_BACKEND = "_mxcheck_raised_by_backend"  # marks an exception the backend's gemm raised


class OracleRefusal(Refusal):
    """mxcheck's own refusal: the reference Function around a backend's gemm or fake_quantize
    cannot take the shape. It is "not applicable", never counted as the backend's declared
    refusal (a Refusal subclass, so whatever handles a Refusal still stops there)."""


def _reference_on_gemm(backend: Any, x, w, b, recipe: Recipe, **kw) -> torch.Tensor:
    """The reference Function on the backend's GEMM. The oracle's own ValueError (a shape the
    reference Function cannot take) is a Refusal; the backend's exceptions pass unchanged."""
    from mxcheck.backends.emulated import _shape_refusal  # noqa: PLC0415

    # The backward quantizes dgrad's and wgrad's copies outside the try below, so a shape the
    # oracle cannot take there (wgrad contracting M=2) is refused here, before the forward.
    if isinstance(w, torch.Tensor) and w.ndim == 2 and x.ndim >= 1:
        why = _shape_refusal(recipe, x.numel() // max(x.shape[-1], 1), w.shape[0], w.shape[1],
                             x.requires_grad, w.requires_grad)
        if why is not None:
            raise OracleRefusal(f"the reference Function around the backend's gemm cannot take this: {why}")

    def gemm(*args: Any, **kwargs: Any) -> torch.Tensor:
        try:
            return backend.gemm(*args, **kwargs)
        except Exception as e:
            # Marked, not wrapped: the backward runs this after the try below has returned,
            # and the backend's exception (a Refusal, or a bug) must reach the check as it is.
            setattr(e, _FROM_BACKEND, True)
            raise

    try:
        return quant_linear(x, w, b, recipe, gemm=gemm, **kw)
    except ValueError as e:
        if getattr(e, _FROM_BACKEND, False):
            raise
        raise OracleRefusal(f"the reference Function around the backend's gemm cannot take this: {e}") from e


def values_problem(got: Any, x: torch.Tensor) -> str:
    """What is wrong with a kernel's fake-quantized result for input ``x``, or ""."""
    if not isinstance(got, torch.Tensor):
        return f"fake_quantize returned {type(got).__name__}, expected a tensor shaped like x"
    allowed = tuple(dict.fromkeys((x.dtype, torch.float32)))
    if tuple(got.shape) != tuple(x.shape) or got.dtype not in allowed:
        return (f"fake_quantize returned {got.dtype} {list(got.shape)}, expected {list(x.shape)} in "
                f"{' or '.join(str(d).removeprefix('torch.') for d in allowed)}")
    return ""




def _reference_on_fake_quantize(backend: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                               recipe: Recipe, **kw: Any) -> torch.Tensor:
    """The reference Function with the backend's ``fake_quantize`` in place of the oracle's
    quantizer: every quantized operand copy of the three GEMMs (x_row ... x_col) is the
    kernel's values, and the oracle's GEMM multiplies them (float32 accumulation); a copy the
    recipe keeps unquantized is the oracle's. A shape the reference Function cannot take is a
    Refusal; the backend's own exceptions pass unchanged."""
    from mxcheck.backends.emulated import _shape_refusal  # noqa: PLC0415

    if isinstance(w, torch.Tensor) and w.ndim == 2 and x.ndim >= 1:
        why = _shape_refusal(recipe, x.numel() // max(x.shape[-1], 1), w.shape[0], w.shape[1],
                             x.requires_grad, w.requires_grad)
        if why is not None:
            raise OracleRefusal(f"the reference Function around the backend's fake_quantize cannot take this: {why}")

    def quantize(t: torch.Tensor, spec: OperandSpec, *, rand: Any = None, state: Any = None) -> Any:
        if not spec.quantized:
            return quantize_operand(t, spec)
        try:
            values = backend.fake_quantize(t, spec, **({} if state is None else {"state": state}))
        except Exception as e:  # marked, not wrapped: it must reach the check as the backend raised it
            setattr(e, _FROM_BACKEND, True)
            raise
        if problem := values_problem(values, t):
            raise NumericsError(f"recipe {recipe.name}: {problem} (copy {spec.describe()}, shape {list(t.shape)})")
        return PlainTensor(values)

    try:
        return quant_linear(x, w, b, recipe, quantize=quantize, **kw)
    except ValueError as e:
        if getattr(e, _FROM_BACKEND, False) or isinstance(e, Refusal):
            raise
        raise OracleRefusal(f"the reference Function around the backend's fake_quantize cannot take this: {e}") from e


def warmed_states(linear: Callable[..., torch.Tensor], recipe: Recipe, x: torch.Tensor, w: torch.Tensor,
                  b: torch.Tensor, dy: torch.Tensor) -> Any:
    """Delayed-scaling states after DELAYED_WARMUP_STEPS forward+backward steps on inputs
    2**3, 2**2, 2**1 times the given ones (the amax shrinks toward the judged step, so the
    history's max, not the last amax, must set the scale; powers of two keep scales
    exact), or None for a recipe without delayed scaling."""
    if not _delayed(recipe):
        return None
    states = make_delayed_states(recipe)
    for step in range(DELAYED_WARMUP_STEPS, 0, -1):
        xs = (x * 2.0**step).detach().requires_grad_(True)
        y = linear(xs, w * 2.0**step, b, recipe, states=states)
        y.backward((dy * 2.0**step).to(y.dtype))
    return states


def _linear(backend: Any, x, w, b, recipe: Recipe, seed: int = 0, states: Any = None, dy=None):
    """Leaf copies of x, w, b and the output; with ``dy``, after the backward of dy too."""
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    b = b.detach().clone().requires_grad_(True)
    # SR recipes draw their bits, the backward's included, from the default generator
    with seeded_default_rng(seed, x.device):
        y = linear_of(backend)(x, w, b, recipe, states=states)
        if dy is not None:
            y.backward(dy.to(y.dtype))
    return x, w, b, y


# Where a backend's stochastic-rounding bits come from (its optional ``sr_bits``): "oracle",
# torch's default generator drawn as the reference Function draws it (SR outputs are then
# held to the reference's bits); "own", any other source (SR outputs are judged by SR
# statistics). Undeclared is "own": a kernel with its own generator must not false-fail.
SR_BITS = ("oracle", "own")


def sr_bits(backend: Any) -> str:
    """The backend's ``sr_bits`` (default "own"), validated. A backend without a linear of
    its own runs inside the reference Function (``linear_of``), whose bits are the oracle's."""
    value = getattr(backend, "sr_bits", "own")
    if value not in SR_BITS:
        raise ValueError(f"backend {getattr(backend, 'name', backend)!r}: sr_bits={value!r}; expected one of "
                         f"{list(SR_BITS)} ('oracle': SR bits from torch's default generator as the reference "
                         "Function draws them; 'own': any other source)")
    return "oracle" if not hasattr(backend, "linear") and hasattr(backend, "gemm") else value


def sr_directions(recipe: Recipe) -> tuple[str, ...]:
    """The GEMMs (fwd, dgrad, wgrad) with an operand that rounds stochastically."""
    return tuple(d for d, (a, b, _) in GEMMS.items() if "sr" in (recipe.spec(a).rounding, recipe.spec(b).rounding))


def own_sr_directions(backend: Any, recipe: Recipe) -> tuple[str, ...]:
    """The SR GEMMs of ``recipe`` whose random bits the backend draws itself: their outputs
    cannot be held to the reference Function's bits."""
    return sr_directions(recipe) if sr_bits(backend) == "own" else ()


def own_sr_fwd_reason(backend: Any, recipe: Recipe) -> str | None:
    """Why a check that compares two forward calls bit for bit does not apply: the forward
    rounds stochastically from bits the default generator's seed does not fix."""
    if "fwd" not in own_sr_directions(backend, recipe):
        return None
    return (f"recipe {recipe.name} rounds the forward stochastically and the backend draws its own SR bits "
            "(sr_bits='own'): two calls may differ")


def weight_scale(k: int) -> float:
    """About 1/sqrt(K), a power of two so the inputs' rounding midpoints stay midpoints."""
    return 2.0 ** -round(0.5 * math.log2(k))


def training_operands(recipe: Recipe, gen: torch.Generator, device: str, m: int, n: int,
                      k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) and w (N, K) shaped like training tensors (``conformance.inputs``) at any shape."""
    x = training_like_cropped(gen, m, k, recipe.x_row)
    w = training_like_cropped(gen, n, k, recipe.w_row) * weight_scale(k)
    return x.to(device), w.to(device)


def _oracle_pair(recipe: Recipe, gen: torch.Generator, device: str, m: int, n: int, k: int):
    return _fwd_operands(recipe, *training_operands(recipe, gen, device, m, n, k))


def gemm_out_dtype(backend: Any) -> torch.dtype:
    """The output dtype the checks ask a backend's GEMM for: float32 where it writes float32,
    else the first of its ``gemm_out_dtypes`` (AITER's MX kernels write bf16 only). The
    bound check below rounds the oracle to the same dtype, so a bf16-only kernel is judged
    in bf16 rather than refused."""
    dtypes = tuple(getattr(backend, "gemm_out_dtypes", (torch.float32,)))
    return torch.float32 if torch.float32 in dtypes else dtypes[0]


def _assert_in_bound(got: torch.Tensor, a: Any, b: Any, what: str, explain: bool = True) -> None:
    """got within the fp32-accumulation bound of the exact (float64) GEMM of a and b
    (``diagnose.outputs.outside_bound``), or, for fp8 operands, bit for bit Hopper's
    tensor-core accumulation with float32 promotion every 128 products. On failure the message shows the outputs outside
    it with their operands' scales and, with ``explain``, the known GEMM behaviours that
    reproduce them (computed only then)."""
    exact, bound = exact_and_bound(a, b)
    if tuple(got.shape) != tuple(exact.shape):
        raise NumericsError(f"{what}: result shape {tuple(got.shape)}, expected {tuple(exact.shape)}")
    bad = outside_bound(got, exact, bound)
    if bad.any():  # Hopper's FP8 accumulation truncates below float32's bound, correctly
        bad &= ~reproduced_by_split_accumulation(got, a, b)
    if bad.any():
        raise NumericsError(gemm_mismatch(what, got, a, b, exact, bound, bad, explain=explain))


class _Reference:
    """The reference Function as a backend, for the 'same quantized operands' comparison."""

    name = "reference"

    def linear(self, x, w, b, recipe, **kw):
        return quant_linear(x, w, b, recipe, **kw)
