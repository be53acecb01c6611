"""What the installed torchao has, found by looking (modules, attributes, enum members, one
probe of its fp4 packer), never by reading its version string to pick a code path.

Measured on torch 2.13.0 CPU, torchao 0.13.0 to 0.18.0 from PyPI (0.12.0 does not import
under torch 2.13: ``torch._inductor.kernel.flex_attention`` is gone). What differs:

- ``mx_mm`` (the autograd Function behind torchao's MX training linear) lives in
  ``prototype/mx_formats/mx_linear.py`` up to 0.17 and in
  ``prototype/moe_training/mxfp8_linear.py`` from 0.18 (beside ``MXFP8Linear``); its
  arguments after ``block_size`` change: 0.13-0.14 ``gemm_kernel_choice``
  (``MXGemmKernelChoice.EMULATED``), ``mxfp8_cast_kernel_choice``; 0.15
  ``kernel_preference`` (``KernelPreference.EMULATED`` is new in 0.15); 0.16 adds
  ``mxfp8_dim0_cast_kernel_choice``; 0.17 adds ``wgrad_with_hp``. ``mx_mm_args`` fills them
  by name.
- fp4 packing: 0.13-0.14 ``kernels.pack_uint4`` puts element 0 in the HIGH nibble
  (``x[::2] << 4 | x[1::2]``), 0.15 on in the low nibble, as torch core (pytorch/ao PR
  "fix fp4 packing definition", issue #2939).
- Unchanged over the range: ``to_mx(x, elem_dtype, block_size, ScaleCalculationMode)`` and
  its bits on float32 and bfloat16 inputs (float16 asserts "not supported yet"),
  ``config.ScaleCalculationMode`` FLOOR / RCEIL / CEIL / EVEN, the element dtypes
  (``torch.float4_e2m1fn_x2``, ``"fp6_e2m3"``, ``"fp6_e3m2"``, torch's fp8 dtypes in
  ``constants.SUPPORTED_ELEM_DTYPES``), ``float8.float8_utils.tensor_to_scale`` and
  ``float8.float8_training_tensor.hp_tensor_and_scale_to_float8``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from typing import Any

import torch

from mxcheck.backends import import_vendor
from mxcheck.backends.contract import MissingDependency, version_problem

__all__ = ["NEEDED", "QUANTIZE_MODULES", "elem_dtype", "fp4_high_nibble_first", "mx_mm", "mx_mm_args",
           "scale_mode", "torchao_problem"]

# The releases measured (above): a release outside them is named, never half-run.
NEEDED = ("0.14", "0.19")  # >=0.14,<0.19; pyproject's [test] extra declares the same
# What quantize imports; the linear's modules are looked for only when a linear is asked.
QUANTIZE_MODULES = ("torchao.prototype.mx_formats.config", "torchao.prototype.mx_formats.mx_tensor",
                    "torchao.prototype.mx_formats.kernels", "torchao.float8.float8_utils",
                    "torchao.float8.float8_training_tensor")
# Where mx_mm lives, newest first: 0.18 moved it next to MXFP8Linear.
MX_MM_HOMES = ("torchao.prototype.moe_training.mxfp8_linear", "torchao.prototype.mx_formats.mx_linear")
_CONFIG = "torchao.prototype.mx_formats.config"
_KERNEL_PREFERENCE = "torchao.quantization.quantize_.common.kernel_preference"
# mxcheck format -> candidate to_mx elem_dtypes (a torch dtype name, else torchao's string
# constant); the first the installed torchao lists in SUPPORTED_ELEM_DTYPES is used.
_ELEM_DTYPES = {"e2m1": ("float4_e2m1fn_x2", "fp4_e2m1"), "e2m3": ("fp6_e2m3",), "e3m2": ("fp6_e3m2",),
                "e4m3": ("float8_e4m3fn",), "e5m2": ("float8_e5m2",)}
# mx_mm argument name -> (module, enum, member) of the emulated / torch choice, or a value.
_MX_MM_KNOBS: dict[str, tuple[str, str, str] | bool] = {
    "gemm_kernel_choice": (_CONFIG, "MXGemmKernelChoice", "EMULATED"),
    "kernel_preference": (_KERNEL_PREFERENCE, "KernelPreference", "EMULATED"),
    "mxfp8_cast_kernel_choice": (_CONFIG, "MXFP8Dim1CastKernelChoice", "TORCH"),
    "mxfp8_dim0_cast_kernel_choice": (_CONFIG, "MXFP8Dim0CastKernelChoice", "TORCH"),
    "mxfp8_dim1_cast_kernel_choice": (_CONFIG, "MXFP8Dim1CastKernelChoice", "TORCH"),
    "wgrad_with_hp": False,  # quantize all six copies, as the recipe says
}
_MX_MM_LEADING = ("input_hp", "weight_hp", "in_elem_dtype", "w_elem_dtype", "grad_elem_dtype", "block_size")


def _version() -> str | None:
    from importlib import metadata  # noqa: PLC0415

    try:
        return metadata.version("torchao")
    except metadata.PackageNotFoundError:
        return None


def torchao_problem() -> MissingDependency | None:
    """None when the installed torchao is in NEEDED and its quantize modules import."""
    if (why := version_problem("torchao", NEEDED[0], below=NEEDED[1])) is not None:
        return why
    for module in QUANTIZE_MODULES:
        if (why := import_vendor(module)) is not None:
            return MissingDependency("torchao", f">={NEEDED[0]},<{NEEDED[1]}", _version(), detail=why)
    return None


def _import(module: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao warns about its CUDA extensions on a CPU
        return importlib.import_module(module)


def scale_mode(rule: str) -> Any:
    """torchao's ScaleCalculationMode member for ``rule``, or None where the enum lacks it."""
    return {m.value: m for m in _import(_CONFIG).ScaleCalculationMode}.get(rule)


def elem_dtype(fmt: str) -> Any:
    """The to_mx elem_dtype for mxcheck format ``fmt``, or None where torchao lacks one."""
    supported = _import("torchao.prototype.mx_formats.constants").SUPPORTED_ELEM_DTYPES
    for name in _ELEM_DTYPES.get(fmt, ()):
        candidate = getattr(torch, name, name)
        if candidate in supported:
            return candidate
    return None


@functools.cache
def fp4_high_nibble_first() -> bool:
    """Whether the installed kernels.pack_uint4 puts element 0 in the high nibble (0.13-0.14)."""
    packed = _import("torchao.prototype.mx_formats.kernels").pack_uint4(torch.tensor([1, 2], dtype=torch.uint8))
    return int(packed.view(torch.uint8)[0]) == 0x12


@functools.cache
def mx_mm() -> tuple[Any, str | None]:
    """(torchao's mx_mm, None), or (None, why there is none here)."""
    tried = []
    for home in MX_MM_HOMES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                module = importlib.import_module(home)
            except Exception as e:  # 0.13-0.16 moe_training imports triton at package import
                tried.append(f"{home} ({type(e).__name__}: {e})")
                continue
        if hasattr(module, "mx_mm"):
            return module.mx_mm, None
        tried.append(f"{home} (no mx_mm)")
    return None, f"torchao {_version()} has no importable mx_mm: {'; '.join(tried)}"


def mx_mm_args(mode: Any) -> list[Any] | str:
    """mx_mm's arguments after ``block_size`` (emulated GEMM, torch casts, ``mode``), by the
    installed signature's names, or why this adapter cannot fill them."""
    fn, why = mx_mm()
    if fn is None:
        return why
    names = list(inspect.signature(fn.forward).parameters)[1:]  # after ctx
    if tuple(names[:len(_MX_MM_LEADING)]) != _MX_MM_LEADING:
        return f"torchao mx_mm takes {names}; this adapter passes {list(_MX_MM_LEADING)} first"
    args = []
    for name in names[len(_MX_MM_LEADING):]:
        knob = _MX_MM_KNOBS.get(name, mode if name == "scale_calculation_mode" else None)
        if knob is None:
            return f"torchao mx_mm takes {name!r}, which this adapter does not know how to set"
        if isinstance(knob, tuple):
            module, enum, member = knob
            found = getattr(getattr(_import(module), enum, None), member, None)
            if found is None:
                return f"torchao mx_mm takes {name!r} but {module}.{enum} has no {member}"
            knob = found
        args.append(knob)
    return args
