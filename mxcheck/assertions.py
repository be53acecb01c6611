"""Assertions whose failure message says what differs, where, and how to reproduce it.

Each ``assert_*`` returns what it measured and raises :class:`NumericsError` naming the
comparison (``context``: backend, recipe, layer, direction, M/N/K), the numbers and the
worst elements. :class:`Numerics` (the plugin's ``numerics`` fixture) runs the same checks
and records a :class:`~mxcheck.report.schema.Record` for each, pass or fail, before it
raises. DESIGN.md's traps are refused rather than passed vacuously: an all-zero SNR
comparison fails and ``assert_nonzero_grads`` names every zero or missing gradient
(trap 1); ``count_graph_breaks`` refuses inputs with no autograd graph (trap 3).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mxcheck.formats import FORMATS, FloatFormat
from mxcheck.metrics import ULP_NAN, BitDiff, bit_diff, cosine, max_abs_error, snr_db
from mxcheck.report.schema import Record

__all__ = [
    "CONTEXT_KEYS",
    "Numerics",
    "NumericsError",
    "RoundingResult",
    "SNRResult",
    "assert_bitwise_equal",
    "assert_deterministic",
    "assert_nonzero_grads",
    "assert_snr",
    "assert_within_rounding",
    "count_graph_breaks",
    "ulp",
]

Context = Mapping[str, object] | None
CONTEXT_KEYS = ("backend", "recipe", "layer", "direction", "m", "n", "k")
_ZERO_INIT_HINT = ("a zero-initialised output layer (adaLN-Zero, DESIGN.md trap 1) makes every "
                   "upstream gradient exactly zero: break the zero-init before checking a GEMM")
# torch dtype -> the format with its exact layout (bf16, fp16, the fp8 types, e8m0).
_DTYPE_FORMATS = {f.torch_dtype: f for f in FORMATS.values()
                  if f.torch_dtype is not None and f.bits == 8 * f.torch_dtype.itemsize}


class NumericsError(AssertionError):
    """A numeric check failed; the message names the comparison and what differs."""


@dataclass(frozen=True)
class _Outcome:
    value: Any  # what the public assert returns
    passed: bool
    message: str
    fields: dict[str, Any] = field(default_factory=dict)  # the Record fields it fills


def _raise_unless(out: _Outcome) -> Any:
    if not out.passed:
        raise NumericsError(out.message)
    return out.value


def _say(head: str, context: Context, *details: str) -> str:
    """``head: backend=b recipe=r layer=l wgrad M=.. N=.. K=.. other=..; detail; ...``"""
    ctx = {k: v for k, v in (context or {}).items() if v is not None and v != ""}
    where = [f"{k}={ctx[k]}" for k in ("backend", "recipe", "layer") if k in ctx]
    where += [str(ctx["direction"])] if "direction" in ctx else []
    where += [f"{k.upper()}={ctx[k]}" for k in ("m", "n", "k") if k in ctx]
    where += [f"{k}={v}" for k, v in ctx.items() if k not in CONTEXT_KEYS]
    return "; ".join([f"{head}: {' '.join(where)}" if where else head, *filter(None, details)])


def _check_pair(test: torch.Tensor, ref: torch.Tensor, names: tuple[str, str]) -> None:
    for name, t in zip(names, (test, ref), strict=True):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if test.shape != ref.shape:
        raise ValueError(f"{names[0]}.shape={tuple(test.shape)} and {names[1]}.shape="
                         f"{tuple(ref.shape)} differ; compare tensors of one shape")


def _index(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape)))


def _digest(t: torch.Tensor) -> str:
    """First 16 hex digits of the sha256 of the tensor's bytes (row-major)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    raw = flat.to(torch.uint8) if flat.dtype == torch.bool else flat.view(torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]


@dataclass(frozen=True)
class SNRResult:
    """An SNR comparison; ``worst`` holds the 5 largest |errors| as (index, test, ref)."""

    snr_db: float
    threshold_db: float
    cosine: float
    max_abs_error: float
    worst: list[tuple[tuple[int, ...], float, float]]
    passed: bool
    mismatches: int = 0  # elements whose values differ
    total: int = 0

    def to_record_fields(self) -> dict[str, Any]:
        """snr_db, threshold_db, cosine, max_abs_error, passed, mismatches, total."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "worst"}


def _check_snr(test: torch.Tensor, ref: torch.Tensor, threshold_db: float,
               context: Context) -> _Outcome:
    _check_pair(test, ref, ("test", "ref"))
    threshold_db = float(threshold_db)
    t, r = test.detach().double(), ref.detach().double()
    snr, cos, mae = snr_db(test, ref), cosine(test, ref), max_abs_error(test, ref)
    err = (t - r).abs().reshape(-1).nan_to_num(nan=math.inf)
    top = err.topk(min(5, err.numel()))
    worst = [(_index(i, t.shape), float(t.reshape(-1)[i]), float(r.reshape(-1)[i]))
             for v, i in zip(top.values.tolist(), top.indices.tolist(), strict=True) if v > 0]
    vacuous = not bool(r.any()) and not bool(t.any())
    passed = not vacuous and not math.isnan(snr) and snr >= threshold_db
    value = SNRResult(snr, threshold_db, cos, mae, worst, passed, int((err > 0).sum()), t.numel())
    nd = 1 if f"{snr:.1f}" != f"{threshold_db:.1f}" else 4  # never print "20.0 < 20.0"
    details = [f"{value.mismatches:,} of {t.numel():,} elements differ",
               f"cosine {cos:.6g}, max abs error {mae:.6g}"]
    if vacuous:
        head = f"SNR comparison is vacuous: test and ref are all zero ({t.numel():,} elements)"
        details = [_ZERO_INIT_HINT]
    elif math.isnan(snr):
        head = (f"SNR is NaN (threshold {threshold_db:.{nd}f} dB): test has "
                f"{int(t.isnan().sum()):,} NaN, ref {int(r.isnan().sum()):,} NaN and "
                f"{int(r.isinf().sum()):,} Inf")
    else:
        head = f"SNR {snr:.{nd}f} dB {'>=' if passed else '<'} {threshold_db:.{nd}f} dB"
    if worst and not passed and not vacuous:
        details.append("largest errors: " + ", ".join(
            f"{list(i)} test {tv:.6g} ref {rv:.6g}" for i, tv, rv in worst))
    return _Outcome(value, passed, _say(head, context, *details), value.to_record_fields())


def assert_snr(test: torch.Tensor, ref: torch.Tensor, threshold_db: float, *,
               context: Context = None) -> SNRResult:
    """SNR of test against ref (float64, DESIGN.md's definition) must reach threshold_db.

    A NaN SNR fails, and so does an all-zero test against an all-zero ref: that comparison
    has no signal and would pass whatever the backend did (the zero-init trap).
    """
    return _raise_unless(_check_snr(test, ref, threshold_db, context))


def _float_max_ulp(t: torch.Tensor, r: torch.Tensor) -> int:
    """Max ULP distance of two float tensors of one dtype, on their monotone integer order."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]

    def order(x: torch.Tensor) -> torch.Tensor:
        v = x.contiguous().view(ints).to(torch.int64)
        return torch.where(v < 0, -(v & torch.iinfo(ints).max), v)

    dist = (order(t) - order(r)).abs()
    dist = torch.where(t.isnan() & r.isnan(), 0, torch.where(t.isnan() ^ r.isnan(), ULP_NAN, dist))
    return int(dist.max())


def _check_bitwise(test: torch.Tensor, ref: torch.Tensor, fmt: str | FloatFormat | None,
                   context: Context) -> _Outcome:
    _check_pair(test, ref, ("test", "ref"))
    if test.dtype != ref.dtype:
        raise TypeError(f"test.dtype={test.dtype} and ref.dtype={ref.dtype}; bitwise equality "
                        "needs one dtype: cast the one you mean to compare")
    test, ref = test.detach(), ref.detach()
    fmt = _DTYPE_FORMATS.get(test.dtype) if fmt is None else fmt
    diff = bit_diff(test, ref, fmt)
    if fmt is None and test.dtype.is_floating_point and not diff.equal:  # float32, float64
        diff = dataclasses.replace(
            diff, fmt=str(test.dtype).removeprefix("torch."), max_ulp=_float_max_ulp(test, ref),
            test_values=tuple(float(test[i]) for i in diff.indices),
            ref_values=tuple(float(ref[i]) for i in diff.indices))
    ulps = diff.max_ulp
    how = ", ".join([diff.fmt or str(test.dtype).removeprefix("torch.")] + (
        [] if ulps is None else ["max ulp NaN vs number" if ulps >= ULP_NAN else f"max {ulps} ulp"]))
    head = (f"bit-identical: {diff.total:,} elements ({how})" if diff.equal else
            f"{diff.n_diff:,} of {diff.total:,} elements differ bitwise ({how})")
    msg = _say(head, context, f"shape {list(diff.shape)}")
    if not diff.equal:  # BitDiff's list of the first differences, one per line
        msg += "\n" + "\n".join(str(diff).split("\n")[1:])
    fields = {"bit_equal": diff.equal, "mismatches": diff.n_diff, "total": diff.total,
              "passed": diff.equal, "extra": {"max_ulp": ulps}}
    return _Outcome(diff, diff.equal, msg, fields)


def assert_bitwise_equal(test: torch.Tensor, ref: torch.Tensor, *,
                         fmt: str | FloatFormat | None = None, context: Context = None) -> BitDiff:
    """test and ref must hold the same bits (floats through integer views, so NaN payloads
    and signs, and -0 against +0, count). Code tensors with ``fmt``, and float tensors, get
    their first differences decoded and the largest ULP distance in the message.
    """
    return _raise_unless(_check_bitwise(test, ref, fmt, context))


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at the magnitude of each element of x, in float64.

    For |x| in [2**e, 2**(e+1)) it is 2**(e - mantissa bits); below the smallest normal
    (subnormals and zero) it is the smallest subnormal. NaN for non-finite x.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype={dtype!r}; expected a torch floating dtype such as torch.bfloat16")
    fi = torch.finfo(dtype)
    mbits = 1 - math.frexp(fi.eps)[1]  # eps = 2**-mbits = 0.5 * 2**(1 - mbits)
    emin = math.frexp(fi.smallest_normal)[1] - 1
    a = x.detach().to(torch.float64).abs()
    exponent = torch.frexp(a).exponent.to(torch.float64) - 1  # a = m * 2**e, m in [0.5, 1)
    exponent = torch.where(a >= fi.smallest_normal, exponent, float(emin))
    return torch.where(a.isfinite(), torch.ldexp(torch.ones_like(a), exponent - mbits), math.nan)


@dataclass(frozen=True)
class RoundingResult:
    """How far result is from exact in ulps of ``dtype``; the worst element by ulps."""

    dtype: torch.dtype
    k: int
    max_ulps: float
    worst_index: tuple[int, ...]
    worst_result: float
    worst_exact: float
    max_abs_error: float
    exceed: int  # elements more than k ulps away
    total: int
    passed: bool


def _check_rounding(result: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype, k: int,
                    context: Context) -> _Outcome:
    _check_pair(result, exact, ("result", "exact"))
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k={k!r}; expected an int >= 0 (how many ulps, one per rounding)")
    r, e = result.detach().double(), exact.detach().double()
    u = ulp(e, dtype).reshape(-1)
    same = ((r == e) | (r.isnan() & e.isnan())).reshape(-1)
    diff = torch.where(same, 0.0, (r - e).abs().reshape(-1))
    ulps = torch.where(same, 0.0, (diff / u).nan_to_num(nan=math.inf))
    exceed, i, name = int((ulps > k).sum()), int(ulps.argmax()), str(dtype).removeprefix("torch.")
    value = RoundingResult(dtype, k, float(ulps[i]), _index(i, r.shape), float(r.reshape(-1)[i]),
                           float(e.reshape(-1)[i]), float(diff.max()), exceed, r.numel(), not exceed)
    head = (f"{exceed:,} of {r.numel():,} elements more than {k} {name} ulp from exact" if exceed
            else f"all {r.numel():,} elements within {k} {name} ulp of exact")
    worst = (f"worst {list(value.worst_index)}: result {value.worst_result!r} exact "
             f"{value.worst_exact!r} is {value.max_ulps:.3g} ulp (ulp there {float(u[i])!r})")
    fields = {"max_abs_error": value.max_abs_error, "mismatches": exceed, "total": r.numel(),
              "passed": value.passed, "extra": {"max_ulps": value.max_ulps, "k": k, "dtype": name}}
    return _Outcome(value, value.passed, _say(head, context, worst), fields)


def assert_within_rounding(result: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype, *,
                           k: int = 1, context: Context = None) -> RoundingResult:
    """|result - exact| <= k * ulp(exact, dtype) elementwise (equal NaNs and Infs pass).

    One correct rounding errs by at most half an ulp and a double rounding (say float32,
    then bf16) by just over half, so k=1 holds a result rounded once or twice; allow one
    more ulp per further rounding the computation performs.
    """
    return _raise_unless(_check_rounding(result, exact, dtype, k, context))


def _named(params: Any, names: Sequence[str] | None) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, torch.nn.Module):
        pairs = [(n, p) for n, p in params.named_parameters() if p.requires_grad]
    else:
        pairs = list(params)
        if not all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], torch.Tensor)
                   for p in pairs):
            raise TypeError("params must be an nn.Module or (name, tensor) pairs")
    if names is not None:
        known = dict(pairs)
        missing = [n for n in names if n not in known]
        if missing:
            raise ValueError(f"names {missing} are not among the parameters {sorted(known)}")
        pairs = [(n, known[n]) for n in names]
    if not pairs:
        raise ValueError("no parameters to check: an empty list passes vacuously; pass the "
                         "module or the (name, tensor) pairs whose gradients must be non-zero")
    return [(str(n), p) for n, p in pairs]


def _check_grads(params: Any, names: Sequence[str] | None, context: Context) -> _Outcome:
    pairs = _named(params, names)
    measured: dict[str, float | None] = {}
    bad: dict[str, list[str]] = {"none": [], "zero": [], "nonfinite": []}
    for name, p in pairs:
        g = None if p.grad is None else p.grad.detach()
        measured[name] = None if g is None else float(g.double().abs().max()) if g.numel() else 0.0
        why = ("none" if g is None else "nonfinite" if not bool(g.isfinite().all())
               else "zero" if not bool(g.any()) else None)
        if why:
            bad[why].append(name)
    says = {"none": "grad is None", "zero": "grad is all zeros", "nonfinite": "grad has NaN/Inf"}
    listed = [f"{n}: {says[why]}" for why, ns in bad.items() for n in ns]
    head = (f"{len(listed)} of {len(pairs)} parameters have no usable gradient" if listed
            else f"all {len(pairs)} parameters have non-zero gradients")
    hint = _ZERO_INIT_HINT if bad["zero"] else ""
    fields = {"mismatches": len(listed), "total": len(pairs), "passed": not listed,
              "extra": {k: v for k, v in bad.items() if v}}
    return _Outcome(measured, not listed, _say(head, context, *listed, hint), fields)


def assert_nonzero_grads(params: torch.nn.Module | Iterable[tuple[str, torch.Tensor]], *,
                         names: Sequence[str] | None = None,
                         context: Context = None) -> dict[str, float | None]:
    """Every listed parameter has a finite gradient that is not all zeros.

    ``params``: a module (its trainable parameters) or (name, tensor) pairs; ``names``
    picks some of them. Returns name -> max |grad| (None for a missing grad). The failure
    lists every offender and says whether its grad is None, all zeros or non-finite. An
    empty list is refused (ValueError).
    """
    return _raise_unless(_check_grads(params, names, context))


def _leaves(obj: Any, path: str = "out") -> Iterator[tuple[str, Any]]:
    """(path, leaf) for tensors and other leaves in nested lists, tuples and dicts."""
    if isinstance(obj, Mapping):
        for key, v in obj.items():
            yield from _leaves(v, f"{path}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, obj


def _tensors(obj: Any) -> list[torch.Tensor]:
    return [v for _, v in _leaves(obj) if isinstance(v, torch.Tensor)]


def _autograd_leaves(roots: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every leaf tensor the autograd graph of roots accumulates into."""
    seen, out, stack = set(), [], [t.grad_fn for t in roots]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            leaf = getattr(node, "variable", None)  # only AccumulateGrad nodes have one
            out += [leaf] if leaf is not None else []
            stack += [n for n, _ in node.next_functions]
    return out


def _backward_graphs(fn: Callable[..., Any], args: tuple, kwargs: dict) -> int:
    """Graphs dynamo compiles for the backward of one eager call, under compiled autograd."""
    import torch._dynamo.compiled_autograd as compiled_autograd  # noqa: PLC0415

    roots = [t for t in _tensors(fn(*args, **kwargs)) if t.grad_fn is not None]
    if not roots:
        raise ValueError("no output of fn carries an autograd graph, so there is no backward "
                         "to trace; pass backward=False to count the forward only")
    graphs = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append(gm)
        return gm.forward

    loss = sum(t.float().sum() for t in roots)
    with compiled_autograd._enable(lambda gm: torch.compile(gm, backend=counting_backend)):
        # autograd.grad, not .backward(): the caller's .grad fields stay as they were.
        torch.autograd.grad(loss, _autograd_leaves(roots), allow_unused=True)
    return len(graphs)


def count_graph_breaks(fn: Callable[..., Any], *args: Any, backward: bool = True,
                       **kwargs: Any) -> int:
    """Graph breaks torch.compile meets in fn's forward and (by default) its backward.

    Forward: ``torch._dynamo.explain(fn)(*args, **kwargs).graph_break_count``. With an input
    that requires grad, dynamo (torch 2.13) traces each custom autograd Function's backward
    while tracing the forward, so a break inside it shows as a break at ``apply``; without
    one it is never traced and reads zero (DESIGN.md trap 3): refused with a ValueError.
    Backward: fn runs eagerly once more and the gradient of the sum of its outputs is taken
    under compiled autograd, counting graphs - 1 as explain does; custom Functions' Python
    backward and tensor hooks are traced there, and one break in them counts more than
    once (the compiled-autograd graph splits around the call too). So 0 means clean; the
    size of a positive count is dynamo's. No ``.grad`` is changed. A module ``fn`` (or its
    bound method) counts its parameters as inputs. Dynamo is reset before and after, and
    warnings torch raises from inside its own tracing are silenced.
    """
    found = _tensors((args, kwargs))
    found += [p for m in (fn, getattr(fn, "__self__", None)) if isinstance(m, torch.nn.Module)
              for p in m.parameters()]
    if not any(t.requires_grad for t in found):
        raise ValueError(
            f"none of the {len(found)} tensor inputs requires grad: without an autograd graph "
            "dynamo never traces the backward (custom Functions' backward included), so the "
            "count reads zero whatever it holds (DESIGN.md trap 3); call requires_grad_() on "
            "the inputs or weights the backward differentiates")
    import torch._dynamo as dynamo  # noqa: PLC0415

    with warnings.catch_warnings():
        # torch warns from inside its own tracing (an autograd.Function instantiated, .grad
        # of a non-leaf read); under pytest's -W error those would abort the trace.
        warnings.filterwarnings("ignore", module=r"torch(\.|$)")
        dynamo.reset()
        try:
            breaks = dynamo.explain(fn)(*args, **kwargs).graph_break_count
            if backward:
                dynamo.reset()
                breaks += max(_backward_graphs(fn, args, kwargs) - 1, 0)
        finally:
            dynamo.reset()
    return breaks


def _first_difference(a: list[tuple[str, Any]], b: list[tuple[str, Any]]) -> tuple[str, int]:
    """(where the first difference is, how many elements differ there), or ("", 0)."""
    if [p for p, _ in a] != [p for p, _ in b]:
        return f"output structure differs: {[p for p, _ in a]} vs {[p for p, _ in b]}", 1
    for (path, x), (_, y) in zip(a, b, strict=True):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            if type(x) is not type(y) or (x != y and not (x != x and y != y)):  # NaN == NaN
                return f"{path}: {x!r} vs {y!r}", 1
        elif x.dtype != y.dtype or x.shape != y.shape:
            return f"{path}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}", x.numel()
        else:
            x, y = (x.to(torch.uint8), y.to(torch.uint8)) if x.dtype == torch.bool else (x, y)
            x, y = (torch.view_as_real(x), torch.view_as_real(y)) if x.is_complex() else (x, y)
            d = bit_diff(x.detach(), y.detach(), limit=1)
            if not d.equal:
                i = d.indices[0]
                return (f"{path}: {d.n_diff:,} of {d.total:,} elements differ; first {list(i)}: "
                        f"{x[i].item()!r} (bits {d.test_codes[0]:#x}) vs {y[i].item()!r} "
                        f"(bits {d.ref_codes[0]:#x})"), d.n_diff
    return "", 0


def _check_deterministic(fn: Callable[..., Any], args: tuple, kwargs: dict, runs: int,
                         context: Context) -> _Outcome:
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"runs={runs!r}; expected an int >= 2")
    output = fn(*args, **kwargs)
    # Cloned: a function that returns one reused buffer would otherwise match itself.
    first = [(p, v.detach().clone() if isinstance(v, torch.Tensor) else v)
             for p, v in _leaves(output)]
    total = sum(v.numel() for _, v in first if isinstance(v, torch.Tensor))
    fields = {"total": total, "extra": {"runs": runs}}
    for run in range(2, runs + 1):
        problem, n_diff = _first_difference(first, list(_leaves(fn(*args, **kwargs))))
        if problem:
            msg = _say(f"not deterministic: run {run} of {runs} differs from run 1", context,
                       problem)
            return _Outcome(None, False, msg, {**fields, "passed": False, "mismatches": n_diff})
    msg = _say(f"deterministic: {runs} runs bit-identical ({total:,} tensor elements)", context)
    return _Outcome(output, True, msg, {**fields, "passed": True, "mismatches": 0})


def assert_deterministic(fn: Callable[..., Any], *args: Any, runs: int = 3,
                         context: Context = None, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) called ``runs`` times gives bit-identical outputs (tensors in
    nested lists, tuples and dicts through integer views; other leaves by ==). Returns
    the first run's output; the failure names the first differing output and element.
    """
    return _raise_unless(_check_deterministic(fn, args, kwargs, runs, context))


def _check_precision(manifest: Any, recipe: Any, kwargs: dict[str, Any], context: Context) -> _Outcome:
    fields: dict[str, Any] = {"extra": {"precision_manifest": manifest.to_json()}}
    try:
        manifest.check(recipe, **kwargs)
    except NumericsError as e:  # PrecisionError: the layers and directions that ran otherwise
        return _Outcome(manifest, False, _say("precision manifest", context, str(e)), {**fields, "passed": False})
    return _Outcome(manifest, True, "", {**fields, "passed": True})


class Numerics:
    """The ``numerics`` fixture: the assertions above with the test's context, each
    recorded into the report (pass or fail) before a failure is raised.

    Give each comparison of one test a distinct layer/direction through ``.context`` so
    ``mxcheck compare`` can pair it with its baseline. An empty recipe is recorded as "none".
    """

    def __init__(self, record: Callable[[Record], None], test_id: str,
                 backend: str = "emulated", recipe: str = "", *, context: Context = None) -> None:
        self._record = record
        self.test_id = test_id
        self._context = {"backend": backend, "recipe": recipe, **dict(context or {})}

    def context(self, **fields: object) -> Numerics:
        """A new Numerics with these fields (backend, recipe, layer, direction, m, n, k)."""
        unknown = sorted(set(fields) - set(CONTEXT_KEYS))
        if unknown:
            raise ValueError(f"unknown context field(s) {unknown}; expected {list(CONTEXT_KEYS)}")
        return Numerics(self._record, self.test_id, context={**self._context, **fields})

    def _run(self, kind: str, out: _Outcome, digest: str | None = None) -> Any:
        ctx, fields = self._context, dict(out.fields)
        extra = {**fields.pop("extra", {}), **({"digest": digest} if digest else {})}
        self._record(Record(
            test_id=self.test_id, backend=str(ctx.get("backend") or "emulated"),
            recipe=str(ctx.get("recipe") or "none"), layer=ctx.get("layer"),
            direction=ctx.get("direction"), m=ctx.get("m"), n=ctx.get("n"), k=ctx.get("k"),
            kind=kind, message=out.message, extra=extra, **fields))
        return _raise_unless(out)

    def snr(self, test: torch.Tensor, ref: torch.Tensor, threshold_db: float) -> SNRResult:
        return self._run("snr", _check_snr(test, ref, threshold_db, self._context), _digest(test))

    def bitwise(self, test: torch.Tensor, ref: torch.Tensor,
                fmt: str | FloatFormat | None = None) -> BitDiff:
        return self._run("bitwise", _check_bitwise(test, ref, fmt, self._context), _digest(test))

    def within_rounding(self, result: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype, *,
                        k: int = 1) -> RoundingResult:
        return self._run("rounding", _check_rounding(result, exact, dtype, k, self._context))

    def nonzero_grads(self, params: torch.nn.Module | Iterable[tuple[str, torch.Tensor]], *,
                      names: Sequence[str] | None = None) -> dict[str, float | None]:
        return self._run("grads", _check_grads(params, names, self._context))

    def precision(self, manifest: Any, recipe: Any, **check_kwargs: Any) -> Any:
        """``manifest.check(recipe)`` (a ``mxcheck.manifest.PrecisionManifest``), recorded
        with the whole manifest in the record's ``extra["precision_manifest"]``."""
        return self._run("precision", _check_precision(manifest, recipe, check_kwargs, self._context))

    def deterministic(self, fn: Callable[..., Any], *args: Any, runs: int = 3,
                      **kwargs: Any) -> Any:
        out = _check_deterministic(fn, args, kwargs, runs, self._context)
        tensors = _tensors(out.value) if out.passed else []
        digest = hashlib.sha256("".join(map(_digest, tensors)).encode()).hexdigest()[:16]
        return self._run("deterministic", out, digest if tensors else None)
