"""Load AITER's Triton kernels from the amd-aiter wheel's files without its ``__init__``.

``aiter/__init__.py`` builds / loads HIP extensions (it fails on NVIDIA and without ROCm),
so the packages on the way to the Triton files are made here as bare modules whose
``__path__`` points at the unpacked wheel, and their ``__init__`` never runs. Submodules
then import from the files as usual. ``aiter.jit.utils.chip_info`` (read by
``aiter/utility/dtypes.py`` at import) is replaced by a stub answering ``arch``.

Root: the folder holding the unpacked ``aiter/`` package (``unzip amd_aiter-*.whl -d ROOT``),
from the argument or $MXCHECK_AITER_PATH (default /tmp/aiter).
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

# Packages whose __init__ must not run (HIP builds, JIT loaders); each gets a bare module.
_BARE_PACKAGES = ("aiter", "aiter.jit", "aiter.jit.utils", "aiter.utility", "aiter.ops", "aiter.ops.triton")


def aiter_root(root: str | os.PathLike | None = None) -> Path:
    """The folder holding ``aiter/``; ValueError naming what is missing."""
    path = Path(root or os.environ.get("MXCHECK_AITER_PATH", "/tmp/aiter"))
    if not (path / "aiter" / "utility" / "fp4_utils.py").is_file():
        raise ValueError(f"no aiter/utility/fp4_utils.py under {path} (set MXCHECK_AITER_PATH to the folder an "
                         "amd_aiter-*.whl was unzipped into)")
    return path


def load_aiter(root: str | os.PathLike | None = None, arch: str = "gfx950") -> types.ModuleType:
    """Install the bare ``aiter`` packages and the chip_info stub; return ``aiter``."""
    path = aiter_root(root)
    for name in _BARE_PACKAGES:
        mod = types.ModuleType(name)
        mod.__path__ = [str(path / Path(*name.split(".")))]
        mod.__package__ = name
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)
    chip = types.ModuleType("aiter.jit.utils.chip_info")
    chip.get_gfx = lambda: arch  # dtypes.py: defaultDtypes[get_gfx()] picks the fp8 dtype
    chip.get_cu_num = lambda: 132
    sys.modules[chip.__name__] = chip
    sys.modules["aiter.jit.utils"].chip_info = chip
    return sys.modules["aiter"]


def stub_triton_arch(arch: str = "gfx950") -> types.ModuleType:
    """Make ``aiter.ops.triton.utils._triton.arch_info.get_arch`` answer ``arch`` (the FP4 GEMM
    asserts ``is_fp4_avail()``, i.e. gfx950, and looks its configs up by arch)."""
    info = importlib.import_module("aiter.ops.triton.utils._triton.arch_info")
    info.get_arch = lambda: arch
    return info
