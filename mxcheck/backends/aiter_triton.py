"""AITER's Triton MXFP4 kernels, loaded from the ``amd-aiter`` wheel without its ``__init__``.

``aiter/__init__.py`` builds or loads HIP extensions at import (it fails without ROCm), but
the Triton kernels are plain files: ``aiter/utility/fp4_utils.py::dynamic_mxfp4_quant``
(quantizer) and ``aiter/ops/triton/gemm_afp4wfp4.py::gemm_afp4wfp4`` (FP4 GEMM). They are
imported here under bare stand-ins for the packages on the way (``__path__`` = the wheel's
folders, no ``__init__`` run) and a ``chip_info`` stub; ``sys.modules`` is restored after the
load, so a later ``import aiter`` (the HIP adapter) is not affected. Modelled on amd-aiter
0.1.7.post2.dev18 (PyPI); ``MXCHECK_AITER_PATH`` points at another unpacked tree.

On NVIDIA (sm90+) the GEMM runs with AITER's arch lookup answering ``gfx950`` (it asserts
``is_fp4_avail()`` and reads its tuned configs by arch), minus the AMD-only launch options
NVIDIA's Triton rejects. Triton lowers ``tl.dot_scaled`` there by upcasting to bf16, so the
GEMM is judged against the fp32-accumulation bound like any other.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from mxcheck import hardware
from mxcheck.backends import import_vendor
from mxcheck.backends.aiter import AITER_QUANT_SPECS, DISTRIBUTION
from mxcheck.backends.amd_mx import check_nt_pair, check_spec, gfx950_missing, mx_tensor
from mxcheck.backends.contract import Refusal
from mxcheck.packing import pack_fp4, unpack_fp4
from mxcheck.recipes import OPERANDS, OperandSpec, Recipe, get_recipe
from mxcheck.scaling.mx import MXTensor

__all__ = ["AMD_ONLY_OPTIONS", "AiterTritonBackend", "aiter_tree", "load_kernels", "nvidia_config"]

# Packages whose __init__ must not run; each becomes a bare module over the wheel's folder.
_BARE_PACKAGES = ("aiter", "aiter.jit", "aiter.jit.utils", "aiter.utility", "aiter.ops", "aiter.ops.triton")
_QUANT_MODULE = "aiter.utility.fp4_utils"
_GEMM_MODULE = "aiter.ops.triton.gemm_afp4wfp4"
_ARCH_MODULE = "aiter.ops.triton.utils._triton.arch_info"
# Launch options in AITER's MI350X configs that only AMD's Triton backend knows.
AMD_ONLY_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
# The GEMM's scale loads are unmasked along K (_gemm_afp4_wfp4_kernel, tl.load(a_scale_ptrs)):
# K is padded here to whole BLOCK_SIZE_K tiles (codes 0, scale byte 127), so no byte read
# lies past a row's end.
_K_TILE = 256
_OUT_DTYPES = (torch.bfloat16,)  # gemm_afp4wfp4 docstring: BF16 or FP16 output
_loaded: dict[str, Any] = {}


def aiter_tree() -> Path:
    """The folder holding the wheel's ``aiter/`` package: ``$MXCHECK_AITER_PATH`` or the
    installed amd-aiter distribution; ValueError naming what is missing."""
    if env := os.environ.get("MXCHECK_AITER_PATH"):
        root = Path(env)
    else:
        try:
            root = Path(str(metadata.distribution(DISTRIBUTION).locate_file("")))
        except metadata.PackageNotFoundError:
            raise ValueError(f"{DISTRIBUTION} is not installed (pip install -e '.[vendors]'), and "
                             "MXCHECK_AITER_PATH is not set") from None
    if not (root / "aiter" / "utility" / "fp4_utils.py").is_file():
        raise ValueError(f"no aiter/utility/fp4_utils.py under {root} (MXCHECK_AITER_PATH must name the folder "
                         "an amd_aiter-*.whl was unzipped into)")
    return root


@contextlib.contextmanager
def _bare_aiter(root: Path) -> Iterator[None]:
    """Bare ``aiter`` packages and a chip_info stub in sys.modules; the old entries afterwards."""
    saved = {n: m for n, m in sys.modules.items() if n == "aiter" or n.startswith("aiter.")}
    for name in saved:
        del sys.modules[name]
    try:
        for name in _BARE_PACKAGES:
            mod = types.ModuleType(name)
            mod.__path__ = [str(root.joinpath(*name.split(".")))]
            sys.modules[name] = mod
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, mod)
        chip = types.ModuleType("aiter.jit.utils.chip_info")
        chip.get_gfx = lambda: "gfx950"  # aiter/utility/dtypes.py picks its fp8 dtype by gfx at import
        chip.get_cu_num = lambda: 256
        sys.modules[chip.__name__] = chip
        yield
    finally:
        for name in [n for n in sys.modules if n == "aiter" or n.startswith("aiter.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def load_kernels() -> dict[str, Any]:
    """{"quant": dynamic_mxfp4_quant, "gemm": gemm_afp4wfp4, "get_config": _get_config} from
    the wheel's files, loaded once. The GEMM module's arch lookup answers gfx950."""
    if not _loaded:
        with _bare_aiter(aiter_tree()):
            quant = importlib.import_module(_QUANT_MODULE)
            gemm = importlib.import_module(_GEMM_MODULE)
            arch = importlib.import_module(_ARCH_MODULE)
        arch.get_arch = lambda: "gfx950"  # this module object is ours alone after the restore
        _loaded.update(quant=quant.dynamic_mxfp4_quant, gemm=gemm.gemm_afp4wfp4,
                       get_config=gemm._get_config)
    return _loaded


def nvidia_config(config: dict[str, Any]) -> dict[str, Any]:
    """AITER's tuned config for (M, N, K) without the options NVIDIA's Triton does not take."""
    return {k: v for k, v in config.items() if k not in AMD_ONLY_OPTIONS}


def _device_missing() -> str | None:
    if gfx950_missing("") is None:
        return None
    hw = hardware.detect()
    if hw.vendor == "nvidia" and torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0):
        return None
    return f"AITER's Triton MXFP4 kernels need gfx950 or an NVIDIA sm90+ GPU; this machine has {hw.describe()}"


class AiterTritonBackend:
    """dynamic_mxfp4_quant and gemm_afp4wfp4 (MXFP4, 1x32 blocks along K) from AITER's Triton files."""

    name = "aiter_triton"
    device = "cuda"
    gemm_out_dtypes = _OUT_DTYPES

    def available(self) -> tuple[bool, str]:
        reasons = [why] if (why := import_vendor("triton")) is not None else []
        try:
            aiter_tree()
        except ValueError as e:
            reasons.append(str(e))
        if (why := _device_missing()) is not None:
            reasons.append(why)
        return (not reasons), "; ".join(reasons)

    def supports(self, recipe: Recipe | str) -> tuple[bool, str]:
        """Every operand 1x32 MX e2m1 with the even scale rule (what dynamic_mxfp4_quant
        documents and gemm_afp4wfp4 reads)."""
        r = get_recipe(recipe)
        for op in OPERANDS:
            s = r.spec(op)
            if s.scaling != "mx" or s.fmt != "e2m1" or s.block_size != 32 or s.scale_rule != "even":
                return False, (f"aiter_triton: recipe {r.name} {op} is {s.fmt} scaling={s.scaling!r} "
                               f"block_size={s.block_size} scale_rule={s.scale_rule!r}; the Triton kernels run "
                               "1x32 MX e2m1 with the even scale rule")
        return True, ""

    def quantize(self, x: torch.Tensor, spec: OperandSpec) -> MXTensor:
        """x [rows, K] along K with dynamic_mxfp4_quant, held to AITER's documented contract
        (AITER_QUANT_SPECS["e2m1"]: even rule, RNE): what the kernel does instead is the finding."""
        who = "aiter_triton dynamic_mxfp4_quant"
        if spec.fmt != "e2m1":
            raise Refusal(f"{who} quantizes e2m1, not fmt={spec.fmt!r}")
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] % 32:
            raise Refusal(f"{who} takes a 2D [rows, K] operand with K a multiple of 32, got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise Refusal(f"x.dtype={x.dtype}; {who} takes float32, bfloat16 or float16")
        check_spec(spec, AITER_QUANT_SPECS["e2m1"], who)
        rows, k = x.shape
        data, scales = load_kernels()["quant"](x.contiguous(), shuffle=False)
        codes = unpack_fp4(data.view(torch.uint8))  # low nibble = even index
        return mx_tensor(codes.contiguous(), scales.view(torch.uint8)[:rows, : k // 32].contiguous(), spec, (rows, k))

    def gemm(self, a: MXTensor, b: MXTensor, *, out_dtype: torch.dtype = torch.bfloat16,
             bias: torch.Tensor | None = None) -> torch.Tensor:
        """a[M, K] @ b[N, K]^T (+ bias) with gemm_afp4wfp4 (AITER's config for M, N, K)."""
        ac, asc, bc, bsc = check_nt_pair(a, b)
        if a.fmt.name != "e2m1":
            raise Refusal(f"aiter_triton gemm_afp4wfp4 takes e2m1 operands, got {a.fmt.name}")
        if out_dtype not in _OUT_DTYPES:
            raise Refusal(f"aiter_triton: out_dtype={out_dtype}; gemm_afp4wfp4 is run here for {_OUT_DTYPES}")
        m, n = ac.shape[0], bc.shape[0]
        extra = -ac.shape[1] % _K_TILE
        ac, bc = (torch.nn.functional.pad(c, (0, extra)) for c in (ac, bc))
        asc, bsc = (torch.nn.functional.pad(s, (0, extra // 32), value=127) for s in (asc, bsc))
        kernels = load_kernels()
        # uint8 views: Triton 3.6 cannot bind torch.float4_e2m1fn_x2 / float8_e8m0fnu tensors.
        x, w = pack_fp4(ac).contiguous(), pack_fp4(bc).contiguous()
        config = kernels["get_config"](m, n, x.shape[1])
        if hardware.detect().vendor == "nvidia":
            config = nvidia_config(config)
        out = _fitting_stages(lambda c: kernels["gemm"](x, w, asc.contiguous(), bsc.contiguous(), out_dtype, config=c),
                              config)
        return out if bias is None else out + bias.to(out.dtype)


def _fitting_stages(launch: Any, config: dict[str, Any]) -> torch.Tensor:
    """launch(config), with num_stages lowered one at a time while Triton finds the kernel
    too large for this device's shared memory: AITER tunes its stages for MI350X, and on an
    H200 (227 KiB per block) its 128x256x256 3-stage config needs 230 KiB. The pipeline
    depth changes neither the tiles nor the accumulation order."""
    from triton.runtime.errors import OutOfResources  # noqa: PLC0415  (vendor packages load late)

    while True:
        try:
            return launch(dict(config))
        except OutOfResources:
            if config.get("num_stages", 1) <= 1:
                raise
            config = {**config, "num_stages": config["num_stages"] - 1}
