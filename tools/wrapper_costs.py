"""The Python a fused quantize runs around its kernel launches, on any machine: the kernels
are replaced by no-ops and the wrappers told they run here, so what is timed is mxcheck's
own argument checks, layouts and tensor allocations (not Triton's launch, not the kernel).

    python tools/wrapper_costs.py [--calls 2000]

Compare two commits by running it from each (``PYTHONPATH=<worktree>``), alternating, and
taking the minimum per recipe: on a shared VM single runs move by tens of percent. A probe
for benchmarks/README.md, not a test; the codes it returns are not computed.
"""

from __future__ import annotations

import argparse
import time

import torch

from mxcheck.gemm import quantize_operand
from mxcheck.recipes import get_recipe
from mxcheck.scaling import mx_cuda


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def fake_kernels() -> None:
    mx_cuda._runs_here = lambda t: True
    names = ("dequantize", "quantize", "scaled_encode", "gemm_f32", "epilogue", "amax", "transpose")
    mx_cuda._kernels = lambda: dict.fromkeys(names, _NoLaunch())


def best_us(fn, calls: int) -> float:
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--recipes", nargs="+", default=["mxfp4", "mxfp8", "nvfp4"])
    args = p.parse_args()
    fake_kernels()
    x = torch.randn(256, 512).bfloat16()
    for recipe in args.recipes:
        spec = get_recipe(recipe).spec("x_row")
        print(f"{recipe} quantize_operand wrapper us {best_us(lambda s=spec: quantize_operand(x, s), args.calls):.1f}")


if __name__ == "__main__":
    main()
