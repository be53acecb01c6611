"""Backends: the things under test, found by name, entry point or ``pkg.module:factory``.

A backend is any object with the attributes of :class:`Backend`; the registry maps names
to zero-argument factories so that importing mxcheck imports no vendor package (a
factory runs only when a test asks for its backend).
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable
from importlib import metadata

from mxcheck.backends.contract import Backend, MissingDependency, Refusal, version_problem
from mxcheck.backends.emulated import EmulatedBackend

__all__ = [
    "ENTRY_POINT_GROUP",
    "Backend",
    "BackendLoadError",
    "MissingDependency",
    "Refusal",
    "available_backends",
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
                               "or 'pkg.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        hint = ""
        if isinstance(e, ModuleNotFoundError) and e.name and f"{module_name}.".startswith(f"{e.name}."):
            hint = (f"; put the directory that holds {e.name!r} on PYTHONPATH "
                    "(PYTHONPATH=$PWD) or pip install its package")
        raise BackendLoadError(f"backend {spec!r}: cannot import {module_name!r} ({e}){hint}") from e
    factory = getattr(module, attr, None)
    if factory is None:
        raise BackendLoadError(f"backend {spec!r}: module {module_name!r} has no attribute {attr!r}")
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
        raise BackendLoadError(f"backend {spec!r}: {type(backend).__name__} lacks the Backend "
                               "protocol (name, available(), supports(recipe))")
    return backend


def import_vendor(module: str) -> str | None:
    """Import a vendor module for an ``available()``: None when it imports, else why not.

    Only an exception at import means unavailable. A warning at import leaves the package
    usable (TransformerEngine 2.x warns when JAX is installed without its TE extension), so
    it is shown as a warning and never escalated, even under pytest's
    ``filterwarnings = error`` or ``python -W error``, which would otherwise turn it into an
    exception here and report the backend "not importable".
    """
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        try:
            importlib.import_module(module)
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
    "aiter": "mxcheck.backends.aiter:AiterBackend",
    "aiter_triton": "mxcheck.backends.aiter_triton:AiterTritonBackend",
    "primus_turbo": "mxcheck.backends.primus_turbo:PrimusTurboBackend",
    "torch": "mxcheck.backends.torch_scaled_mm:TorchScaledMMBackend",
    "torchao": "mxcheck.backends.torchao_backend:TorchaoBackend",
    "transformer_engine": "mxcheck.backends.transformer_engine:TransformerEngineBackend",
}


def _instantiate(spec: str) -> Backend:
    return _load_spec(spec)()


for _name, _spec in _BUILTIN.items():
    register(_name, functools.partial(_instantiate, _spec))
