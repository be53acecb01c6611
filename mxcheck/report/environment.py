"""Provenance for a report: versions, device, architecture, commit and seed.

Nothing here imports a vendor package: versions come from installed distribution
metadata (importlib.metadata), because importing triton or aiter can take seconds,
initialise a device, or fail in ways that have nothing to do with the report.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

import mxcheck
from mxcheck import hardware

__all__ = ["NUMERICS_ENV_PREFIXES", "OPTIONAL_PACKAGES", "collect_environment", "device_info", "numerics_env",
           "package_versions"]

# Environment variables by which vendors change numerics without a code change: TE's recipe
# defaults (NVTE_BACKWARD_OVERRIDE, NVTE_NVFP4_DISABLE_RHT, ...), AITER's packer choice
# (AITER_MXFP6_QUANT_BACKEND), Primus-Turbo's backend selection.
NUMERICS_ENV_PREFIXES = ("NVTE_", "AITER_", "PRIMUS_TURBO_")

# Import name -> distribution names to try first. The names differ for some: ROCm wheels
# ship Triton as pytorch-triton-rocm, AITER is published as amd-aiter, and
# TransformerEngine's torch half is transformer_engine_torch.
OPTIONAL_PACKAGES: dict[str, tuple[str, ...]] = {
    "torchao": ("torchao",),
    "transformer_engine": ("transformer_engine", "transformer_engine_torch"),
    "primus_turbo": ("primus_turbo", "primus-turbo"),
    "aiter": ("amd-aiter", "aiter"),
    "triton": ("triton", "pytorch-triton-rocm", "pytorch-triton"),
    "ml_dtypes": ("ml_dtypes",),
}
# Which devices this process may use: set by the runner, by torchrun's launcher, or by
# hardware.pin_worker for an xdist worker (one GPU each).
VISIBLE_DEVICES_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def _distribution_version(import_name: str, candidates: tuple[str, ...],
                          providers: dict[str, list[str]]) -> str | None:
    """Version of the first installed distribution providing ``import_name``, else None."""
    names = list(candidates) + [d for d in providers.get(import_name, []) if d not in candidates]
    for dist in names:
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        # Say which distribution when it is not the import name, e.g. pytorch-triton-rocm.
        same = dist.replace("-", "_").lower() == import_name
        return version if same else f"{version} ({dist})"
    return None


def package_versions(names: Iterable[str] = OPTIONAL_PACKAGES) -> dict[str, str | None]:
    """{import name: installed version or None}, read from metadata without importing."""
    try:
        providers = metadata.packages_distributions()
    except Exception:  # a broken dist-info elsewhere must not cost us the report
        providers = {}
    out = {name: _distribution_version(name, OPTIONAL_PACKAGES.get(name, (name,)), providers)
           for name in names}
    if out.get("aiter", "") is None:
        out["aiter"] = _aiter_tree_version()
    return out


def _aiter_tree_version() -> str | None:
    """The version in an unpacked amd-aiter tree named by MXCHECK_AITER_PATH (the aiter_triton
    backend loads from there when no distribution is installed), read without importing."""
    root = os.environ.get("MXCHECK_AITER_PATH")
    if not root:
        return None
    try:
        text = (Path(root) / "aiter" / "_version.py").read_text()
    except OSError:
        return None
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", text)
    return f"{m.group(1)} (MXCHECK_AITER_PATH={root})" if m else None


def numerics_env() -> dict[str, str]:
    """The set environment variables named by NUMERICS_ENV_PREFIXES, sorted by name."""
    return {k: os.environ[k] for k in sorted(os.environ) if k.startswith(NUMERICS_ENV_PREFIXES)}


def device_info() -> dict[str, Any]:
    """Accelerator name, architecture ("sm90", "gfx950" or "cpu"), runtime version, and the
    ``*_VISIBLE_DEVICES`` this process was pinned to (None when unrestricted)."""
    hw = hardware.detect()
    info: dict[str, Any] = {"device": hw.name, "arch": hw.arch, "device_count": hw.device_count,
                            "runtime": hw.runtime}
    if hw.faked:
        info["faked"] = True
    info["visible_devices"] = {v: os.environ[v] for v in VISIBLE_DEVICES_VARS if v in os.environ} or None
    return info


def _git(args: list[str], cwd: str | os.PathLike[str] | None) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None  # no git, not a repository, or too slow: the report goes on without it
    return out.stdout.strip()


def git_info(cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Commit of the repository at ``cwd`` and whether tracked files differ from it."""
    sha = _git(["rev-parse", "HEAD"], cwd)
    if not sha:
        return {"git_sha": None, "git_dirty": None}
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    return {"git_sha": sha, "git_dirty": None if status is None else bool(status)}


def collect_environment(seed: int | None = None, backends: Iterable[str] = (), *,
                        cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The provenance a report carries: enough to tell two runs' setups apart.

    ``backends`` are the names of the backends under test; ``cwd`` is where to look for
    the git commit (the current directory by default). Nothing time-dependent is
    recorded, so the same setup gives the same dict (and byte-identical reports).
    """
    env: dict[str, Any] = {
        "mxcheck": mxcheck.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
    }
    env.update(device_info())
    env["packages"] = package_versions()
    env["numerics_env"] = numerics_env()
    env.update(git_info(cwd))
    env["seed"] = seed
    env["backends"] = sorted(set(backends))
    return env
