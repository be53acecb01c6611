"""Backends: the things under test, found by name, entry point or ``pkg.module:factory``.

A backend is any object with the attributes of :class:`Backend`; the registry maps names
to zero-argument factories so that importing mxcheck imports no vendor package (a
factory runs only when a test asks for its backend).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any

from mxcheck.backends.contract import (
    Backend,
    FakeQuantizeBackend,
    FullBackend,
    GemmBackend,
    LinearBackend,
    MissingDependency,
    QuantizeBackend,
    Refusal,
    version_problem,
)
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.text import did_you_mean

__all__ = [
    "ENTRY_POINT_GROUP",
    "Backend",
    "BackendLoadError",
    "FakeQuantizeBackend",
    "FullBackend",
    "GemmBackend",
    "LinearBackend",
    "MissingDependency",
    "QuantizeBackend",
    "Refusal",
    "available_backends",
    "collapse_import_output",
    "get",
    "import_vendor",
    "register",
    "registered",
    "version_problem",
]

ENTRY_POINT_GROUP = "mxcheck.backends"


class BackendLoadError(ValueError):
    """A backend name or spec that does not resolve to a backend."""


_FACTORIES: dict[str, Callable[[], Backend]] = {"emulated": EmulatedBackend}


def register(name: str, factory: Callable[[], Backend]) -> None:
    """Make ``get(name)`` call ``factory()``; a later registration replaces an earlier one."""
    _FACTORIES[name] = factory


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def registered() -> list[str]:
    """Names ``get`` accepts without a module path: built-ins and installed entry points."""
    return sorted(set(_FACTORIES) | set(_entry_points()))


def _load_spec(spec: str) -> Callable[[], Backend]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise BackendLoadError(f"backend {spec!r}: expected a registered name {registered()} "
                               f"or 'pkg.module:factory'{did_you_mean(spec, registered())}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        hint = ""
        if isinstance(e, ModuleNotFoundError) and e.name and f"{module_name}.".startswith(f"{e.name}."):
            hint = (f"; put the directory that holds {e.name!r} on PYTHONPATH (PYTHONPATH=$PWD) or pip install "
                    "its package; searched sys.path: " + ", ".join(p or "." for p in sys.path[:6])
                    + (" ..." if len(sys.path) > 6 else ""))
        raise BackendLoadError(f"backend {spec!r}: cannot import {module_name!r} ({e}){hint}") from e
    factory = getattr(module, attr, None)
    if factory is None:
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise BackendLoadError(f"backend {spec!r}: module {module_name!r} ({getattr(module, '__file__', '?')}) "
                               f"has no attribute {attr!r}{did_you_mean(attr, public)}")
    return factory


def get(spec: str) -> Backend:
    """A backend instance from a registered name, an entry point name or 'pkg.module:factory'."""
    if spec in _FACTORIES:
        factory = _FACTORIES[spec]
    elif spec in (eps := _entry_points()):
        factory = eps[spec].load()
    else:
        factory = _load_spec(spec)
    if not callable(factory):
        raise BackendLoadError(f"backend {spec!r}: {factory!r} is not callable; expected a factory")
    backend = factory()
    if not isinstance(backend, Backend):
        missing = [a for a in ("name", "available", "supports") if not hasattr(backend, a)]
        raise BackendLoadError(f"backend {spec!r}: {type(backend).__name__} lacks the Backend "
                               f"protocol (name, available(), supports(recipe)): no {', '.join(missing)}")
    return backend


# Whether import_vendor collapses what a vendor package prints while it imports (CUDA/ROCm
# probes, failed optional extensions, torch deprecation notices) into one line per package.
# Off by default (a pytest run shows them); the CLI turns it on unless given -v.
_COLLAPSE_IMPORT_OUTPUT = {"on": False}
_REPORTED: set[str] = set()


def collapse_import_output(on: bool) -> bool:
    """Collapse (True) or show in full (False, the default) vendor output at import; returns
    the previous setting, so a caller can restore it."""
    previous, _COLLAPSE_IMPORT_OUTPUT["on"] = _COLLAPSE_IMPORT_OUTPUT["on"], bool(on)
    return previous


@contextlib.contextmanager
def _stderr_to(sink: Any) -> Iterator[None]:
    """Send file descriptor 2 (Python's and C's stderr, logging handlers included) to sink."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _import_quietly(module: str) -> None:
    """Import module; what it writes to stderr and warns becomes one line naming the package."""
    top = module.partition(".")[0]
    with tempfile.TemporaryFile(mode="w+b") as sink, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = io.StringIO()  # what Python writes to sys.stderr (also when it is not fd 2)
        try:
            with _stderr_to(sink), contextlib.redirect_stderr(text):
                importlib.import_module(module)
        finally:
            sink.seek(0)
            out = text.getvalue() + sink.read().decode(errors="replace")
            lines = [ln for ln in out.splitlines() if ln.strip()]
            lines += [f"{w.category.__name__}: {w.message}" for w in caught]
            if lines and top not in _REPORTED:
                _REPORTED.add(top)
                print(f"mxcheck: {top} printed {len(lines)} line(s) while importing (first: {lines[0][:160]!r}); "
                      "-v shows them", file=sys.stderr)


def import_vendor(module: str) -> str | None:
    """Import a vendor module for an ``available()``: None when it imports, else why not.

    Only an exception at import means unavailable. A warning at import leaves the package
    usable (TransformerEngine 2.x warns when JAX is installed without its TE extension), so
    it is shown as a warning and never escalated, even under pytest's
    ``filterwarnings = error`` or ``python -W error``, which would otherwise turn it into an
    exception here and report the backend "not importable". With
    ``collapse_import_output(True)`` (the CLI, unless -v) what the import prints and warns
    is one line per package.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        try:
            if _COLLAPSE_IMPORT_OUTPUT["on"] and module not in sys.modules:
                _import_quietly(module)
            else:
                importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):  # the package (or the module) itself is absent
                return MissingDependency(module.partition(".")[0],
                                         detail=f"{module} not importable ({type(e).__name__}: {e})")
            return f"{module} not importable ({type(e).__name__}: {e})"
        except Exception as e:  # a vendor package may raise anything at import on a CPU host
            return f"{module} not importable ({type(e).__name__}: {e})"
    return None


def available_backends() -> dict[str, tuple[bool, str]]:
    """name -> (usable here?, why not) for every registered backend."""
    out = {}
    for name in registered():
        try:
            out[name] = get(name).available()
        except Exception as e:  # a broken third-party backend must not hide the others
            out[name] = (False, f"failed to load: {type(e).__name__}: {e}")
    return out


# Built-in adapters by "module:class": each module is imported on first use, so importing
# mxcheck (or listing backends) imports no vendor package; their available() imports those.
_BUILTIN = {
    "triton": "mxcheck.backends.triton_mx:TritonMXBackend",
    "brevitas": "mxcheck.backends.brevitas_backend:BrevitasBackend",
    "aiter": "mxcheck.backends.aiter:AiterBackend",
    "aiter_triton": "mxcheck.backends.aiter_triton:AiterTritonBackend",
    "compressed_tensors": "mxcheck.backends.compressed_tensors_backend:CompressedTensorsBackend",
    "modelopt": "mxcheck.backends.modelopt_backend:ModelOptBackend",
    "primus_turbo": "mxcheck.backends.primus_turbo:PrimusTurboBackend",
    "quark": "mxcheck.backends.quark_backend:QuarkBackend",
    "torch": "mxcheck.backends.torch_scaled_mm:TorchScaledMMBackend",
    "torchao": "mxcheck.backends.torchao_backend:TorchaoBackend",
    "transformer_engine": "mxcheck.backends.transformer_engine:TransformerEngineBackend",
}


def _instantiate(spec: str) -> Backend:
    return _load_spec(spec)()


for _name, _spec in _BUILTIN.items():
    register(_name, functools.partial(_instantiate, _spec))
