"""Prove what ran: a precision manifest of every linear's quantize and GEMM operations.

``with trace_precision(model) as m:`` runs a ``TorchDispatchMode`` that sees every op
dispatched during a forward and backward, and attributes to each linear and direction
(fwd, dgrad, wgrad):

- ``mxcheck::quantize`` / ``mxcheck::gemm``, which the reference Function dispatches for
  every operand it quantizes and every GEMM it runs (``mxcheck.trace_ops``), carrying the layer,
  operand or direction, format, scaling and scale rule actually applied;
- known vendor ops (``VENDOR_OPS``: Primus' ``primus::quantize_mxfp4_dual``, Primus-Turbo's
  ``gemm_fp4_impl``/``gemm_fp6_impl``/``gemm_fp8_impl`` and their ``*_accum_impl`` forms,
  AITER's ``gemm_a4w4`` and ``_gemm_a6w6_asm``, ``aten::_scaled_mm``) with formats read from
  their dtypes (``float4_e2m1fn_x2`` is e2m1);
- ``mxcheck::gemm`` announced with format ``UNTRACED`` by an adapter whose vendor runs its
  quantize and GEMM through pybind11 calls a dispatch trace cannot see (TransformerEngine's
  ``tex.quantize``/``tex.generic_gemm``): ``check`` then says so for that layer instead of
  claiming a precision it could not observe;
- plain matmuls (``aten::mm``, ``addmm``, ...) in a float dtype: a GEMM that ran in bf16.

Attribution: forward ops belong to the innermost linear whose forward is running (module
hooks). Backward ops carrying a layer name (mxcheck's) are exact; other backward GEMMs are
matched by operand storage (dgrad reads the layer's weight, wgrad its saved input), else
to the linear whose backward started last, with the direction read from the output shape.

``m.check(recipe)`` fails closed: a replaced linear with no recorded GEMM, a GEMM in a
float dtype where the recipe quantizes, or an operand quantized with another format,
scaling or scale rule raises ``PrecisionError`` naming the layer, direction and operand.
``m.to_json()`` is what goes into a report (top-level key ``precision_manifest``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import warnings
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mxcheck.flux.quantize import DEFAULT_INCLUDE, patterns
from mxcheck.outcome import Context, NumericsError, Outcome, say
from mxcheck.recipes import GEMM_DIRECTIONS, Recipe, get_recipe
from mxcheck.trace_ops import UNTRACED, in_oracle

__all__ = ["FLOAT_GEMM_OPS", "UNTRACED", "VENDOR_OPS", "OpEntry", "PrecisionError", "PrecisionManifest", "check_precision",
           "trace_precision"]

_OPERAND_DIRECTION = {"x_row": "fwd", "w_row": "fwd", "g_row": "dgrad", "w_col": "dgrad",
                      "g_col": "wgrad", "x_col": "wgrad"}
# Matmuls that, on float inputs, are a GEMM run in that float dtype.
FLOAT_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")
# Vendor ops by name (the part after "::", any namespace): (kind, element format or None
# when the operand dtype says it, scaling). Names as dispatched: AITER's gemm_a4w4 is an
# aiter:: op from v0.1.7 (torch_compile_guard); gemm_a6w6 is plain Python around
# aiter::_gemm_a6w6_asm (compile_ops names the op after the function, branch
# mxfp6-gemms-clean 878d1dea); Primus-Turbo's are primus_turbo:: custom ops (a6a16cdc).
# TransformerEngine has none: cast_to_fp8 was TorchScript-only and left in TE 2.0.
VENDOR_OPS: dict[str, tuple[str, str | None, str]] = {
    "_scaled_mm": ("gemm", None, "fp8"),
    "quantize_mxfp4_dual": ("quantize", "e2m1", "mx"),
    "gemm_fp4_impl": ("gemm", "e2m1", "mx"),
    "gemm_fp4_accum_impl": ("gemm", "e2m1", "mx"),
    "gemm_fp6_impl": ("gemm", "fp6", "mx"),
    "gemm_fp8_impl": ("gemm", None, "fp8"),
    "gemm_fp8_accum_impl": ("gemm", None, "fp8"),
    "gemm_a4w4": ("gemm", "e2m1", "mx"),
    "_gemm_a6w6_asm": ("gemm", "fp6", "mx"),
    "quantize_fp8_tensorwise": ("quantize", None, "fp8"),
}
_FP8_DTYPES = {getattr(torch, n): f for n, f in (("float8_e4m3fn", "e4m3"), ("float8_e5m2", "e5m2"),
               ("float8_e4m3fnuz", "e4m3fnuz"), ("float8_e5m2fnuz", "e5m2fnuz")) if hasattr(torch, n)}
# Element format of a low-precision operand dtype (fp4 packs two e2m1 codes per byte).
_OPERAND_FORMATS = {**_FP8_DTYPES, **({torch.float4_e2m1fn_x2: "e2m1"} if hasattr(torch, "float4_e2m1fn_x2") else {})}


class PrecisionError(NumericsError):
    """A linear ran in another precision than its recipe says."""


@dataclass(frozen=True)
class OpEntry:
    """One recorded op of one linear and direction."""

    layer: str
    direction: str
    kind: str  # "quantize" | "gemm"
    op: str  # qualified op name, e.g. "mxcheck::quantize", "aten::mm"
    operand: str | None = None  # x_row ... for mxcheck::quantize
    fmt: str | None = None  # element format, or the float dtype of a plain GEMM
    scaling: str | None = None
    scale_rule: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        what = " ".join(str(v) for v in (self.operand, self.fmt, self.scaling, self.scale_rule) if v)
        return f"{self.op} {what}".strip()

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, {})}


@dataclass
class _LinearState:
    weight_storage: int
    weight_shape: tuple[int, ...]
    # storage address -> the input tensor seen there in forward, weakly: once that tensor is
    # freed its address may be reused by any later tensor, which must not count as this input
    # (a false bf16 wgrad in 2 of 4 CI runs of the 2-rank check before this).
    input_storages: dict[int, weakref.ref] = field(default_factory=dict)


def _storage(t: Any) -> int | None:
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _dtype_name(t: Any) -> str | None:
    return str(t.dtype).removeprefix("torch.") if isinstance(t, torch.Tensor) else None


class PrecisionManifest(TorchDispatchMode):
    """Records ops per linear and direction while active; see the module docstring."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.entries: list[OpEntry] = []
        self.unattributed: list[str] = []
        self.backward_seen = False
        self._linears: dict[str, _LinearState] = {}
        self._forward_stack: list[str] = []
        self._backward_layer: str | None = None
        self._handles: list[Any] = []
        self._names = [n for n, m in model.named_modules() if _is_linear(m)]
        for name, mod in model.named_modules():
            if _is_linear(mod):
                self._handles += [
                    mod.register_forward_pre_hook(self._enter(name)),
                    mod.register_forward_hook(self._leave(name)),
                    mod.register_full_backward_pre_hook(self._backward_start(name)),
                ]

    # ---- hooks --------------------------------------------------------------------------

    def _enter(self, name: str):
        def hook(mod: nn.Module, args: tuple) -> None:
            state = self._linears.setdefault(name, _LinearState(_storage(mod.weight) or 0, tuple(mod.weight.shape)))
            if args and (s := _storage(args[0])) is not None:
                state.input_storages[s] = weakref.ref(args[0])
            self._forward_stack.append(name)
        return hook

    def _leave(self, name: str):
        def hook(mod: nn.Module, args: tuple, out: Any) -> None:
            if self._forward_stack and self._forward_stack[-1] == name:
                self._forward_stack.pop()
        return hook

    def _backward_start(self, name: str):
        def hook(mod: nn.Module, grad_output: Any) -> None:
            self._backward_layer = name
            self.backward_seen = True
        return hook

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # ---- dispatch -----------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        try:
            self._record(func, args, out)
        except Exception as e:  # never break the traced model; say what could not be recorded
            self.unattributed.append(f"{func.name()}: could not record ({e})")
        return out

    def _record(self, func: Any, args: tuple, out: Any) -> None:
        name = func.name()  # "aten::mm", "mxcheck::quantize"
        short = name.split("::")[-1].split(".")[0]
        if name == "mxcheck::quantize":
            _, layer, operand, fmt, scaling, rule, block, rounding = args[:8]
            self._add(OpEntry(layer, _OPERAND_DIRECTION[operand], "quantize", name, operand, fmt, scaling,
                              rule if scaling == "mx" else None, {"block_size": block, "rounding": rounding}))
        elif name == "mxcheck::gemm":
            _, layer, direction, a_fmt, b_fmt, backend = args[:6]
            entry = OpEntry(layer, direction, "gemm", name, None, a_fmt, None, None, {"b_fmt": b_fmt, "backend": backend})
            if layer:
                self._add(entry)
            else:  # an adapter that does not know the layer: the running linear, its direction kept
                owner = self._forward_stack[-1] if direction == "fwd" and self._forward_stack else self._backward_layer
                if owner:
                    self._add(dataclasses.replace(entry, layer=owner))
                else:
                    self.unattributed.append(entry.describe())
        elif in_oracle():
            return  # the oracle's own arithmetic, already announced above
        elif short in VENDOR_OPS:
            kind, fmt, scaling = VENDOR_OPS[short]
            fmt = fmt or _OPERAND_FORMATS.get(getattr(args[0], "dtype", None)) or _dtype_name(args[0])
            self._attribute(args, out, OpEntry("", "", kind, name, None, fmt, scaling))
        elif name in FLOAT_GEMM_OPS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if tensors and all(t.dtype.is_floating_point and t.dtype not in _FP8_DTYPES for t in tensors):
                self._attribute(args, out, OpEntry("", "", "gemm", name, None, _dtype_name(tensors[-1]), "none"))

    def _attribute(self, args: tuple, out: Any, entry: OpEntry) -> None:
        if self._forward_stack:
            layer, direction = self._forward_stack[-1], "fwd"
        else:
            layer, direction = self._backward_owner(args, out)
        if layer is None:
            self.unattributed.append(entry.describe())
            return
        self._add(OpEntry(layer, direction, entry.kind, entry.op, entry.operand, entry.fmt, entry.scaling,
                          entry.scale_rule, entry.detail))

    def _backward_owner(self, args: tuple, out: Any) -> tuple[str | None, str]:
        storages = {s for a in args if (s := _storage(a)) is not None}
        for layer, state in self._linears.items():
            if state.weight_storage in storages:
                return layer, "dgrad"
            if any(ref() is not None for s, ref in state.input_storages.items() if s in storages):
                return layer, "wgrad"
        layer = self._backward_layer
        if layer is None or layer not in self._linears or not isinstance(out, torch.Tensor):
            return None, ""
        # a vendor GEMM on its own buffers: wgrad produces a weight-shaped output
        return layer, "wgrad" if tuple(out.shape) == self._linears[layer].weight_shape else "dgrad"

    def _add(self, entry: OpEntry) -> None:
        self.entries.append(entry)
        if entry.direction != "fwd":
            self.backward_seen = True

    # ---- reading it ---------------------------------------------------------------------

    def ops(self, layer: str, direction: str) -> list[OpEntry]:
        return [e for e in self.entries if e.layer == layer and e.direction == direction]

    def summary(self) -> dict[str, dict[str, list[str]]]:
        """layer -> direction -> the ops recorded there, described."""
        out: dict[str, dict[str, list[str]]] = {}
        for e in self.entries:
            out.setdefault(e.layer, {}).setdefault(e.direction, []).append(e.describe())
        return out

    def to_json(self) -> dict[str, Any]:
        return {"layers": self.summary(), "unattributed": list(self.unattributed),
                "backward_seen": self.backward_seen}

    def check(self, recipe: str | Recipe, include: Iterable[str] = DEFAULT_INCLUDE,
              directions: Iterable[str] | None = None) -> None:
        """Fail closed: every linear matching ``include`` ran each direction as ``recipe`` says.

        ``directions`` defaults to fwd, plus dgrad and wgrad when a backward was traced.
        """
        recipe = get_recipe(recipe)
        include = patterns(include, "include")
        dirs = patterns(directions, "directions") if directions is not None else (
            GEMM_DIRECTIONS if self.backward_seen else ("fwd",))
        if unknown := [d for d in dirs if d not in GEMM_DIRECTIONS]:
            raise ValueError(f"directions={dirs!r}: {unknown} not among {GEMM_DIRECTIONS}")
        layers = [n for n in self._names if any(fnmatch.fnmatchcase(n, p) for p in include)]
        if not layers:
            raise PrecisionError(f"include={include!r} matches no linear of the traced model")
        problems = [p for layer in layers for d in dirs for p in self._problems(recipe, layer, d)]
        if problems:
            raise PrecisionError(f"recipe {recipe.name}: {len(problems)} precision problem(s):\n  "
                                 + "\n  ".join(problems))

    def _problems(self, recipe: Recipe, layer: str, direction: str) -> Iterator[str]:
        ops = self.ops(layer, direction)
        gemms = [e for e in ops if e.kind == "gemm"]
        operands = [op for op, d in _OPERAND_DIRECTION.items() if d == direction]
        if not gemms:
            yield f"{layer} {direction}: no GEMM recorded (did this linear run?)"
        for g in gemms:
            if g.fmt == UNTRACED:
                yield (f"{layer} {direction}: ran in {g.detail.get('backend')}, whose quantize and GEMM calls are "
                       "pybind11 functions a dispatch trace cannot see; its precision is not proven here")
        gemms = [g for g in gemms if g.fmt != UNTRACED]
        for g in gemms:
            if g.scaling == "none" and any(recipe.spec(op).scaling != "none" for op in operands):
                want = ", ".join(f"{op} {recipe.spec(op).fmt} ({recipe.spec(op).scaling})" for op in operands)
                yield f"{layer} {direction}: GEMM {g.op} ran in {g.fmt} where the recipe says {want}"
        quantized = {e.operand: e for e in ops if e.op == "mxcheck::quantize"}
        for op in operands:
            spec, got = recipe.spec(op), quantized.get(op)
            if got is None:
                continue  # a vendor path: its GEMM entry above carries the format
            want = (spec.fmt, spec.scaling, spec.scale_rule if spec.scaling == "mx" else None, spec.block_size)
            seen = (got.fmt, got.scaling, got.scale_rule, got.detail.get("block_size"))
            if want != seen:
                yield (f"{layer} {direction}: operand {op} quantized as fmt={seen[0]} scaling={seen[1]} "
                       f"scale_rule={seen[2]} block={seen[3]}; recipe {recipe.name} says fmt={want[0]} "
                       f"scaling={want[1]} scale_rule={want[2]} block={want[3]}")
        for g in gemms:
            if g.op != "mxcheck::gemm" and g.scaling != "none":
                fmts = {recipe.spec(op).fmt for op in operands}
                if g.fmt not in fmts and not (g.fmt == "fp6" and fmts <= {"e2m3", "e3m2"}):
                    yield f"{layer} {direction}: {g.op} ran {g.fmt}; recipe {recipe.name} says {sorted(fmts)}"


def _is_linear(mod: nn.Module) -> bool:
    return isinstance(getattr(mod, "weight", None), torch.Tensor) and hasattr(mod, "in_features")


@contextlib.contextmanager
def trace_precision(model: nn.Module) -> Iterator[PrecisionManifest]:
    """Record which quantize and GEMM ops every linear of ``model`` ran, per direction."""
    manifest = PrecisionManifest(model)
    try:
        with warnings.catch_warnings(), manifest:
            # The backward pre-hooks fire for the first linear even when its input needs no
            # grad (torch warns about exactly that); harmless for attribution.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            yield manifest
    finally:
        manifest.remove_hooks()


def check_precision(manifest: PrecisionManifest, recipe: Any, kwargs: dict[str, Any],
                    context: Context) -> Outcome:
    """``manifest.check(recipe, **kwargs)`` as an Outcome carrying the whole manifest (for
    the report recorder's ``numerics.precision``)."""
    fields: dict[str, Any] = {"extra": {"precision_manifest": manifest.to_json()}}
    try:
        manifest.check(recipe, **kwargs)
    except NumericsError as e:  # PrecisionError: the layers and directions that ran otherwise
        return Outcome(manifest, False, say("precision manifest", context, str(e)), {**fields, "passed": False})
    return Outcome(manifest, True, "", {**fields, "passed": True})
