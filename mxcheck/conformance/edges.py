"""Edge shapes: every backend computes correctly or raises a clear error naming the dim."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.contract import Refusal
from mxcheck.conformance._common import (
    SAME_OPERANDS_FLOOR_DB,
    OracleRefusal,
    _assert_in_bound,
    _device,
    _linear,
    _oracle_pair,
    _Reference,
    _snr,
    fresh_state,
    gemm_out_dtype,
    linear_of,
    own_sr_directions,
    training_operands,
    warmed_states,
)
from mxcheck.conformance.inputs import training_like_cropped
from mxcheck.conformance.sr_linear import check_sr_linear, sr_statistics_reason
from mxcheck.conformance.values import (
    ValuesDiff,
    attribute_values,
    oracle_values,
    quantized_on_cpu,
    values_problem,
    values_report,
)
from mxcheck.diagnose import quantize as diagnose_quantize
from mxcheck.diagnose.catalogue import QUANTIZE_BEHAVIOURS
from mxcheck.diagnose.shapes import shape_patterns
from mxcheck.gemm import quantize_operand
from mxcheck.outcome import Outcome
from mxcheck.recipes import Recipe
from mxcheck.thresholds import linear_floor

# name -> (M, N, K, where it comes from). Linear shapes (M tokens, N out, K in); the linear
# path also runs dgrad (contracting N) and wgrad (contracting M). Dims that are not the edge
# are capped so the sweep stays cheap on a CPU; tests/conformance/test_edge_shapes.py checks
# the Flux rows against mxcheck.flux's table.
EDGE_SHAPES: dict[str, tuple[int, int, int, str]] = {
    "img_in-K64": (32, 128, 64, "Flux img_in fwd and final_layer dgrad: K = 64 (N capped from 3072)"),
    "final_layer-N64": (32, 64, 256, "Flux final_layer.linear fwd: N = out_channels = 64 (K capped from 3072)"),
    "modulation-M1": (1, 128, 256, "adaLN modulation at batch 1: M = batch (N, K capped from 18432, 3072)"),
    "modulation-M2": (2, 128, 256, "adaLN modulation at batch 2; its wgrad contracts K = batch = 2"),
    "modulation-M64": (64, 128, 256, "adaLN modulation at batch 64"),
    "K384-Kmod256": (32, 64, 384, "K % 256 != 0: aiter#4176 gemm_a4w4 returned garbage, no error"),
    "K96-Kmod128": (32, 64, 96, "K % 32 == 0, K % 128 != 0 (mxfp4 pads K to 128)"),
    "K48-Kmod32": (32, 64, 48, "K % 32 != 0 (an NVFP4 16-block tiles it, an MX 32-block does not)"),
    "K40-Kmod16": (32, 64, 40, "K % 16 != 0"),
    "M13": (13, 64, 128, "M % 16 != 0"),
    "M40": (40, 64, 128, "M % 32 != 0"),
    "M200": (200, 64, 128, "M % 128 != 0"),
}


def _names_a_dim(msg: str, dims: dict[str, int]) -> bool:
    """The message names a dim: 'K=40', 'K (40)', or one of the values as a number."""
    return any(re.search(rf"(?<![\w.]){v}(?![\w.])", msg) or re.search(rf"\b{d}\b", msg)
               for d, v in dims.items())


# A shape every built-in recipe's multiples divide (mxfp6 needs 256; mxfp4 pads K to 128): a
# refusal the backend repeats there is about the spec, not the edge shape.
REGULAR_SHAPE = (256, 256, 256)


def _raised(e: Exception, what: str, dims: dict[str, int], again: Callable[[], Any] | None = None) -> str:
    """The outcome of an exception at an edge shape: mxcheck's own refusal is "n/a"; the
    backend's Refusal is "refused" where it names a dim, or where ``again`` (the same call at
    REGULAR_SHAPE) is refused too, since then it is about the spec; anything else fails."""
    msg = str(e).splitlines()[0] if str(e) else ""
    if isinstance(e, OracleRefusal):
        return f"n/a: {msg[:160]}"
    if not isinstance(e, Refusal):
        raise NumericsError(f"{what} at {dims} raised {type(e).__name__}, not mxcheck.backends.Refusal: "
                            f"validate the shape and raise Refusal naming the dim ({msg[:200]})") from e
    if _names_a_dim(msg, dims):
        return f"refused: {msg[:160]}"
    if again is not None and _refused(again):
        return f"refused: {msg[:160]} (also at M=N=K={REGULAR_SHAPE[0]}: about the spec, not the shape)"
    raise NumericsError(f"{what} at {dims} raised Refusal without naming M, N or K (not refused at "
                        f"M=N=K={REGULAR_SHAPE[0]}, so it is about the shape): {msg[:200]}")


def _refused(call: Callable[[], Any]) -> bool:
    """Whether ``call`` raises the backend's Refusal (anything else: it is not refused there)."""
    try:
        call()
    except OracleRefusal:
        return False
    except Refusal:
        return True
    except Exception:  # computing, or failing otherwise, is not refusing: the edge refusal stands alone
        return False
    return False


def _edge_gemm(backend: Any, recipe: Recipe, gen: torch.Generator, m: int, n: int, k: int,
               explain: bool = True) -> str:
    dims = {"M": m, "N": n, "K": k}
    try:
        a, b = _oracle_pair(recipe, gen, _device(backend), m, n, k)
    except ValueError as e:
        return f"n/a: the oracle cannot quantize this shape ({str(e).splitlines()[0][:120]})"
    try:
        got = backend.gemm(a, b, out_dtype=gemm_out_dtype(backend))
    except Exception as e:  # the error type is the finding
        def again() -> Any:
            a, b = _oracle_pair(recipe, torch.Generator().manual_seed(0), _device(backend), *REGULAR_SHAPE)
            return backend.gemm(a, b, out_dtype=gemm_out_dtype(backend))
        return _raised(e, f"gemm of recipe {recipe.name}", dims, again)
    _assert_in_bound(got, a, b, f"gemm of recipe {recipe.name} at M={m} N={n} K={k}", explain=explain)
    return "correct"


def _edge_quantize(backend: Any, recipe: Recipe, gen: torch.Generator, m: int, n: int, k: int) -> str:
    """x_row [M, K] and w_row [N, K] through the backend's ``quantize`` (every field, bit for
    bit) and ``fake_quantize`` (values), at an edge shape; "correct", "refused: ..." or "n/a:
    ..." where the oracle cannot quantize it; a difference raises NumericsError."""
    dims = {"M": m, "N": n, "K": k}
    # A copy of gen: the GEMM and linear paths after this one draw the inputs they drew before.
    x, w = training_operands(recipe, torch.Generator().set_state(gen.get_state()), _device(backend), m, n, k)
    outcomes = []
    for name, t in (("x_row", x), ("w_row", w)):
        spec = recipe.spec(name)
        try:
            ours = quantize_operand(t, spec, **fresh_state(recipe, name))
        except ValueError as e:  # nothing to compare with; the backend must still refuse clearly or compute
            ours = f"n/a: the oracle cannot quantize {name} {list(t.shape)} ({str(e).splitlines()[0][:120]})"
        where = f"recipe {recipe.name} at M={m} N={n} K={k}"
        for method in ("quantize", "fake_quantize"):
            if not hasattr(backend, method):
                continue
            try:
                theirs = getattr(backend, method)(t, spec, **fresh_state(recipe, name))
            except Exception as e:  # the error type is the finding
                def again(method: str = method, name: str = name, spec: Any = spec) -> Any:
                    regular = dict(zip(("x_row", "w_row"), training_operands(
                        recipe, torch.Generator().manual_seed(0), _device(backend), *REGULAR_SHAPE), strict=True))
                    return getattr(backend, method)(regular[name], spec, **fresh_state(recipe, name))
                outcomes.append(_raised(e, f"{method} of {name}, recipe {recipe.name},", dims, again))
                continue
            if isinstance(ours, str):
                outcomes.append(ours)
                continue
            label = f"edge M={m} N={n} K={k}"
            if method == "quantize":
                d = diagnose_quantize.compare_quantized(t, spec, ours, theirs, operand=name, label=label)
                if d.problem or d.n_differing:
                    diagnose_quantize.attribute(d, QUANTIZE_BEHAVIOURS)
                    raise NumericsError(diagnose_quantize.report([d], 1, f"quantize of {where}"))
            elif problem := values_problem(theirs, t):
                raise NumericsError(f"fake_quantize of {name}, {where}: {problem}")
            else:
                d = ValuesDiff(name, label, spec, t.cpu(), quantized_on_cpu(ours), oracle_values(ours, theirs.dtype).cpu(),
                               theirs.detach().cpu())
                if bool(d.differ.any()):  # attributed as the quantize check's values are
                    attribute_values(d, QUANTIZE_BEHAVIOURS)
                    raise NumericsError(values_report([d], 1, f"fake_quantize of {where}"))
            outcomes.append("correct")
    refused = [o for o in outcomes if o.startswith("refused")]  # the backend's: before "n/a" and "correct"
    return refused[0] if refused else "correct" if "correct" in outcomes else outcomes[0]


def _edge_linear(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any,
                 m: int, n: int, k: int, name: str) -> str:
    dims = {"M": m, "N": n, "K": k}
    x0, w0 = training_operands(recipe, gen, _device(backend), m, n, k)
    b0 = torch.randn(n, generator=gen).bfloat16().float().to(x0.device)
    dy = training_like_cropped(gen, m, n, recipe.g_row).to(x0.device)
    try:
        # Delayed scaling: both sides warmed alike (check_linear's steps), or each would judge
        # its first step from a different history (TE's starts at scale 1).
        states = warmed_states(linear_of(backend), recipe, x0, w0, b0, dy)
        x, w, _, y = _linear(backend, x0, w0, b0, recipe, states=states, dy=dy)
    except Exception as e:  # the error type is the finding
        def again() -> Any:
            g = torch.Generator().manual_seed(0)
            m0, n0, k0 = REGULAR_SHAPE
            x1, w1 = training_operands(recipe, g, _device(backend), m0, n0, k0)
            dy1 = training_like_cropped(g, m0, n0, recipe.g_row).to(x1.device)
            return _linear(backend, x1, w1, torch.zeros(n0, device=x1.device), recipe, dy=dy1)
        return _raised(e, f"linear of recipe {recipe.name}", dims, again)
    got = {"fwd": y, "dgrad": x.grad, "wgrad": w.grad}
    xd, wd = x0.double(), w0.double()
    truth = {"fwd": xd @ wd.T + b0.double(), "dgrad": dy.double() @ wd, "wgrad": dy.double().T @ xd}
    own = own_sr_directions(backend, recipe)  # SR GEMMs with the backend's own bits
    try:
        ref_states = warmed_states(linear_of(_Reference()), recipe, x0, w0, b0, dy)
        rx, rw, _, ry = _linear(_Reference(), x0, w0, b0, recipe, states=ref_states, dy=dy)
        ref, floor, layer = {"fwd": ry, "dgrad": rx.grad, "wgrad": rw.grad}, SAME_OPERANDS_FLOOR_DB, "vs reference Function"
    except ValueError:  # the oracle refuses the shape; the backend computed: hold it to float64 truth
        ref, floor, layer, own = truth, None, "vs float64 truth", ()  # linear_floor: no floor is an error
    for direction in ref:
        if got[direction] is None:
            raise NumericsError(f"linear of recipe {recipe.name} at M={m} N={n} K={k} gave no {direction}")
    stats = bool(own) and sr_statistics_reason(recipe, own) is None
    if stats:
        check_sr_linear(numerics, recipe, [({"x": x0, "w": w0, "b": b0, "dy": dy}, got, ref)], own,
                        {"recipe": recipe.name, "m": m, "n": n, "k": k})
    for direction, r in ref.items():
        fl, lay = floor, layer
        if direction in own:  # judged by SR statistics, or where they cannot, by float64 truth alone
            if stats:
                continue
            r, fl, lay = truth[direction], None, "vs float64 truth (SR, backend's own bits)"
        _snr(numerics, got[direction].double(), r.double(), fl or linear_floor(recipe, direction),
             recipe=recipe.name, layer=f"edge {name}: {lay}", direction=direction, m=m, n=n, k=k)
    return "correct"


def edge_shape_outcome(backend: Any, recipe: Recipe, name: str, gen: torch.Generator,
                       numerics: Any = None) -> dict[str, str]:
    """{"quantize": outcome, "gemm": outcome, "linear": outcome} at EDGE_SHAPES[name] (the
    paths the backend has: ``quantize`` or ``fake_quantize``, ``gemm``, a linear); an outcome
    is "correct", "refused: <error>" or "n/a: ..."; garbage raises NumericsError."""
    if name not in EDGE_SHAPES:
        raise ValueError(f"edge shape {name!r} is not known; expected one of {sorted(EDGE_SHAPES)}")
    out: dict[str, str] = {}
    failures = []
    for path in _edge_paths(backend):  # every path runs, and leaves its record, before a failure is raised
        try:
            out[path] = _edge_path(backend, recipe, gen, numerics, path, name)
        except NumericsError as e:
            failures.append(e)
            out[path] = f"failed: {str(e).splitlines()[0]}"
            _record_shape(numerics, recipe, name, path, "failed", str(e))
        else:
            outcome, passed = _OUTCOME_OF_RESULT[out[path].split(":")[0]]
            _record_shape(numerics, recipe, name, path, outcome, out[path], passed)
    if failures:
        raise NumericsError("\n".join(str(e) for e in failures)) from failures[0]
    return out


# An edge shape's result -> (the record's outcome, whether it passed). A refusal or a shape the
# oracle cannot take is not a check: the report counts it apart, with its reason.
_OUTCOME_OF_RESULT = {"correct": ("passed", True), "refused": ("refused", True), "n/a": ("not_applicable", True)}


def _record_shape(numerics: Any, recipe: Recipe, name: str, path: str, outcome: str, message: str,
                  passed: bool = False) -> None:
    """One record per shape and path: passed, refused (with the reason), not applicable or failed."""
    if numerics is None:
        return
    m, n, k, _ = EDGE_SHAPES[name]
    fields = {"passed": passed, "extra": {"outcome": outcome}}
    numerics.context(recipe=recipe.name, layer=f"edge {name}: {path}", m=m, n=n, k=k).record(
        "edge_shape", Outcome(None, passed, message, fields))


def _edge_path(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any, path: str, name: str,
               explain: bool = True) -> str:
    """One path (quantize, gemm, linear) at EDGE_SHAPES[name]: "correct", "refused: ..." or "n/a: ..."."""
    m, n, k, _ = EDGE_SHAPES[name]
    if path == "quantize":
        return _edge_quantize(backend, recipe, gen, m, n, k)
    if path == "gemm":
        return _edge_gemm(backend, recipe, gen, m, n, k, explain=explain)
    return _edge_linear(backend, recipe, gen, numerics, m, n, k, name)


def _edge_paths(backend: Any) -> tuple[str, ...]:
    quantizes = hasattr(backend, "quantize") or hasattr(backend, "fake_quantize")
    return tuple(p for p, has in (("quantize", quantizes), ("gemm", hasattr(backend, "gemm")),
                                  ("linear", linear_of(backend) is not None)) if has)


def check_edge_shapes(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """Every EDGE_SHAPES entry computes correctly or raises a clear error naming the dim.

    Every shape runs on every path (quantize or fake_quantize, gemm, linear), so a failure lists each failing shape with
    its first message line, the passing ones, and where one holds, the divisibility of M, N or
    K that separates failing from correct shapes (``diagnose.shapes``)."""
    paths = _edge_paths(backend)
    if not paths:
        return "backend has neither quantize, fake_quantize, gemm nor linear"
    outcomes: dict[str, dict[str, str]] = {p: {} for p in paths}  # path -> shape -> outcome
    failed: dict[str, dict[str, str]] = {p: {} for p in paths}  # path -> shape -> first message line
    for name in EDGE_SHAPES:
        for path in paths:
            try:
                # Each shape's first line is kept: the GEMM behaviours are not run for it.
                outcomes[path][name] = _edge_path(backend, recipe, gen, numerics, path, name, explain=False)
            except NumericsError as e:
                failed[path][name] = str(e).splitlines()[0]
    if any(failed.values()):
        raise NumericsError(_edge_failures(recipe, paths, outcomes, failed))
    return None


def _edge_failures(recipe: Recipe, paths: tuple[str, ...], outcomes: dict[str, dict[str, str]],
                   failed: dict[str, dict[str, str]]) -> str:
    """The message: per path, the failing shapes' count and pattern first (the line a summary
    keeps), then every failing shape with its first line, then the others' outcomes."""
    def dims(name: str) -> dict[str, int]:
        return dict(zip(("M", "N", "K"), EDGE_SHAPES[name][:3], strict=True))

    heads, body = [], []
    for path in paths:
        if not failed[path]:
            continue
        correct = {s: dims(s) for s, o in outcomes[path].items() if o == "correct"}
        patterns = shape_patterns({s: dims(s) for s in failed[path]}, correct)
        heads.append(f"{path} fails at {len(failed[path])} of {len(EDGE_SHAPES)} shapes"
                     + (f" ({'; '.join(patterns)})" if patterns else ""))
        body += [f"{path} at {s} ({' '.join(f'{d}={v}' for d, v in dims(s).items())}): {line}"
                 for s, line in failed[path].items()]
    for path in paths:
        body.append(f"{path} passes at: " + (", ".join(f"{s} ({o})" if o != "correct" else s
                                                        for s, o in outcomes[path].items()) or "no shape"))
    return "\n".join([f"edge shapes of recipe {recipe.name}: {'; '.join(heads)}", *body])
