"""mxcheck's quantize and GEMM as ``torch.library`` custom ops, so a dispatch mode sees them.

The reference Function announces every operand it quantizes (``mxcheck::quantize``) and
every GEMM it runs (``mxcheck::gemm``) through the dispatcher, with the tensor acted on,
the layer, the operand or direction, and the format, scaling and scale rule actually
applied. ``mxcheck.manifest.trace_precision`` (or a profiler, or any TorchDispatchMode)
reads them there. The aten ops that make up the oracle's own arithmetic run inside
``oracle_scope()`` so a tracer can tell them from a layer's real bf16 GEMM.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

__all__ = ["UNTRACED", "announce_gemm", "announce_quantize", "in_oracle", "oracle_scope"]

_local = threading.local()


@contextlib.contextmanager
def oracle_scope() -> Iterator[None]:
    """Marks the aten ops run inside as the oracle's emulation, not a layer's own GEMM."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def in_oracle() -> bool:
    return getattr(_local, "depth", 0) > 0


@torch.library.custom_op("mxcheck::quantize", mutates_args=())
def _quantize(x: torch.Tensor, layer: str, operand: str, fmt: str, scaling: str, scale_rule: str,
              block_size: int, rounding: str) -> None:
    return None


@torch.library.custom_op("mxcheck::gemm", mutates_args=())
def _gemm(a: torch.Tensor, layer: str, direction: str, a_fmt: str, b_fmt: str, backend: str) -> None:
    return None


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # no dispatch of their own


def _listened(x: torch.Tensor) -> bool:
    """Whether anything could see a dispatched op: a TorchDispatchMode (infra modes, i.e.
    fake tensors and make_fx, included), a TorchFunctionMode, the profiler, a compiler or
    the JIT tracer, or a tensor subclass (a Parameter is plain). A Python custom op costs
    tens of microseconds through the dispatcher; a training step announces about a
    hundred, and otherwise nobody reads them. Where torch lacks one of these checks, it
    announces anyway."""
    try:
        return bool(is_in_torch_dispatch_mode(include_infra_modes=True) or torch._C._is_torch_function_mode_enabled()
                    or torch.autograd._profiler_enabled() or torch.compiler.is_compiling()
                    or torch.jit.is_tracing() or type(x) not in _PLAIN)
    except AttributeError:  # a torch without one of them
        return True


def announce_quantize(x: torch.Tensor, layer: str, operand: str, fmt: str, scaling: str, scale_rule: str,
                      block_size: int, rounding: str) -> None:
    """Dispatch ``mxcheck::quantize`` for an operand about to be quantized (when listened)."""
    if _listened(x):
        torch.ops.mxcheck.quantize(x, layer, operand, fmt, scaling, scale_rule, block_size, rounding)


# The format an adapter announces for a GEMM it cannot observe (TransformerEngine runs its
# quantize and GEMM as pybind11 calls): the precision manifest reports it as not proven.
UNTRACED = "untraced"


def announce_gemm(a: torch.Tensor, layer: str, direction: str, a_fmt: str, b_fmt: str, backend: str) -> None:
    """Dispatch ``mxcheck::gemm`` for a GEMM about to run (``a``: its first operand's codes),
    when listened."""
    if _listened(a):
        torch.ops.mxcheck.gemm(a, layer, direction, a_fmt, b_fmt, backend)
