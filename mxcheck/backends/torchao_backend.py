"""torchao (0.14 to 0.18, see ``torchao_compat``) behind the Backend protocol: its MX
quantizer and its quantized linears.

quantize: ``torchao.prototype.mx_formats.mx_tensor.to_mx(x, elem_dtype, 32,
ScaleCalculationMode(rule))`` returns (E8M0 scales, data) with 1x32 blocks along the last
axis, for rules floor, ceil, even and rceil; fp4 data is packed two per byte, low nibble =
even index; fp6 and fp8 hold one code per byte. It matches mxcheck's ``mx_quantize`` except
in blocks whose scale byte is 0 (torchao divides by 2**-126 for FLOOR and by 1.0 for RCEIL,
see ``mxcheck.profiles`` torchao.floor / torchao.rceil), which randn data never produces,
and in RCEIL blocks whose amax is just above max * 2**k (a float32 log2).
``TORCHAO_CLAIMS`` lists what it computes bit for bit, ``CLAIM_PROFILES`` the profile each
rule is pinned to. 2D blocks, Hadamard rotations, stochastic rounding and a non-zero
``zero_scale`` are not in torchao's quantizer, and quantize() refuses them by name
(``torchao_plan`` says which spec and recipe torchao can compute).

linear: torchao's quantized training linears (``linear_plan`` maps a recipe to one of
them, or says why none matches):

* MX: ``mx_mm`` (0.18: ``prototype/moe_training/mxfp8_linear.py``, the autograd Function
  behind ``MXFP8Linear``; before: ``prototype/mx_formats/mx_linear.py``): the six operand
  copies quantized with ``to_mx`` along each GEMM's contraction axis (``MXTensor.to_mx``
  dim0 casts, ``t().contiguous()`` dim1 casts) and multiplied by the emulated MX GEMM
  (dequantize to the input dtype, ``torch.mm``), on any device. e4m3 runs through
  ``MXFP8Linear`` itself where torchao has it (``kernel_preference=EMULATED``); other
  element formats (e2m1: recipe ``mxfp4-1x32``), and e4m3 before 0.18, through ``mx_mm``
  directly. One ``ScaleCalculationMode`` for all operands. Recipe ``mxfp8`` is
  MXFP8Linear's default (RCEIL).
* FP8: ``float8/float8_linear.py::Float8Linear`` with ``Float8LinearConfig``: tensorwise
  (``fp8`` with e4m3 gradients, ``fp8-hybrid`` = torchao's default e5m2 gradients) and
  ROWWISE (``fp8-rowwise``). torchao's scale is ``fp8_max / clamp(amax, 1e-12)`` divided in
  float64 and rounded to float32 (float8/float8_utils.py::amax_to_scale), bit-equal to a
  float32 division (53 >= 2*24 + 2 makes the double rounding innocuous), so it is the
  ``primus_turbo`` formula for 1e-12 <= amax; rowwise floors it to a power of two with
  ``exp2(floor(log2(s)))``. The GEMM is ``torch._scaled_mm`` (sm89+ on CUDA; torch >= 2.13
  also has a CPU kernel, probed once), the forward with ``use_fast_accum=True``
  (config.py ``gemm_config_output``).

Both are called with the caller's own tensors (``torch.func.functional_call`` for the
modules), so gradients reach the caller's x, weight and bias through torchao's autograd.
They run in the input's dtype (float32 or bfloat16); the output and the input / weight
gradients are rounded to ``recipe.out_dtype`` once, as the reference Function writes them.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch

from mxcheck.backends import torchao_compat as compat
from mxcheck.backends.contract import Refusal
from mxcheck.backends.torch_scaled_mm import MIN_CAPABILITY, nvidia_missing
from mxcheck.backends.torchao_plan import (
    TORCHAO_FORMATS,
    TORCHAO_SCALE_RULES,
    LinearPlan,
    fp8_spec_refusal,
    linear_plan,
    spec_refusal,
)
from mxcheck.formats import get_format
from mxcheck.packing import unpack_fp4
from mxcheck.profiles import PROFILES, Profile
from mxcheck.recipes import OPERANDS, RECIPES, OperandSpec, Recipe, get_recipe
from mxcheck.scaling.fp8 import FP8Tensor
from mxcheck.scaling.mx import MXTensor

__all__ = ["CLAIM_PROFILES", "TORCHAO_CLAIMS", "TORCHAO_FORMATS", "TORCHAO_SCALE_RULES", "LinearPlan",
           "TorchaoBackend", "linear_plan"]

# to_mx asserts float32 or bfloat16 ("torch.float16 is not supported yet", 0.13-0.18)
_INPUTS = (torch.float32, torch.bfloat16)
_MX_BLOCK = 32  # torchao's training cast asserts 32 (config.py _validate_kernel_preference)
_FP8_MULTIPLE = 16  # torch._scaled_mm / cuBLASLt FP8: every leading dim a multiple of 16


def _torch_dtype(fmt: str) -> Any:
    """torchao's elem_dtype for ``fmt``; Refusal where the installed torchao lacks it."""
    if (dtype := compat.elem_dtype(fmt)) is None:
        raise Refusal(f"the installed torchao's SUPPORTED_ELEM_DTYPES has no dtype for fmt={fmt!r}")
    return dtype


def _scale_mode(rule: str) -> Any:
    """torchao's ScaleCalculationMode for ``rule``; Refusal where the installed enum lacks it."""
    if (mode := compat.scale_mode(rule)) is None:
        raise Refusal(f"the installed torchao's ScaleCalculationMode has no {rule!r}")
    return mode


@functools.cache
def _cpu_scaled_mm(rowwise: bool = False) -> str | None:
    """Why ``torch._scaled_mm`` cannot run on this CPU, or None: torch < 2.13 has no CPU
    kernel, and torch 2.11's takes per-tensor scales only ("Now _scaled_mm only supports
    per-tensor scaling for CPU backend", seen on the H200 image)."""
    try:
        a = torch.ones(16, 16).to(torch.float8_e4m3fn)
        scale = torch.ones(16, 1) if rowwise else torch.tensor(1.0)
        torch._scaled_mm(a, a.t(), scale, scale.t() if rowwise else scale, out_dtype=torch.bfloat16)
    except Exception as e:  # no CPU kernel raises NotImplementedError / RuntimeError
        return f"torch {torch.__version__} has no CPU torch._scaled_mm ({type(e).__name__}: {e})"
    return None


def _check_dtype(x: torch.Tensor, what: str) -> None:
    """TypeError for a tensor that is not floating point (a caller's mistake); Refusal for a
    floating dtype torchao does not take (float16, float64)."""
    if not x.dtype.is_floating_point:
        raise TypeError(f"x.dtype={x.dtype}; {what} take floating point tensors (float32 or bfloat16)")
    if x.dtype not in _INPUTS:
        raise Refusal(f"x.dtype={x.dtype}; {what} take float32 or bfloat16")


def _check_operand(x: Any) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("torchao quantize takes a 2D [rows, K] operand (K = the contraction axis), got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    _check_dtype(x, "torchao's casts")
    return x


def _check_dims(plan: LinearPlan, m: int, n: int, k: int) -> None:
    """Refusal naming the GEMM dims torchao's linear cannot take (instead of its assert
    or a cuBLASLt error): MX contracts over K, N and M in 32-blocks; _scaled_mm needs 16s."""
    multiple, why = ((_MX_BLOCK, "mx_mm casts 1x32 blocks along K (fwd), N (dgrad) and M (wgrad)")
                     if plan.kind == "mx" else
                     (_FP8_MULTIPLE, "Float8Linear's torch._scaled_mm (cuBLASLt) needs every dim a multiple of 16"))
    bad = [f"{d}={v}" for d, v in zip("MNK", (m, n, k), strict=True) if v % multiple]
    if bad:
        raise Refusal(f"torchao: {why}; got {', '.join(bad)} (M={m} N={n} K={k})")


class _GradTo(torch.autograd.Function):
    """Identity forward; backward rounds the gradient to ``dtype`` once (the dtype a bf16
    training kernel writes dX / dW in), then back to the caller's dtype."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        ctx.dtype = dtype
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):
        return g.to(ctx.dtype).to(g.dtype), None


# ---- claims: what torchao's quantize computes bit for bit ------------------------------

_SOURCE = "pytorch/ao torchao/prototype/mx_formats/mx_tensor.py::to_mx, 0.14.0-0.18.0 (torchao_compat)"
# Named recipes that already are one element format and rule on all six copies.
_NAMED = {("e4m3", "rceil"): "mxfp8", ("e2m1", "even"): "mxfp4-1x32"}


def _mx_claim(fmt: str, rule: str) -> Recipe:
    if (fmt, rule) in _NAMED:
        return RECIPES[_NAMED[fmt, rule]]
    return Recipe(f"torchao-mx-{fmt}-{rule}", **dict.fromkeys(OPERANDS, OperandSpec(fmt, "mx", scale_rule=rule)),
                  source=f"{_SOURCE} with ScaleCalculationMode.{rule.upper()}")


# The profile (mxcheck.profiles) each MX scale rule's bits are pinned to: mx_quantize plus
# torchao's byte-0 blocks (FLOOR, CEIL and EVEN divide them by 2^-126; RCEIL's CPU path
# leaves them unscaled) and RCEIL's float32 log2. On blocks whose amax is a float32 normal
# number (and, for RCEIL, not just above max * 2**k) they are mx_quantize's bits.
CLAIM_PROFILES: dict[str, Profile] = {rule: PROFILES[f"torchao.{rule}"] for rule in TORCHAO_SCALE_RULES}

# Every scale rule on three element formats (fp4, fp6, fp8), 1x32 blocks along K on all six
# copies, each pinned to its profile (RECIPE@PROFILE); then the Float8 casts.
TORCHAO_CLAIMS: tuple[Recipe, ...] = (
    *(_mx_claim(fmt, rule).with_profile(CLAIM_PROFILES[rule].name)
      for fmt in ("e2m1", "e2m3", "e4m3") for rule in TORCHAO_SCALE_RULES),
    *(RECIPES[n] for n in ("fp8", "fp8-hybrid", "fp8-rowwise")),
)


class TorchaoBackend:
    """torchao's MX / Float8 quantizers and its MX (mx_mm) and Float8Linear linears."""

    name = "torchao"
    claims: tuple[Recipe, ...] = TORCHAO_CLAIMS
    input_dtypes: tuple[torch.dtype, ...] = _INPUTS

    def __init__(self, device: str | None = None) -> None:
        # torchao's emulated MX path runs anywhere; the H200 gets the same calls on CUDA.
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._float8: dict[tuple, Any] = {}

    def available(self) -> tuple[bool, str]:
        """Usable where the installed torchao is a measured release (torchao_compat.NEEDED)
        and quantize's modules import; the linears' modules are looked for by supports()."""
        if (why := compat.torchao_problem()) is not None:
            return False, why
        return True, ""

    def float8_missing(self, rowwise: bool = False) -> str | None:
        """Why Float8Linear's torch._scaled_mm cannot run on this backend's device, or None."""
        if self.device == "cpu":
            return _cpu_scaled_mm(rowwise)
        return nvidia_missing("torchao Float8Linear (torch._scaled_mm)", MIN_CAPABILITY)

    def linear_missing(self, plan: LinearPlan) -> str | None:
        """Why the installed torchao cannot run ``plan``'s linear here, or None."""
        if plan.kind == "float8":
            return self.float8_missing(rowwise=plan.mode == "row")
        if compat.scale_mode(plan.mode) is None:
            return f"the installed torchao's ScaleCalculationMode has no {plan.mode!r}"
        if any(compat.elem_dtype(f) is None for f in plan.fmts):
            return f"the installed torchao's SUPPORTED_ELEM_DTYPES lacks one of {plan.fmts}"
        args = compat.mx_mm_args(compat.scale_mode(plan.mode))
        return args if isinstance(args, str) else None

    def supports(self, recipe: Recipe | str) -> tuple[bool, str]:
        """Recipes one of torchao's linears computes (``linear_plan``), on this device, with the
        installed torchao's linears (quantize needs no linear: see ``claims``)."""
        r = get_recipe(recipe)
        plan = linear_plan(r)
        if isinstance(plan, str):
            return False, f"torchao: {plan}"
        if (why := self.linear_missing(plan)) is not None:
            what = "mx_mm" if plan.kind == "mx" else "Float8Linear"
            return False, f"torchao: recipe {r.name} needs {what}: {why}"
        return True, ""

    def quantize(self, x: torch.Tensor, spec: OperandSpec) -> MXTensor | FP8Tensor:
        """Quantize the NT operand x [rows, K] along K (the last axis): MX specs with torchao's
        to_mx, FP8 tensorwise / rowwise specs with torchao's Float8 cast."""
        if spec.scaling != "mx" and fp8_spec_refusal(spec) is None:
            return self._quantize_fp8(_check_operand(x), spec)
        if (why := spec_refusal(spec)) is not None:
            raise Refusal(why)
        x = _check_operand(x)
        from torchao.prototype.mx_formats.mx_tensor import to_mx  # noqa: PLC0415

        rows, k = x.shape
        xs = x.contiguous()
        if spec.pad_to is not None and k % spec.pad_to:
            # zero columns: whole zero blocks (byte 0, codes 0) where mx_quantize pads too
            xs = torch.nn.functional.pad(xs, (0, -k % spec.pad_to))
        if xs.shape[1] % 32:
            raise Refusal(f"x dim 1 (K) = {k} is not a multiple of 32 and spec has no pad_to; "
                          "torchao to_mx needs whole 32-blocks")
        scale, data = to_mx(xs, _torch_dtype(spec.fmt), 32, _scale_mode(spec.scale_rule))
        raw, fmt = data.view(torch.uint8), get_format(spec.fmt)
        if fmt.bits == 4 and compat.fp4_high_nibble_first():
            raw = (raw >> 4) | (raw << 4)  # 0.13-0.14 packing: element 0 in the high nibble
        # fp4 comes two per byte (low nibble = even index); fp6 and fp8 one per byte
        codes = (unpack_fp4(raw) if fmt.bits == 4 else raw).reshape(xs.shape)
        scales = scale.view(torch.uint8).reshape(rows, -1)
        return MXTensor(codes=codes.contiguous(), scales=scales.contiguous(), fmt=fmt,
                        block_size=32, axis=1, shape=(rows, k), scale_rule=spec.scale_rule,
                        rounding=spec.rounding, zero_scale=spec.zero_scale)

    def _quantize_fp8(self, x: torch.Tensor, spec: OperandSpec) -> FP8Tensor:
        # float8_scaling_utils / float8_training_tensor: tensor_to_scale, then
        # hp_tensor_and_scale_to_float8 (x.float() * scale, saturating cast).
        from torchao.float8.config import ScalingGranularity  # noqa: PLC0415
        from torchao.float8.float8_training_tensor import hp_tensor_and_scale_to_float8  # noqa: PLC0415
        from torchao.float8.float8_utils import tensor_to_scale  # noqa: PLC0415

        rowwise = spec.scaling == "row"
        gran = ScalingGranularity.AXISWISE if rowwise else ScalingGranularity.TENSORWISE
        dtype = _torch_dtype(spec.fmt)
        scale = tensor_to_scale(x, dtype, scaling_granularity=gran, axiswise_dim=-1 if rowwise else None,
                                round_scales_to_power_of_2=spec.power_of_2)
        t = hp_tensor_and_scale_to_float8(x, scale, dtype, axiswise_dim=-1 if rowwise else None)
        amax = torch.amax(x.abs().float(), dim=-1, keepdim=True) if rowwise else x.abs().float().amax()
        return FP8Tensor(codes=t._data.view(torch.uint8), scale_inv=torch.reciprocal(t._scale), fmt=get_format(spec.fmt),
                         granularity=spec.scaling, scale=t._scale, amax=amax)

    def _float8_module(self, plan: LinearPlan, k: int, n: int, has_bias: bool) -> Any:
        key = (plan, k, n, has_bias)
        if key not in self._float8:
            from torchao.float8 import CastConfig, Float8LinearConfig, ScalingGranularity  # noqa: PLC0415
            from torchao.float8.float8_linear import Float8Linear  # noqa: PLC0415

            if plan.mode == "row":
                config = Float8LinearConfig.from_recipe_name("rowwise")
            else:  # torchao's TENSORWISE default has e5m2 grad_output; an e4m3 one is set explicitly
                config = Float8LinearConfig(cast_config_grad_output=CastConfig(
                    scaling_granularity=ScalingGranularity.TENSORWISE,
                    target_dtype=_torch_dtype(plan.fmt("grad_output"))))
            with torch.device("meta"):
                self._float8[key] = Float8Linear.from_float(torch.nn.Linear(k, n, bias=has_bias), config=config)
        return self._float8[key]

    def _mx_linear(self, plan: LinearPlan, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None):
        mx_mm, _ = compat.mx_mm()
        mode = _scale_mode(plan.mode)
        # torchao's own module where it has one (0.18: MXFP8Linear, its forward mx_mm + bias)
        module = getattr(importlib.import_module(mx_mm.__module__), "MXFP8Linear", None)
        if set(plan.fmts) == {"e4m3"} and module is not None:
            from torchao.quantization.quantize_.common.kernel_preference import KernelPreference  # noqa: PLC0415

            with torch.device("meta"):
                m = module(w.shape[1], w.shape[0], bias=b is not None,
                           kernel_preference=KernelPreference.EMULATED, scale_calculation_mode=mode)
            params = {"weight": w} | ({} if b is None else {"bias": b})
            return torch.func.functional_call(m, params, (x,))
        y = mx_mm.apply(x, w, *(_torch_dtype(f) for f in plan.fmts), _MX_BLOCK, *compat.mx_mm_args(mode))
        return y if b is None else y + b.to(y.dtype)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               recipe: Recipe | str) -> torch.Tensor:
        """``x[..., K] @ weight[N, K]^T + bias`` on torchao's linear for ``recipe``; autograd-capable."""
        r = get_recipe(recipe)
        plan = linear_plan(r)
        if isinstance(plan, str):
            raise Refusal(f"torchao: {plan}")
        if (why := self.linear_missing(plan)) is not None:
            raise Refusal(f"torchao: recipe {r.name}: {why}")
        _check_dtype(x, "torchao's linears")
        n, k = weight.shape
        if x.shape[-1] != k:
            raise ValueError(f"x has K={x.shape[-1]} but weight is {tuple(weight.shape)} ([N, K])")
        x2d = x.reshape(-1, k)
        _check_dims(plan, x2d.shape[0], n, k)
        # torchao runs in the input's dtype; gradients leave in recipe.out_dtype (see _GradTo)
        xi = _GradTo.apply(x2d, r.out_dtype)
        wi = _GradTo.apply(weight, r.out_dtype).to(x.dtype)
        bi = None if bias is None else bias.to(x.dtype)
        if plan.kind == "mx":
            y = self._mx_linear(plan, xi, wi, bi)
        else:
            params = {"weight": wi} | ({} if bi is None else {"bias": bi})
            y = torch.func.functional_call(self._float8_module(plan, k, n, bias is not None), params, (xi,))
        return y.to(r.out_dtype).reshape(*x.shape[:-1], n)
