"""Conformance checks a backend must pass, as plain functions that raise NumericsError.

``tests/conformance/`` runs each check on every selected backend; the known-bad backends
(``mxcheck.backends.known_bad``) are run through the same checks to prove each check can
fail. A check takes the backend, a recipe and a torch.Generator, and skips (returns a
reason) when the backend does not offer what it checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from mxcheck import thresholds
from mxcheck.assertions import NumericsError, assert_bitwise_equal, assert_snr
from mxcheck.functions import quant_linear
from mxcheck.gemm import dequantize_operand, emulated_gemm, quantize_operand
from mxcheck.layouts import pack_mxfp6_blob, unpack_mxfp6_blob
from mxcheck.recipes import OPERANDS, Recipe

__all__ = ["CHECKS", "EDGE_SHAPES", "LINEAR_SNR_FLOORS", "SR_DRAWS", "SR_SIGMAS", "edge_shape_outcome",
           "linear_of", "run_checks"]

# Floors for fwd / dgrad / wgrad SNR of a whole linear against float64 truth (M=N=256, K=512,
# randn inputs, weights scaled 1/sqrt(K)); DESIGN.md anchors, well under the measured values.
LINEAR_SNR_FLOORS = {name: f.db for name, f in thresholds.LINEAR_SNR_FLOORS.items()}
# Same quantized operands as the reference Function: only accumulation order and output
# rounding differ (measured 63 dB for torch._scaled_mm FP8 at every Flux 12B shape).
SAME_OPERANDS_FLOOR_DB = 40.0
_M, _N, _K = 256, 256, 512


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


def _inputs(gen: torch.Generator, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(_M, _K, generator=gen).to(device)
    w = (torch.randn(_N, _K, generator=gen) / _K**0.5).to(device)
    b = torch.randn(_N, generator=gen).to(device)
    return x, w, b


def _fwd_operands(recipe: Recipe, x: torch.Tensor, w: torch.Tensor) -> tuple[Any, Any]:
    return quantize_operand(x, recipe.x_row), quantize_operand(w, recipe.w_row)


def check_quantize(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """The backend's quantization of x_row and w_row is bit-identical to the oracle's."""
    if not hasattr(backend, "quantize"):
        return "backend has no quantize"
    x, w, _ = _inputs(gen, _device(backend))
    for name, t in (("x_row", x), ("w_row", w)):
        spec = recipe.spec(name)
        ours, theirs = quantize_operand(t, spec), backend.quantize(t, spec)
        for field in ("codes", "scales", "block_scales", "scale_inv"):
            if hasattr(ours, field):
                _bitwise(numerics, getattr(theirs, field), getattr(ours, field), recipe=recipe.name,
                         layer=f"{name}.{field}", direction="quantize")
    return None


def check_gemm(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """GEMM within the fp32-accumulation bound of the oracle's exact (float64) GEMM."""
    if not hasattr(backend, "gemm"):
        return "backend has no gemm"
    x, w, _ = _inputs(gen, _device(backend))
    a, b = _fwd_operands(recipe, x, w)
    got = backend.gemm(a, b, out_dtype=torch.float32)
    _assert_in_bound(got, a, b, f"gemm of recipe {recipe.name} at M={_M} N={_N} K={_K}")
    return None


def linear_of(backend: Any) -> Callable[..., torch.Tensor] | None:
    """``linear(x, w, b, recipe)`` of a backend: its own, or for a GEMM-only backend (Triton,
    ``torch._scaled_mm``) the reference Function running its GEMMs on the oracle's operands."""
    if hasattr(backend, "linear"):
        return backend.linear
    if hasattr(backend, "gemm"):
        return lambda x, w, b, recipe: quant_linear(x, w, b, recipe, gemm=backend.gemm)
    return None


def _linear(backend: Any, x, w, b, recipe: Recipe, seed: int = 0):
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    b = b.detach().clone().requires_grad_(True)
    torch.manual_seed(seed)  # SR recipes draw their bits from the default generator
    y = linear_of(backend)(x, w, b, recipe)
    return x, w, b, y


def check_linear(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """fwd, dgrad, wgrad and bias grad above the recipe's SNR floor against float64 truth, and
    close to the reference Function given the same quantized operands."""
    if linear_of(backend) is None:
        return "backend has neither linear nor gemm"
    floor = LINEAR_SNR_FLOORS.get(recipe.name)
    if floor is None:
        return f"no SNR floor for recipe {recipe.name}"
    x0, w0, b0 = _inputs(gen, _device(backend))
    dy = torch.randn(_M, _N, generator=gen).to(x0.device)
    x, w, b, y = _linear(backend, x0, w0, b0, recipe)
    y.backward(dy.to(y.dtype))
    xd, wd = x0.double(), w0.double()
    truth = {"fwd": xd @ wd.T + b0.double(), "dgrad": dy.double() @ wd, "wgrad": dy.double().T @ xd,
             "bgrad": dy.double().sum(0)}
    got = {"fwd": y, "dgrad": x.grad, "wgrad": w.grad, "bgrad": b.grad}
    for direction, ref in truth.items():
        if got[direction] is None or not got[direction].abs().sum():
            raise NumericsError(f"{direction} of recipe {recipe.name} is missing or all zero")
        _snr(numerics, got[direction].double(), ref, thresholds.BGRAD_FLOOR_DB if direction == "bgrad" else floor,
             recipe=recipe.name, layer="vs float64 truth", direction=direction, m=_M, n=_N, k=_K)
    rx, rw, _, ry = _linear(_Reference(), x0, w0, b0, recipe)
    ry.backward(dy.to(ry.dtype))
    for direction, ref in (("fwd", ry), ("dgrad", rx.grad), ("wgrad", rw.grad)):
        # Same quantized operands: only accumulation order and the output rounding may differ.
        _snr(numerics, got[direction].double(), ref.double(), SAME_OPERANDS_FLOOR_DB, recipe=recipe.name,
             layer="vs reference Function", direction=direction, m=_M, n=_N, k=_K)
    return None


def check_weight_change(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """A second call with a changed weight changes the output (no stale cached quantization)."""
    linear = linear_of(backend)
    if linear is None:
        return "backend has neither linear nor gemm"
    x, w, b = _inputs(gen, _device(backend))
    with torch.no_grad():
        y1 = linear(x, w, b, recipe)
        y2 = linear(x, w * 2, b, recipe)
    if torch.equal(y1, y2):
        raise NumericsError(f"recipe {recipe.name}: doubling the weight left the output unchanged "
                            "(a stale cached quantized weight?)")
    return None


def check_repeatable(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """Repeat calls are bit-identical (recipes without SR; SR recipes with the same seed)."""
    if linear_of(backend) is None:
        return "backend has neither linear nor gemm"
    x, w, b = _inputs(gen, _device(backend))
    outs = [_linear(backend, x, w, b, recipe, seed=7)[3].detach() for _ in range(2)]
    _bitwise(numerics, outs[1], outs[0], recipe=recipe.name, layer="repeat call", direction="fwd")
    return None


def check_nan_propagates(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """NaN in gives NaN out (in that row), never a silent finite value."""
    linear = linear_of(backend)
    if linear is None:
        return "backend has neither linear nor gemm"
    x, w, b = _inputs(gen, _device(backend))
    x[3, 5] = float("nan")
    with torch.no_grad():
        y = linear(x, w, b, recipe)
    if not torch.isnan(y[3]).any():
        raise NumericsError(f"recipe {recipe.name}: a NaN in row 3 of x gave a finite row 3 of y")
    return None


def check_shapes(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """3D input [B, S, K] gives [B, S, N] in the recipe's output dtype, equal to the 2D call."""
    linear = linear_of(backend)
    if linear is None:
        return "backend has neither linear nor gemm"
    x, w, b = _inputs(gen, _device(backend))
    with torch.no_grad():
        y3 = linear(x.view(2, _M // 2, _K), w, b, recipe)
        y2 = linear(x, w, b, recipe)
    if y3.shape != (2, _M // 2, _N) or y3.dtype != recipe.out_dtype:
        raise NumericsError(f"recipe {recipe.name}: 3D input gave shape {tuple(y3.shape)} {y3.dtype}, "
                            f"expected {(2, _M // 2, _N)} {recipe.out_dtype}")
    _bitwise(numerics, y3.reshape(_M, _N), y2, recipe=recipe.name, layer="3D vs 2D", direction="fwd")
    return None


# ---------------------------------------------------------------------------------------
# Poison: memory a correct backend never reads must not change a valid result.
#
# What is poisoned, and why (the honest scope):
# * The K padding of an MX operand (``pad_to``) is *data* by contract: the quantizer writes
#   zero codes and ``zero_scale`` bytes there, and real GEMMs multiply it (Primus-Turbo and
#   AITER run the padded K). So poison_padding does not overwrite it in the operand;
#   it checks that a backend's quantize *writes* it (bit-identical to the oracle, padding
#   included) even when the allocator hands it 0xFF-filled memory, as TE PR#3070 (padded
#   scale bytes left unwritten) and AITER's ``torch.empty`` scale padding would not.
# * Storage beyond an operand (row pitch, trailing rows) is not data: poison_padding hands
#   the GEMM views into 0xFF / NaN-filled buffers and wants the contiguous run's bits.
# * No backend's gemm or linear takes ``out=``, so a pre-filled output is N/A; poison_output
#   instead runs twice, once with every uninitialised allocation holding 0xFF (NaN in every
#   float dtype, NaN E8M0) and once holding 0x00, and wants identical bits. Two routes:
#   torch.empty / empty_like / empty_strided / new_empty called from Python (adapters,
#   Triton launchers, AITER's Python wrappers) return memory filled with the byte
#   (deterministic, any device); and the allocator is pre-filled (allocate, fill, free), which
#   on CUDA reaches at::empty inside C++ extensions through the caching allocator. On CPU
#   malloc reuses freed blocks only sometimes, so C++-side CPU allocations are best effort.
# * MXFP6 guard tiles (two K tiles per row tile that AITER leaves unwritten) and blob
#   padding: poison_guard_tiles fills them with 0xFF. A backend with a blob entry point
#   (``gemm_mxfp6_blob(a_blob, b_blob, a_sblob, b_sblob, m, n, k)``) gets the poisoned
#   blobs; otherwise they are read back through ``mxcheck.layouts.unpack_mxfp6_blob``
#   (how the aiter adapter reads AITER's packer output) and the backend's gemm runs on that.
# ---------------------------------------------------------------------------------------

_POISON_MNK = (40, 64, 96)  # M % 16 != 0 and N % 128 != 0 (partial tiles; N tiles 2D 32x32 weights); K % 128 != 0
_ALLOWED_ERRORS = (ValueError, TypeError, NotImplementedError)


def _poison_allocator(device: Any, byte: int) -> None:
    """Fill memory the allocator will hand out next with ``byte`` (best effort on CPU)."""
    dev = torch.device(device)
    bufs = [torch.full((n,), byte, dtype=torch.uint8, device=dev)
            for n in (1 << 12, 1 << 16, 1 << 20, 1 << 24) for _ in range(4)]
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    del bufs


_EMPTY_FACTORIES = ("empty", "empty_like", "empty_strided")


@contextlib.contextmanager
def _poisoned_empty(device: Any, byte: int) -> Iterator[None]:
    """Inside: torch.empty & co. (from Python) return memory holding ``byte``; the allocator
    is pre-filled with it too. Restored on exit."""
    def filled(make: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def make_filled(*args: Any, **kwargs: Any) -> torch.Tensor:
            t = make(*args, **kwargs)
            if t.numel():
                t.untyped_storage().fill_(byte)
            return t
        return make_filled

    saved = {name: getattr(torch, name) for name in _EMPTY_FACTORIES}
    saved_new_empty = torch.Tensor.new_empty
    _poison_allocator(device, byte)
    try:
        for name, make in saved.items():
            setattr(torch, name, filled(make))
        torch.Tensor.new_empty = filled(saved_new_empty)  # type: ignore[method-assign]
        yield
    finally:
        for name, make in saved.items():
            setattr(torch, name, make)
        torch.Tensor.new_empty = saved_new_empty  # type: ignore[method-assign]


def _poisoned_view(t: torch.Tensor) -> torch.Tensor:
    """t's values in a view into a larger buffer whose other bytes are 0xFF (NaN for floats):
    a row pitch wider than the row and trailing rows past the end."""
    if t.ndim == 0:
        return t
    big = torch.empty((t.shape[0] + 8, *t.shape[1:-1], t.shape[-1] + 16), dtype=t.dtype, device=t.device)
    big.view(torch.uint8).fill_(0xFF)
    view = big[: t.shape[0], ..., : t.shape[-1]]
    view.copy_(t)
    return view


def _in_poisoned_storage(q: Any) -> Any:
    tensors = {f.name: getattr(q, f.name) for f in dataclasses.fields(q)
               if isinstance(getattr(q, f.name), torch.Tensor)}
    return dataclasses.replace(q, **{k: _poisoned_view(v) for k, v in tensors.items()})


def _shape(recipe: Recipe, m: int, n: int, k: int) -> tuple[int, int, int]:
    r = recipe.shape_multiple
    return tuple(-(-d // r) * r for d in (m, n, k))  # type: ignore[return-value]


def _oracle_pair(recipe: Recipe, gen: torch.Generator, device: str, m: int, n: int, k: int):
    x = torch.randn(m, k, generator=gen).to(device)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(device)
    return _fwd_operands(recipe, x, w)


def check_poison_padding(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """Quantize writes its K padding whatever the allocator held; the GEMM reads only its
    operands (views into 0xFF-filled storage give the contiguous run's bits)."""
    if not (hasattr(backend, "quantize") or hasattr(backend, "gemm")):
        return "backend has neither quantize nor gemm"
    dev, (m, n, k) = _device(backend), _shape(recipe, *_POISON_MNK)
    ctx = {"recipe": recipe.name, "m": m, "n": n, "k": k}
    x = torch.randn(m, k, generator=gen).to(dev)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dev)
    if hasattr(backend, "quantize"):
        for name, t in (("x_row", x), ("w_row", w)):
            spec = recipe.spec(name)
            ours = quantize_operand(t, spec)
            try:
                with _poisoned_empty(dev, 0xFF):
                    theirs = backend.quantize(t, spec)
            except _ALLOWED_ERRORS as e:
                return f"backend quantize refuses {name} {tuple(t.shape)}: {e}"
            for field in ("codes", "scales", "block_scales", "scale_inv"):
                if hasattr(ours, field):  # the padded region included
                    _bitwise(numerics, getattr(theirs, field), getattr(ours, field),
                             layer=f"{name}.{field} (poisoned allocator)", direction="quantize", **ctx)
    if hasattr(backend, "gemm"):
        a, b = _fwd_operands(recipe, x, w)
        try:
            clean = backend.gemm(a, b, out_dtype=torch.float32)
        except _ALLOWED_ERRORS as e:
            return f"backend gemm refuses M={m} N={n} K={k}: {e}"
        pa, pb = _in_poisoned_storage(a), _in_poisoned_storage(b)
        with _poisoned_empty(dev, 0xFF):
            got = backend.gemm(pa, pb, out_dtype=torch.float32)
        _bitwise(numerics, got, clean, layer="operands in 0xFF storage", direction="fwd", **ctx)
    return None


def check_poison_output(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """No result depends on uninitialised memory: gemm and linear give the same bits after
    the allocator is filled with 0xFF (NaN) as after it is filled with 0x00."""
    dev, (m, n, k) = _device(backend), _shape(recipe, *_POISON_MNK)
    ctx = {"recipe": recipe.name, "m": m, "n": n, "k": k}
    runs: dict[str, Callable[[], torch.Tensor]] = {}
    if hasattr(backend, "gemm"):
        a, b = _oracle_pair(recipe, gen, dev, m, n, k)
        runs["gemm"] = lambda: backend.gemm(a, b, out_dtype=torch.float32)
    linear = linear_of(backend)
    if linear is not None:
        x = torch.randn(m, k, generator=gen).to(dev)
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dev)
        bias = torch.randn(n, generator=gen).to(dev)

        def run_linear() -> torch.Tensor:
            torch.manual_seed(0)
            with torch.no_grad():
                return linear(x, w, bias, recipe)
        runs["linear"] = run_linear
    if not runs:
        return "backend has neither gemm nor linear"
    for what, fn in runs.items():
        outs = []
        for byte in (0xFF, 0x00):
            try:
                with _poisoned_empty(dev, byte):
                    outs.append(fn())
            except _ALLOWED_ERRORS as e:
                return f"{what} refuses M={m} N={n} K={k}: {e}"
        _bitwise(numerics, outs[0], outs[1], layer=f"{what}: uninitialised memory 0xFF vs 0x00", direction="fwd", **ctx)
        if torch.isnan(outs[0]).any():
            raise NumericsError(f"{what} of recipe {recipe.name} gave NaN for finite inputs (M={m} N={n} K={k})")
    return None


def _guard_poisoned(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The MXFP6 blobs of (codes, scales) with every byte outside the data (guard tiles, row
    and K padding) set to 0xFF; the data bytes are found by packing an all-ones marker."""
    blob, sblob = pack_mxfp6_blob(codes, scales)
    mblob, msblob = pack_mxfp6_blob(torch.full_like(codes, 0x3F), torch.ones_like(scales))
    blob = torch.where(mblob != 0, blob, torch.full_like(blob, 0xFF))
    sblob = torch.where(msblob == 1, sblob, torch.full_like(sblob, 0xFF))
    return blob, sblob


def check_poison_guard_tiles(backend: Any, recipe: Recipe, gen: torch.Generator,
                             numerics: Any = None) -> str | None:
    """MXFP6 blobs with 0xFF guard tiles and padding give the clean operands' GEMM bits."""
    if recipe.x_row.scaling != "mx" or recipe.x_row.fmt != "e2m3":
        return f"recipe {recipe.name} has no MXFP6 (e2m3) blob operands"
    if not hasattr(backend, "gemm"):
        return "backend has no gemm"
    dev, (m, n, k) = _device(backend), (40, 48, 96)  # rows pad to 256, K to 128, + 2 guard tiles
    ctx = {"recipe": recipe.name, "m": m, "n": n, "k": k}
    a, b = _oracle_pair(recipe, gen, dev, m, n, k)
    try:
        clean = backend.gemm(a, b, out_dtype=torch.bfloat16)
    except _ALLOWED_ERRORS as e:
        return f"backend gemm refuses M={m} N={n} K={k}: {e}"
    (ab, asb), (bb, bsb) = (_guard_poisoned(q.codes, q.scales) for q in (a, b))
    if hasattr(backend, "gemm_mxfp6_blob"):
        got = backend.gemm_mxfp6_blob(ab, bb, asb, bsb, m, n, k)
    else:
        read = []
        for q, blob, sblob, rows, name in ((a, ab, asb, m, "a"), (b, bb, bsb, n, "b")):
            codes, scales = unpack_mxfp6_blob(blob, sblob, rows, k)
            _bitwise(numerics, codes, q.codes, layer=f"{name}: blob codes read past poison", **ctx)
            _bitwise(numerics, scales, q.scales, layer=f"{name}: blob scales read past poison", **ctx)
            read.append(dataclasses.replace(q, codes=codes, scales=scales))
        got = backend.gemm(*read, out_dtype=torch.bfloat16)
    _bitwise(numerics, got, clean, layer="guard tiles 0xFF", direction="fwd", **ctx)
    return None


# ---------------------------------------------------------------------------------------
# Edge shapes: correct, or a clear error naming the dim; never silent garbage.
# ---------------------------------------------------------------------------------------

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


def _raised(e: Exception, what: str, dims: dict[str, int]) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    if not isinstance(e, _ALLOWED_ERRORS):
        raise NumericsError(f"{what} at {dims} raised {type(e).__name__}, not ValueError/TypeError/"
                            f"NotImplementedError: validate the shape and name the dim ({msg[:200]})") from e
    if not _names_a_dim(msg, dims):
        raise NumericsError(f"{what} at {dims} raised {type(e).__name__} without naming M, N or K: {msg[:200]}")
    return f"raised: {type(e).__name__}: {msg[:160]}"


def _assert_in_bound(got: torch.Tensor, a: Any, b: Any, what: str) -> None:
    """got within the fp32-accumulation bound of the exact (float64) GEMM of a and b."""
    exact = emulated_gemm(a, b, out_dtype=torch.float64, accumulate=torch.float64)
    if tuple(got.shape) != tuple(exact.shape):
        raise NumericsError(f"{what}: result shape {tuple(got.shape)}, expected {tuple(exact.shape)}")
    da, db = dequantize_operand(a).double().abs(), dequantize_operand(b).double().abs()
    bound = da.shape[1] * 2.0**-24 * (da @ db.T)  # fp32 accumulation of K products, any order
    bad = ~((got.double() - exact).abs() <= bound)  # NaN counts as outside
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise NumericsError(f"{what}: outside the fp32-accumulation bound of the exact GEMM; {int(bad.sum())} of "
                            f"{bad.numel()} outputs; first {i}: got {got[i].item()!r}, exact {exact[i].item()!r}, "
                            f"bound {bound[i].item():.3g}")


def _edge_gemm(backend: Any, recipe: Recipe, gen: torch.Generator, m: int, n: int, k: int) -> str:
    dims = {"M": m, "N": n, "K": k}
    try:
        a, b = _oracle_pair(recipe, gen, _device(backend), m, n, k)
    except ValueError as e:
        return f"n/a: the oracle cannot quantize this shape ({str(e).splitlines()[0][:120]})"
    try:
        got = backend.gemm(a, b, out_dtype=torch.float32)
    except Exception as e:  # the error type is the finding
        return _raised(e, f"gemm of recipe {recipe.name}", dims)
    _assert_in_bound(got, a, b, f"gemm of recipe {recipe.name} at M={m} N={n} K={k}")
    return "correct"


def _edge_linear(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any,
                 m: int, n: int, k: int, name: str) -> str:
    dims = {"M": m, "N": n, "K": k}
    x0 = torch.randn(m, k, generator=gen).to(_device(backend))
    w0 = (torch.randn(n, k, generator=gen) / k**0.5).to(x0.device)
    b0 = torch.randn(n, generator=gen).to(x0.device)
    dy = torch.randn(m, n, generator=gen).to(x0.device)
    try:
        x, w, _, y = _linear(backend, x0, w0, b0, recipe)
        y.backward(dy.to(y.dtype))
    except Exception as e:  # the error type is the finding
        return _raised(e, f"linear of recipe {recipe.name}", dims)
    got = {"fwd": y, "dgrad": x.grad, "wgrad": w.grad}
    try:
        rx, rw, _, ry = _linear(_Reference(), x0, w0, b0, recipe)
        ry.backward(dy.to(ry.dtype))
        ref, floor, layer = {"fwd": ry, "dgrad": rx.grad, "wgrad": rw.grad}, SAME_OPERANDS_FLOOR_DB, "vs reference Function"
    except ValueError:  # the oracle refuses the shape; the backend computed: hold it to float64 truth
        xd, wd = x0.double(), w0.double()
        ref = {"fwd": xd @ wd.T + b0.double(), "dgrad": dy.double() @ wd, "wgrad": dy.double().T @ xd}
        floor, layer = LINEAR_SNR_FLOORS.get(recipe.name, 10.0), "vs float64 truth"
    for direction, r in ref.items():
        if got[direction] is None:
            raise NumericsError(f"linear of recipe {recipe.name} at M={m} N={n} K={k} gave no {direction}")
        _snr(numerics, got[direction].double(), r.double(), floor, recipe=recipe.name,
             layer=f"edge {name}: {layer}", direction=direction, m=m, n=n, k=k)
    return "correct"


def edge_shape_outcome(backend: Any, recipe: Recipe, name: str, gen: torch.Generator,
                       numerics: Any = None) -> dict[str, str]:
    """{"gemm": outcome, "linear": outcome} at EDGE_SHAPES[name]; an outcome is "correct",
    "raised: <error>" or "n/a: ..."; garbage raises NumericsError."""
    if name not in EDGE_SHAPES:
        raise ValueError(f"edge shape {name!r} is not known; expected one of {sorted(EDGE_SHAPES)}")
    m, n, k, _ = EDGE_SHAPES[name]
    out = {}
    if hasattr(backend, "gemm"):
        out["gemm"] = _edge_gemm(backend, recipe, gen, m, n, k)
    if linear_of(backend) is not None:
        out["linear"] = _edge_linear(backend, recipe, gen, numerics, m, n, k, name)
    return out


def check_edge_shapes(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """Every EDGE_SHAPES entry computes correctly or raises a clear error naming the dim."""
    if not hasattr(backend, "gemm") and linear_of(backend) is None:
        return "backend has neither gemm nor linear"
    for name in EDGE_SHAPES:
        edge_shape_outcome(backend, recipe, name, gen, numerics)
    return None


# ---------------------------------------------------------------------------------------
# Stochastic rounding, statistically. Tested through dX of a linear with W = I: then
# dX = Q_sr(dY) (w_col quantizes I exactly in every format), so what the backend's own
# linear does to the gradient is visible element by element.
# ---------------------------------------------------------------------------------------

SR_DRAWS = 256  # copies of dY stacked along M in one call: independent draws per element
SR_SIGMAS = 5.0  # per element: |mean - exact| <= 5 standard errors + the 8-bit resolution
_SR_M, _SR_N = 16, 64  # dY [M, N]; W = I_N, so K = N


# A GEMM-only backend runs inside the reference Function, whose quantizer (the oracle) rounds:
# testing it would test the oracle's SR under the backend's name.
_NO_OWN_SR = "backend has no linear of its own: its SR would be the oracle's (reference Function)"


def _sr_reason(recipe: Recipe) -> str | None:
    if recipe.g_row.rounding != "sr":
        ops = [op for op in OPERANDS if recipe.spec(op).rounding == "sr"]
        return (f"recipe {recipe.name} has no stochastic rounding" if not ops else
                f"recipe {recipe.name} rounds {ops} with sr, not g_row (the dgrad operand tested here)")
    if recipe.g_row.hadamard is not None:
        return f"recipe {recipe.name} rotates g_row ({recipe.g_row.hadamard}); dX = Q(dY) needs it unrotated"
    return None


def _sr_dgrad(linear: Callable[..., torch.Tensor], recipe: Recipe, dy: torch.Tensor, seed: int) -> torch.Tensor:
    n = dy.shape[1]
    x = torch.zeros(dy.shape[0], n, device=dy.device, requires_grad=True)
    w = torch.eye(n, device=dy.device)
    torch.manual_seed(seed)  # SR bits come from the default generator (as quant_linear)
    y = linear(x, w, None, recipe)
    y.backward(dy.to(y.dtype))
    return x.grad.detach()


def _sr_input(gen: torch.Generator, device: str) -> torch.Tensor:
    # bf16 values (what a bf16 dY holds), each block with a different amax
    dy = torch.randn(_SR_M, _SR_N, generator=gen) * torch.logspace(-2, 2, _SR_M).unsqueeze(1)
    return dy.bfloat16().float().to(device)


def check_sr_unbiased(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """Mean of SR_DRAWS stochastic roundings within SR_SIGMAS standard errors (variance
    (x - lo)(hi - x) per element, lo and hi the grid points around x) plus the 8-bit
    resolution (hi - lo)/256 of the exact value; and never all zero for a non-zero input."""
    if (why := _sr_reason(recipe)) or (linear := getattr(backend, "linear", None)) is None:
        return why or _NO_OWN_SR
    dy = _sr_input(gen, _device(backend))
    m, n = dy.shape
    eye = quantize_operand(torch.eye(n, device=dy.device), recipe.w_col)
    if not torch.equal(dequantize_operand(eye, padded=False), torch.eye(n, device=dy.device)):
        return f"recipe {recipe.name}: w_col does not quantize I exactly, so dX != Q(dY)"
    # The two neighbours of each element from the oracle (same scales): u = 0 never rounds
    # away, u = 255/256 rounds away unless x is on the grid.
    lo, hi = (quantize_operand(dy, recipe.g_row, rand=torch.full(dy.shape, u, dtype=torch.uint8,
                                                                 device=dy.device)).dequantize().double()
              for u in (0, 255))
    # dX passes through the GEMM's output dtype: round the neighbours as it does.
    lo, hi = (v.to(recipe.out_dtype).double() for v in (lo, hi))
    x = dy.double()
    frac = torch.where(hi != lo, (x - lo) / (hi - lo), torch.zeros_like(x)).clamp(0, 1)
    exact = lo + frac * (hi - lo)
    # With 8 random bits the up-probability is floor(256 frac)/256, so an element strictly
    # between grid points has variance at least (hi-lo)^2 (1/256)(255/256).
    var = torch.maximum((exact - lo) * (hi - exact), (hi - lo) ** 2 * (255 / 256**2))
    draws = _sr_dgrad(linear, recipe, dy.repeat(SR_DRAWS, 1), seed=11).double().view(SR_DRAWS, m, n)
    if not draws.abs().sum():
        raise NumericsError(f"recipe {recipe.name}: SR gave an all-zero gradient for a non-zero dY "
                            "(as TE PR#3281 on sm_120)")
    mean = draws.mean(0)
    bound = SR_SIGMAS * (var / SR_DRAWS).sqrt() + (hi - lo).abs() / 256
    bad = ~((mean - exact).abs() <= bound)
    ctx = {"recipe": recipe.name, "layer": f"SR mean of {SR_DRAWS} draws vs exact", "direction": "dgrad",
           "m": m, "n": n, "k": n}
    if not float(var.sum()):
        raise NumericsError(f"recipe {recipe.name}: the oracle's g_row SR gives the same value with u=0 and "
                            "u=255/256 at every element: its random bits are ignored")
    # Recorded floor: the SNR of a mean that is off by SR_SIGMAS standard errors everywhere.
    floor = 10 * math.log10(float((exact**2).sum()) / (SR_SIGMAS**2 * float(var.sum()) / SR_DRAWS))
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise NumericsError(f"recipe {recipe.name}: SR is biased at {int(bad.sum())} of {bad.numel()} elements "
                            f"({SR_DRAWS} draws, bound {SR_SIGMAS} standard errors + (hi-lo)/256); first {i}: "
                            f"x={x[i].item()!r} between {lo[i].item()!r} and {hi[i].item()!r}, mean "
                            f"{mean[i].item()!r}, bound {bound[i].item():.3g}")
    _snr(numerics, mean, exact, floor, **ctx)
    return None


def check_sr_seeded(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """Same seed -> bit-identical SR gradient; another seed -> a different one; never all zero."""
    if (why := _sr_reason(recipe)) or (linear := getattr(backend, "linear", None)) is None:
        return why or _NO_OWN_SR
    dy = _sr_input(gen, _device(backend))
    first, again, other = (_sr_dgrad(linear, recipe, dy, seed) for seed in (7, 7, 8))
    ctx = {"recipe": recipe.name, "direction": "dgrad", "m": dy.shape[0], "n": dy.shape[1], "k": dy.shape[1]}
    _bitwise(numerics, again, first, layer="SR same seed", **ctx)
    if torch.equal(first, other):
        raise NumericsError(f"recipe {recipe.name}: seeds 7 and 8 gave bit-identical SR gradients "
                            "(a fixed or ignored seed defeats SR, as Primus-Turbo PR#365)")
    if not first.abs().sum():
        raise NumericsError(f"recipe {recipe.name}: SR gave an all-zero gradient for a non-zero dY")
    return None


class _Reference:
    """The reference Function as a backend, for the 'same quantized operands' comparison."""

    name = "reference"

    def linear(self, x, w, b, recipe):
        return quant_linear(x, w, b, recipe)


CHECKS: dict[str, Callable[..., str | None]] = {
    "quantize": check_quantize,
    "gemm": check_gemm,
    "linear": check_linear,
    "weight_change": check_weight_change,
    "repeatable": check_repeatable,
    "nan": check_nan_propagates,
    "shapes": check_shapes,
    "poison_padding": check_poison_padding,
    "poison_output": check_poison_output,
    "poison_guard_tiles": check_poison_guard_tiles,
    "edge_shapes": check_edge_shapes,
    "sr_unbiased": check_sr_unbiased,
    "sr_seeded": check_sr_seeded,
}


def run_checks(backend: Any, recipe: Recipe, seed: int = 0) -> dict[str, str]:
    """name -> "ok", "skipped: ..." or "FAILED: ..." for every check (for the known-bad tests)."""
    out = {}
    for name, check in CHECKS.items():
        gen = torch.Generator().manual_seed(seed)
        try:
            skipped = check(backend, recipe, gen)
        except NumericsError as e:
            out[name] = f"FAILED: {str(e).splitlines()[0]}"
        else:
            out[name] = f"skipped: {skipped}" if skipped else "ok"
    return out
