"""Poison: memory a correct backend never reads must not change a valid result."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from mxcheck.assertions import NumericsError, check_bitwise
from mxcheck.conformance._common import (
    _bitwise,
    _device,
    _fwd_operands,
    _oracle_pair,
    fresh_state,
    gemm_out_dtype,
    linear_of,
    own_sr_fwd_reason,
    training_operands,
)
from mxcheck.conformance.inputs import FAMILY_DTYPES, GRADIENT_AMAX, magnitude_tensor
from mxcheck.diagnose import quantize as diagnose_quantize
from mxcheck.diagnose.catalogue import QUANTIZE_BEHAVIOURS
from mxcheck.gemm import quantize_operand
from mxcheck.layouts import pack_mxfp6_blob, unpack_mxfp6_blob
from mxcheck.recipes import Recipe
from mxcheck.rng import seeded_default_rng

_POISON_MNK = (40, 64, 96)  # M % 16 != 0 and N % 128 != 0 (partial tiles; N tiles 2D 32x32 weights); K % 128 != 0


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


def _small_inputs(gen: torch.Generator, shape: torch.Size, accepted: tuple[torch.dtype, ...]) -> list[tuple[str, torch.Tensor]]:
    """Inputs whose scales a kernel may compute from memory it never wrote: a gradient-
    magnitude tensor natively in each accepted dtype (its block scales are tiny or zero)
    and an all-zero one (amax 0)."""
    out = [(f", amax {GRADIENT_AMAX:.1e} {str(d).removeprefix('torch.')}",
            magnitude_tensor(gen, *shape, d, GRADIENT_AMAX)) for d in FAMILY_DTYPES if d in accepted]
    return [*out, (", all zero", torch.zeros(shape))]


def _shape(recipe: Recipe, m: int, n: int, k: int) -> tuple[int, int, int]:
    r = recipe.shape_multiple
    return tuple(-(-d // r) * r for d in (m, n, k))  # type: ignore[return-value]


def check_poison_padding(backend: Any, recipe: Recipe, gen: torch.Generator, numerics: Any = None) -> str | None:
    """Quantize writes its K padding whatever the allocator held; the GEMM reads only its
    operands (views into 0xFF-filled storage give the contiguous run's bits)."""
    if not (hasattr(backend, "quantize") or hasattr(backend, "gemm")):
        if hasattr(backend, "fake_quantize"):  # values carry no padding bytes to poison
            return ("needs codes (quantize) or a gemm that reads padded operands: the backend returns values "
                    "(fake_quantize), which have no padding")
        return "backend has neither quantize nor gemm"
    dev, (m, n, k) = _device(backend), _shape(recipe, *_POISON_MNK)
    ctx = {"recipe": recipe.name, "m": m, "n": n, "k": k}
    x, w = training_operands(recipe, gen, dev, m, n, k)
    differing: list[Any] = []
    compared = 0
    if hasattr(backend, "quantize"):
        accepted = tuple(getattr(backend, "input_dtypes", FAMILY_DTYPES))
        for name, t in (("x_row", x), ("w_row", w)):
            spec = recipe.spec(name)
            inputs = [("", t), *((label, u.to(dev)) for label, u in _small_inputs(gen, t.shape, accepted))]
            ours = [quantize_operand(u, spec, **fresh_state(recipe, name)) for _, u in inputs]
            with _poisoned_empty(dev, 0xFF):  # a Refusal propagates: the test counts it as refused
                theirs = [backend.quantize(u, spec, **fresh_state(recipe, name)) for _, u in inputs]
            for (label, u), o, q in zip(inputs, ours, theirs, strict=True):
                where, compared = f"poisoned allocator{label}", compared + 1
                # attributed as the quantize check does: counts, blocks, causes (mxcheck.diagnose)
                d = diagnose_quantize.compare_quantized(u, spec, o, q, operand=name, label=where)
                if d.n_differing:
                    differing.append(diagnose_quantize.attribute(d, QUANTIZE_BEHAVIOURS))
                for field in ("codes", "scales", "block_scales", "scale_inv"):
                    if hasattr(o, field) and numerics is not None:  # the padded region included
                        context = {"layer": f"{name}.{field} ({where})", "direction": "quantize", **ctx}
                        numerics.context(**context).record(
                            "bitwise", check_bitwise(getattr(q, field), getattr(o, field), None, context))
    if differing:  # the attributed quantize failure first: the GEMM below reads the oracle's operands
        raise NumericsError(diagnose_quantize.report(
            differing, compared, f"quantize (poisoned allocator) of recipe {recipe.name}, backend "
                          f"{getattr(backend, 'name', backend)}"))
    if hasattr(backend, "gemm"):
        a, b = _fwd_operands(recipe, x, w)
        clean = backend.gemm(a, b, out_dtype=gemm_out_dtype(backend))
        pa, pb = _in_poisoned_storage(a), _in_poisoned_storage(b)
        with _poisoned_empty(dev, 0xFF):
            got = backend.gemm(pa, pb, out_dtype=gemm_out_dtype(backend))
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
        runs["gemm"] = lambda: backend.gemm(a, b, out_dtype=gemm_out_dtype(backend))
    linear = linear_of(backend)
    own_sr = own_sr_fwd_reason(backend, recipe)  # two calls' own SR bits differ: no bitwise compare
    if linear is not None and not own_sr:
        x, w = training_operands(recipe, gen, dev, m, n, k)
        bias = torch.randn(n, generator=gen).bfloat16().float().to(dev)

        def run_linear() -> torch.Tensor:
            with seeded_default_rng(0, dev), torch.no_grad():
                return linear(x, w, bias, recipe)
        runs["linear"] = run_linear
    if not runs:
        return own_sr or "backend has neither gemm nor linear"
    for what, fn in runs.items():
        outs = []
        for byte in (0xFF, 0x00):
            with _poisoned_empty(dev, byte):
                outs.append(fn())
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
    clean = backend.gemm(a, b, out_dtype=torch.bfloat16)
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
