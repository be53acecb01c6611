"""AITER's own torch-level functions from the installed ``amd-aiter`` wheel, loaded on a CPU.

``aiter/__init__.py`` JIT-builds HIP modules at import, so it is never executed: a stub
``aiter`` package whose ``__path__`` is the installed directory stands in for it, with stubs
for what the loaded files import (``aiter.jit.utils.chip_info.get_gfx`` and, where Triton is
absent, ``triton``/``triton.language``, whose kernels are defined but never launched here).
``sys.modules`` is restored afterwards; the returned functions keep their own globals.
Tested with amd-aiter 0.1.7.post2.dev18 (``pip install -e '.[vendors]'``).
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys
from importlib import metadata
from types import ModuleType, SimpleNamespace
from typing import Any

import torch  # noqa: F401  (imported before the stubs exist: torch walks sys.modules)

DISTRIBUTION = "amd-aiter"
MISSING = f"{DISTRIBUTION} not installed (pip install -e '.[vendors]' installs amd-aiter==0.1.7.post2.dev18)"


def _package(name: str, path: pathlib.Path | None = None, **attrs: Any) -> ModuleType:
    mod = ModuleType(name)
    mod.__path__ = [str(path)] if path is not None else []
    mod.__dict__.update(attrs)
    return mod


def _any_attribute(name: str) -> object:
    if name.startswith("__"):  # module protocol lookups (__file__, __spec__) must fail normally
        raise AttributeError(name)
    return object()


def _triton_stubs() -> dict[str, ModuleType]:
    language = ModuleType("triton.language")
    language.__getattr__ = _any_attribute  # annotations such as tl.constexpr
    return {"triton": _package("triton", jit=lambda fn=None, **kw: fn or (lambda f: f), language=language),
            "triton.language": language}


def load() -> SimpleNamespace | None:
    """shuffle_weight, e8m0_shuffle, mxfp4_to_f32, e8m0_to_f32 of the wheel, or None if absent."""
    try:
        root = pathlib.Path(str(metadata.distribution(DISTRIBUTION).locate_file("aiter")))
    except metadata.PackageNotFoundError:
        return None
    stubs = {"aiter": _package("aiter", root), "aiter.ops": _package("aiter.ops", root / "ops"),
             "aiter.utility": _package("aiter.utility", root / "utility"),
             "aiter.jit": _package("aiter.jit"), "aiter.jit.utils": _package("aiter.jit.utils"),
             "aiter.jit.utils.chip_info": _package("aiter.jit.utils.chip_info", get_gfx=lambda: "gfx950")}
    if importlib.util.find_spec("triton") is None:
        stubs.update(_triton_stubs())
    loaded = ("aiter.utility.dtypes", "aiter.utility.fp4_utils", "aiter.ops.shuffle")
    saved = {n: sys.modules.get(n) for n in (*stubs, *loaded)}
    try:
        sys.modules.update(stubs)
        shuffle = importlib.import_module("aiter.ops.shuffle")
        fp4 = importlib.import_module("aiter.utility.fp4_utils")
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    return SimpleNamespace(shuffle_weight=shuffle.shuffle_weight, e8m0_shuffle=fp4.e8m0_shuffle,
                           mxfp4_to_f32=fp4.mxfp4_to_f32, e8m0_to_f32=fp4.e8m0_to_f32,
                           version=metadata.version(DISTRIBUTION))
