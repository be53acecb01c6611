"""The basic checks: quantize bits, GEMM bound, linear SNR, stale weights, repeatability, NaN, shapes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from mxcheck import thresholds
from mxcheck.assertions import NumericsError, check_bitwise
from mxcheck.conformance._common import (
    NO_LINEAR,
    SAME_OPERANDS_FLOOR_DB,
    _assert_in_bound,
    _bitwise,
    _device,
    _fwd_operands,
    _linear,
    _Reference,
    _snr,
    fresh_state,
    gemm_out_dtype,
    linear_of,
    own_sr_directions,
    own_sr_fwd_reason,
    sr_directions,
    values_problem,
    warmed_states,
)
from mxcheck.conformance.inputs import (
    FAMILIES,
    GRADIENT_AMAX,
    Family,
    magnitude_tensor,
    training_like,
)
from mxcheck.conformance.sr_linear import check_sr_linear, sr_statistics_reason
from mxcheck.conformance.values import (
    ValuesDiff,
    attribute_values,
    check_fake_quantize,
    oracle_values,
    quantized_on_cpu,
)
from mxcheck.conformance.verdict import lost_lines, tensor_verdict
from mxcheck.diagnose import quantize as diagnose_quantize
from mxcheck.diagnose.behaviour import render_attributions
from mxcheck.diagnose.catalogue import QUANTIZE_BEHAVIOURS
from mxcheck.diagnose.dump import dump_dir, write_dump
from mxcheck.diagnose.linear import LinearCase, explain_linear
from mxcheck.gemm import quantize_operand
from mxcheck.outcome import Outcome, say
from mxcheck.recipes import Recipe
from mxcheck.rng import seeded_default_rng
from mxcheck.scaling.mx import MXTensor
from mxcheck.scaling.nvfp4 import NVFP4_BLOCK

_M, _N, _K = 256, 256, 512
_SMALL_GEMM = (32, 128)  # the gradient-magnitude GEMM's M, and its N = K (128x128 blocks tile it)
_W_SCALE = 2.0**-5  # about 1/sqrt(K), a power of two so midpoints stay midpoints


def _inputs(gen: torch.Generator, device: str, recipe: Recipe) -> tuple[torch.Tensor, ...]:
    """x, w, b, dY shaped like training tensors (``conformance.inputs``): bf16 values with
    the rounding midpoints of the operand's format, outliers, zero blocks and adversarial
    block amaxes."""
    x = training_like(gen, _M, _K, recipe.x_row)
    w = training_like(gen, _N, _K, recipe.w_row) * _W_SCALE
    dy = training_like(gen, _M, _N, recipe.g_row)
    b = torch.randn(_N, generator=gen).bfloat16().float()
    return tuple(t.to(device) for t in (x, w, b, dy))


# What check_quantize feeds each operand (``conformance.inputs.FAMILIES``): the tiled
# families at the check's shape (bf16 values only, adversarial block amaxes over the whole
# exponent range at bf16 and at float32 ulps, Inf/NaN), then small tensors drawn natively in
# each dtype across every magnitude (a sweep of the tensor amax, outliers, zeros, one
# nonzero, subnormals, specials alone). A backend's ``input_dtypes`` narrows the dtypes;
# the oracle quantizes the same tensor.
QUANTIZE_INPUTS = dict(FAMILIES)
DEFAULT_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Every field of the contract, scales first: a wrong scale explains the codes after it.
QUANTIZE_FIELDS = diagnose_quantize.QUANTIZE_FIELDS


def nan_block_codes_as(ours: Any, codes: Any) -> Any:
    """The backend's ``codes`` with the elements of blocks whose oracle scale is NaN (MX: E8M0
    0xFF; NVFP4: ue4m3 0x7F) set to the oracle's: OCP MX v1.0 (6.3) makes every element of
    such a block NaN whatever its code, as an NVFP4 NaN block scale does, so those codes are
    not part of the contract (torchao leaves what its cast wrote; mxcheck stores its own).
    The scale itself is compared."""
    nan = diagnose_quantize.nan_scale_blocks(ours)
    if nan is None or not isinstance(codes, torch.Tensor) or codes.shape != ours.codes.shape:
        return codes
    if not bool(nan.any()):
        return codes
    nan = nan.repeat_interleave(ours.block_size if isinstance(ours, MXTensor) else NVFP4_BLOCK, dim=-1)[..., : ours.codes.shape[-1]]
    if nan.shape != codes.shape:
        return codes
    return torch.where(nan.to(codes.device), ours.codes.to(codes.device), codes)


def nan_payloads_as(want: torch.Tensor, got: Any) -> Any:
    """A float field of the backend with each NaN where the oracle has a NaN replaced by the
    oracle's: any NaN equals any NaN (payload and sign are not part of the contract)."""
    if not isinstance(got, torch.Tensor) or not got.dtype.is_floating_point or got.shape != want.shape:
        return got
    both = torch.isnan(got) & torch.isnan(want.to(got.device))
    return torch.where(both, want.to(got.device, got.dtype), got) if bool(both.any()) else got


def _input_label(what: str, dtype: torch.dtype, amax: float | None = None) -> str:
    at = "" if amax is None else f" at amax {amax:.1e}"
    if dtype == torch.float32:
        return f"{what} input{at}"
    return f"{what} input{at}, {str(dtype).removeprefix('torch.')} tensor"


def _field_outcome(field: str, got: Any, want: torch.Tensor, context: dict[str, Any]) -> Outcome:
    """check_bitwise of one field, or a failed outcome naming what the kernel returned instead."""
    if (problem := diagnose_quantize.field_problem(field, got, want)):
        return Outcome(None, False, say(problem, context), {"bit_equal": False, "passed": False})
    return check_bitwise(got, want, None, context)


def _quantize_one(backend: Any, recipe: Recipe, name: str, t: torch.Tensor, label: str, numerics: Any,
                  differing: list, verdicts: list) -> None:
    """One input of check_quantize: every field compared (attributed on a difference) and
    the tensor-level verdict, each recorded."""
    spec = recipe.spec(name)
    ours = quantize_operand(t, spec, **fresh_state(recipe, name))
    # A quantizer may lack a feature (AITER: 2D blocks): it raises Refusal, which the
    # suite counts as refused; any other exception is a failure.
    theirs = backend.quantize(t, spec, **fresh_state(recipe, name))
    outcomes = []
    for field in diagnose_quantize.compared_fields(ours):
        got = getattr(theirs, field, None)
        got = nan_block_codes_as(ours, got) if field == "codes" else nan_payloads_as(getattr(ours, field), got)
        context = {"recipe": recipe.name, "layer": f"{name}.{field} ({label})", "direction": "quantize"}
        outcomes.append((_field_outcome(field, got, getattr(ours, field), context), got, context))
    lines: list[str] = []
    relations: list[dict] = []  # structured field relations, for the JSON report (mxcheck.diagnose.relations)
    verdict = None
    # The verdict and attribution only run where a field differs: bit-identical fields
    # dequantize to the oracle's values, so the kernel's SNR is the oracle's.
    if not all(out.passed for out, _, _ in outcomes):
        verdict = tensor_verdict(t, spec, ours, theirs, operand=name)
        if verdict is not None:
            verdicts.append((verdict, label))
        d = diagnose_quantize.compare_quantized(t, spec, ours, theirs, operand=name, label=label)
        # behaviours that explained earlier comparisons of this spec run first
        first = tuple(a.behaviour for e in differing if e.spec == spec for a in e.attributions)
        start = next((e.fit for e in reversed(differing) if e.spec == spec and e.fit), None)
        diagnose_quantize.attribute(d, QUANTIZE_BEHAVIOURS, tuple(dict.fromkeys(first)), start)
        differing.append(d)
        lines = diagnose_quantize.cause_lines(d)
        relations = [r.to_json() for r in d.relations]
    if numerics is None:
        return
    for out, got, context in outcomes:
        message = out.message if out.passed else "\n".join([out.message, *lines])
        fields = out.fields if out.passed or not relations else \
            {**out.fields, "extra": {**out.fields.get("extra", {}), "relations": relations}}
        numerics.context(**context).record(
            "bitwise", replace(out, message=message, fields=fields), got if isinstance(got, torch.Tensor) else None)
    if verdict is not None:
        context = {"recipe": recipe.name, "layer": f"{name} tensor ({label})", "direction": "quantize"}
        numerics.context(**context).record("snr", Outcome(None, verdict.passed, verdict.line(),
                                                          verdict.record_fields()))


def _operands(recipe: Recipe, family: Family) -> tuple[str, ...]:
    """x_row and w_row; a small family skips w_row where its spec is x_row's (same draws,
    same quantizer: only 2D weight blocks or another format make it a second path)."""
    if family.tiles is None and recipe.w_row == recipe.x_row:
        return ("x_row",)
    return ("x_row", "w_row")


def _family_tensors(family: Family, gen: torch.Generator, recipe: Recipe, name: str,
                    accepted: tuple[torch.dtype, ...]) -> list[tuple[torch.dtype, float, torch.Tensor]]:
    rows = _M if name == "x_row" else _N
    return [(d, a, t) for d, a, t in family.tensors(gen, recipe.spec(name), rows, _K) if d in accepted]


def quantize_inputs(recipe: Recipe, gen: torch.Generator, accepted: tuple[torch.dtype, ...],
                    device: str) -> Iterator[tuple[str, str, str, torch.Tensor]]:
    """(family, operand, label, tensor) for every input family of QUANTIZE_INPUTS, operand copy
    and tensor dtype the backend accepts: what the quantize and fake_quantize checks feed."""
    for what, family in QUANTIZE_INPUTS.items():
        for name in _operands(recipe, family):
            for dtype, amax, t in _family_tensors(family, gen, recipe, name, accepted):
                label = _input_label(what, dtype, None if family.tiles is not None and family.scale == 1.0 else amax)
                yield what, name, label, t.to(device)


def check_quantize(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """The backend's quantization of x_row and w_row is bit-identical to the oracle's, on
    each input family of QUANTIZE_INPUTS, in each of its dtypes the backend accepts
    (``input_dtypes``). Every field of the contract is compared, scales first, and every
    comparison runs: the failure counts each differing field, shows the first differing
    blocks, and names the known behaviours that reproduce them (``mxcheck.diagnose``).

    Beside the bits, each input's tensor-level verdict (``conformance.verdict``): a kernel
    whose SNR against float64 truth falls more than LOST_MARGIN_DB under the oracle's loses
    signal, and the worst such input heads the failure ("x_row loses the tensor at amax
    ...").

    A backend's ``fake_quantize`` is judged on values first, on the same inputs
    (``conformance.values``)."""
    accepted = tuple(getattr(backend, "input_dtypes", DEFAULT_INPUT_DTYPES))
    device = _device(backend)
    if hasattr(backend, "fake_quantize"):  # values, judged against the oracle's dequantized values
        why = check_fake_quantize(backend, recipe, numerics, inputs=quantize_inputs(recipe, gen, accepted, device))
        if not hasattr(backend, "quantize"):
            return why
    if not hasattr(backend, "quantize"):
        return "backend has neither quantize nor fake_quantize"
    ran, differing, verdicts = 0, [], []
    for _, name, label, t in quantize_inputs(recipe, gen, accepted, device):
        _quantize_one(backend, recipe, name, t, label, numerics, differing, verdicts)
        ran += 1
    lost = lost_lines(verdicts, ran)
    if differing or lost:
        if differing and (where := dump_dir()) is not None:  # every differing block, beyond the summary
            write_dump(where, differing, f"quantize-{recipe.name}-{getattr(backend, 'name', 'backend')}")
        head = f"quantize of recipe {recipe.name}, backend {getattr(backend, 'name', backend)}"
        raise NumericsError("\n".join([*lost, diagnose_quantize.report(differing, ran, head) if differing
                                       else f"{head}: no field differs"]))
    if not ran:
        return f"backend input_dtypes={accepted} holds none of the input families' dtypes"
    return None


def check_gemm(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """GEMM within the fp32-accumulation bound of the oracle's exact (float64) GEMM."""
    if not hasattr(backend, "gemm"):
        return "backend has no gemm"
    x, w, _, _ = _inputs(gen, _device(backend), recipe)
    _gemm_in_bound(backend, recipe, x, w, f"gemm of recipe {recipe.name} at M={_M} N={_N} K={_K}")
    # x at a gradient magnitude: the per-tensor factors a GEMM multiplies in (NVFP4's
    # ts_a * ts_b, FP8's scale_inv product) leave float16's and bf16's normal range there.
    m, n = _SMALL_GEMM
    x = magnitude_tensor(gen, m, n, torch.bfloat16, GRADIENT_AMAX).float().to(_device(backend))
    w = magnitude_tensor(gen, n, n, torch.bfloat16, 1.0).float().to(_device(backend))
    _gemm_in_bound(backend, recipe, x, w, f"gemm of recipe {recipe.name} at M={m} N=K={n}, x at amax "
                                          f"{GRADIENT_AMAX:.1e}")
    return None


def _gemm_in_bound(backend: Any, recipe: Recipe, x: torch.Tensor, w: torch.Tensor, what: str) -> None:
    """The backend's GEMM of the oracle's operands of x and w within the bound; a failure
    names first where the backend's own quantizer differs on the same x and w."""
    a, b = _fwd_operands(recipe, x, w)
    got = backend.gemm(a, b, out_dtype=gemm_out_dtype(backend))
    try:
        _assert_in_bound(got, a, b, what)
    except NumericsError as e:
        causes = operand_causes(backend, recipe, {"x_row": x, "w_row": w})
        if not causes:
            raise
        first, _, rest = str(e).partition("\n")
        raise NumericsError("\n".join([first, *causes, rest])) from e


# check_linear pools its SNRs over this many independent input draws. training_like's
# tiles span 12 binades, so a handful of top-binade tiles carry most of the energy and one
# draw's SNR spreads widely (mxfp4 fwd: sd 1.3 dB, 4.8 dB over the DESIGN floor, and
# 1 of 300 seeds under it); pooling 4 draws narrows the spread so every floor sits more
# than MIN_Z standard deviations under the measured SNR (mxcheck.false_failure).
LINEAR_DRAWS = 4


def _linear_draw(backend: Any, recipe: Recipe, gen: torch.Generator) -> tuple[dict, dict, dict, dict]:
    """One draw of check_linear: the backend's fwd/dgrad/wgrad/bgrad, the float64 truth, the
    reference Function's outputs on the same inputs, and those inputs."""
    x0, w0, b0, dy = _inputs(gen, _device(backend), recipe)
    # Delayed scaling: a few steps fill the amax histories, then the measured step.
    states = warmed_states(linear_of(backend), recipe, x0, w0, b0, dy)
    x, w, b, y = _linear(backend, x0, w0, b0, recipe, states=states, dy=dy)
    xd, wd = x0.double(), w0.double()
    truth = {"fwd": xd @ wd.T + b0.double(), "dgrad": dy.double() @ wd, "wgrad": dy.double().T @ xd,
             "bgrad": dy.double().sum(0)}
    got = {"fwd": y, "dgrad": x.grad, "wgrad": w.grad, "bgrad": b.grad}
    for direction, t in got.items():
        if t is None or not t.abs().sum():
            raise NumericsError(f"{direction} of recipe {recipe.name} is missing or all zero")
    ref_states = warmed_states(linear_of(_Reference()), recipe, x0, w0, b0, dy)
    rx, rw, _, ry = _linear(_Reference(), x0, w0, b0, recipe, states=ref_states, dy=dy)
    return got, truth, {"fwd": ry, "dgrad": rx.grad, "wgrad": rw.grad}, {"x": x0, "w": w0, "b": b0, "dy": dy}


def check_linear(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """fwd, dgrad, wgrad and bias grad above the recipe's SNR floor against float64 truth, and
    close to the reference Function given the same quantized operands; each SNR pooled over
    LINEAR_DRAWS independent input draws (the outputs concatenated).

    A GEMM that rounds stochastically is held to the reference's bits only where the backend
    draws them as the reference does (``sr_bits="oracle"``); with its own bits (``"own"``, the
    default) it is held to SR statistics instead (``conformance.sr_linear``)."""
    if linear_of(backend) is None:
        return NO_LINEAR
    thresholds.linear_floor(recipe)  # a recipe without a floor is an error, before any work
    own = own_sr_directions(backend, recipe)
    if own and (why := sr_statistics_reason(recipe, own)):
        return why
    first_draw = gen.get_state()  # on failure, the attribution reruns the first draw's inputs
    try:
        draws = [_linear_draw(backend, recipe, gen) for _ in range(LINEAR_DRAWS)]
        ctx = {"recipe": recipe.name, "m": _M, "n": _N, "k": _K}
        for direction in ("fwd", "dgrad", "wgrad", "bgrad"):
            got, truth = (torch.cat([d[i][direction].double().flatten() for d in draws]) for i in (0, 1))
            _snr(numerics, got, truth, thresholds.linear_floor(recipe, direction), layer="vs float64 truth",
                 direction=direction, **ctx)
        same_bits = sr_directions(recipe)
        for direction in ("fwd", "dgrad", "wgrad"):
            if direction in own:
                continue
            # Same quantized operands (and SR bits): only accumulation order and the output rounding may differ.
            got, ref = (torch.cat([d[i][direction].double().flatten() for d in draws]) for i in (0, 2))
            layer = "vs reference Function" + (" (the oracle's SR bits, sr_bits='oracle')" if direction in same_bits
                                               else "")
            _snr(numerics, got, ref, SAME_OPERANDS_FLOOR_DB, layer=layer, direction=direction, **ctx)
        if own:
            check_sr_linear(numerics, recipe, [(d[3], d[0], d[2]) for d in draws], own, ctx)
    except NumericsError as e:
        x, w, b, _ = _inputs(torch.Generator().set_state(first_draw), _device(backend), recipe)
        try:
            lines = operand_causes(backend, recipe, {"x_row": x, "w_row": w})  # the quantizer's cause first
            lines += explain_linear(_linear(backend, x, w, b, recipe)[3],
                                    LinearCase(recipe, x, w, b, own_linear=hasattr(backend, "linear")))
        except Exception as why:  # the attribution must not hide the failure it was to explain
            lines = [f"no attribution: the backend's forward raised {type(why).__name__}: {why}"]
        raise NumericsError("\n".join([str(e), *lines])) from e
    return None


def operand_causes(backend: Any, recipe: Recipe, operands: dict[str, torch.Tensor]) -> list[str]:
    """Where the backend's own quantization (``quantize``, else ``fake_quantize``) of an
    operand copy differs from the oracle's on the input a GEMM or linear failed on: one line
    each, with the cause the quantize check names (a GEMM or linear failure downstream of a
    wrong quantizer is that quantizer's failure first). Empty where it quantizes as the
    oracle does, or has no quantizer of its own."""
    lines = []
    for name, t in operands.items():
        spec = recipe.spec(name)
        if not spec.quantized or spec.scaling == "delayed":  # a delayed scale depends on the calls before
            continue
        ours = quantize_operand(t, spec)
        if hasattr(backend, "quantize"):
            d = diagnose_quantize.compare_quantized(t, spec, ours, backend.quantize(t, spec), operand=name)
            if d.problem or not d.n_differing:
                continue
            diagnose_quantize.attribute(d, QUANTIZE_BEHAVIOURS)
            counts, cause = f"{d.n_differing:,} of {d.n_blocks:,} {d.unit}", diagnose_quantize.cause_lines(d)[0]
        elif hasattr(backend, "fake_quantize"):
            got = backend.fake_quantize(t, spec)
            if values_problem(got, t):
                continue
            want = oracle_values(ours, got.dtype).cpu()
            v = ValuesDiff(name, "", spec, t.detach().cpu(), quantized_on_cpu(ours), want, got.detach().cpu())
            if not bool(v.differ.any()):
                continue
            attribute_values(v, QUANTIZE_BEHAVIOURS)
            n = len(v.differing_blocks())
            counts = f"{int(v.differ.sum()):,} of {v.differ.numel():,} values"
            cause = render_attributions(v.attributions, n, v.unexplained, v.unit)[0]
        else:
            return []
        lines.append(f"the backend's quantization of {name} differs from the oracle's on this input ({counts}); "
                     f"the quantize check's cause: {cause}")
    return lines


def check_weight_change(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """A second call with a changed weight changes the output (no stale cached quantization)."""
    linear = linear_of(backend)
    if linear is None:
        return NO_LINEAR
    x, w, b, _ = _inputs(gen, _device(backend), recipe)
    with torch.no_grad():
        y1 = linear(x, w, b, recipe)
        y2 = linear(x, w * 2, b, recipe)
    if torch.equal(y1, y2):
        lines = explain_linear(y2, LinearCase(recipe, x, w * 2, b, previous_w=w, own_linear=hasattr(backend, "linear")))
        raise NumericsError("\n".join([f"recipe {recipe.name}: doubling the weight left the output unchanged", *lines]))
    return None


def check_repeatable(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """Repeat calls are bit-identical (recipes without SR; SR recipes with the same seed).

    Only the forward is compared: a backend with its own SR bits is judged here unless its
    forward rounds stochastically (then two calls may rightly differ)."""
    if linear_of(backend) is None:
        return NO_LINEAR
    if why := own_sr_fwd_reason(backend, recipe):
        return why
    x, w, b, _ = _inputs(gen, _device(backend), recipe)
    outs = [_linear(backend, x, w, b, recipe, seed=7)[3].detach() for _ in range(2)]
    _bitwise(numerics, outs[1], outs[0], recipe=recipe.name, layer="repeat call", direction="fwd")
    return None


def check_nan_propagates(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """NaN in gives NaN out (in that row), never a silent finite value."""
    linear = linear_of(backend)
    if linear is None:
        return NO_LINEAR
    x, w, b, _ = _inputs(gen, _device(backend), recipe)
    x[3, 5] = float("nan")
    with torch.no_grad():
        y = linear(x, w, b, recipe)
    if not torch.isnan(y[3]).any():
        lines = operand_causes(backend, recipe, {"x_row": x})  # a quantizer that flushes NaN, first
        lines += explain_linear(y, LinearCase(recipe, x, w, b, own_linear=hasattr(backend, "linear")))
        raise NumericsError("\n".join([f"recipe {recipe.name}: a NaN in row 3 of x gave a finite row 3 of y", *lines]))
    return None


def check_shapes(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """3D input [B, S, K] gives [B, S, N] in the recipe's output dtype, equal to the 2D call."""
    linear = linear_of(backend)
    if linear is None:
        return NO_LINEAR
    x, w, b, _ = _inputs(gen, _device(backend), recipe)

    def call(xi: torch.Tensor) -> torch.Tensor:
        with seeded_default_rng(7, xi.device), torch.no_grad():  # the same SR bits, where SR draws from it
            return linear(xi, w, b, recipe)
    y3, y2 = call(x.view(2, _M // 2, _K)), call(x)
    if y3.shape != (2, _M // 2, _N) or y3.dtype != recipe.out_dtype:
        raise NumericsError(f"recipe {recipe.name}: 3D input gave shape {tuple(y3.shape)} {y3.dtype}, "
                            f"expected {(2, _M // 2, _N)} {recipe.out_dtype}")
    if why := own_sr_fwd_reason(backend, recipe):  # two calls' own SR bits differ: shape and dtype only
        return why
    _bitwise(numerics, y3.reshape(_M, _N), y2, recipe=recipe.name, layer="3D vs 2D", direction="fwd")
    return None
