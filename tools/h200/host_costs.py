"""Where a quantized step's host time goes, without a profiler: microseconds per call of the
pieces a linear runs, on tensors small enough that the device never holds the host back,
and the launches one flux-535m training step makes per recipe.

    PYTHONPATH=. python3 tools/h200/host_costs.py [--json out.json]

A probe for benchmarks/README.md, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile

from mxcheck.functions.linear import quant_linear
from mxcheck.gemm import emulated_gemm, quantize_operand
from mxcheck.recipes import get_recipe
from mxcheck.training import TrainConfig

sys.path.insert(0, "benchmarks")
from bench_training_step import make_step

RECIPES = ("mxfp4", "mxfp8", "fp8", "nvfp4")


def per_call_us(fn, n: int = 400) -> float:
    """Host microseconds per call: the calls' time to return, the queue drained after."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
        torch.cuda.synchronize()
    return best * 1e6


def micro() -> dict[str, float]:
    @triton.jit
    def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    dev = "cuda"
    x = torch.randn(256, 512, device=dev, dtype=torch.bfloat16)
    w = torch.randn(512, 512, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    out = {
        "torch.empty": per_call_us(lambda: torch.empty((256, 512), device=dev, dtype=torch.uint8)),
        "x + 1": per_call_us(lambda: x + 1),
        "x.to(float32)": per_call_us(lambda: x.to(torch.float32)),
        "x @ w.T (bf16)": per_call_us(lambda: x @ w.T),
        "triton copy, 3 args": per_call_us(lambda: copy_kernel[(64,)](x, y, x.numel(), BLOCK=2048)),
    }
    for recipe in RECIPES:
        r = get_recipe(recipe)
        spec = r.spec("x_row")
        rand = (torch.randint(0, 256, x.shape, dtype=torch.uint8, device=dev) if spec.rounding == "sr" else None)
        out[f"{recipe}: quantize_operand x_row"] = per_call_us(lambda s=spec, rd=rand: quantize_operand(x, s, rand=rd))
        qa = quantize_operand(x, spec, rand=rand)
        qb = quantize_operand(w, r.spec("w_row"))
        out[f"{recipe}: emulated_gemm fwd"] = per_call_us(lambda a=qa, b=qb: emulated_gemm(a, b))
        xr = x.detach().requires_grad_()
        wr = w.detach().requires_grad_()

        def fwd_bwd(rc=recipe, xr=xr, wr=wr):
            quant_linear(xr, wr, None, rc).sum().backward()

        out[f"{recipe}: quant_linear fwd+bwd"] = per_call_us(fwd_bwd, n=100)
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    out["F.linear fwd+bwd"] = per_call_us(lambda: F.linear(xr, wr).sum().backward(), n=100)
    return out


def breakdown(recipes=RECIPES, n: int = 200) -> dict[str, dict[str, float]]:
    """Host microseconds per fwd+bwd of a small quant_linear, split by the pieces it runs:
    each operand's quantization and each GEMM, timed around the calls (the device never
    holds the host back at this size)."""
    import collections  # noqa: PLC0415

    from mxcheck.functions import linear as lin  # noqa: PLC0415

    spent: collections.Counter[str] = collections.Counter()
    quantize, run_gemm = lin.OperandQuantizer.__call__, lin.OperandQuantizer.run_gemm
    forward, backward = lin.QuantLinearFunction.forward, lin.QuantLinearFunction.backward

    def timed(name_of, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name_of(a)] += time.perf_counter() - t0
        return wrapper

    lin.OperandQuantizer.__call__ = timed(lambda a: f"quantize {a[1]}", quantize)
    lin.OperandQuantizer.run_gemm = timed(lambda a: f"gemm {a[1]}", run_gemm)
    lin.QuantLinearFunction.forward = staticmethod(timed(lambda a: "Function.forward", forward))
    lin.QuantLinearFunction.backward = staticmethod(timed(lambda a: "Function.backward", backward))
    out = {}
    try:
        x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for recipe in recipes:
            for _ in range(10):
                quant_linear(x, w, None, recipe).sum().backward()
            torch.cuda.synchronize()
            spent.clear()
            t0 = time.perf_counter()
            for _ in range(n):
                quant_linear(x, w, None, recipe).sum().backward()
            spent["total (fwd+bwd, sum, autograd)"] = time.perf_counter() - t0
            torch.cuda.synchronize()
            out[recipe] = {k: round(v / n * 1e6, 1) for k, v in sorted(spent.items())}
            print(recipe, out[recipe], flush=True)
    finally:
        lin.OperandQuantizer.__call__, lin.OperandQuantizer.run_gemm = quantize, run_gemm
        lin.QuantLinearFunction.forward, lin.QuantLinearFunction.backward = staticmethod(forward), staticmethod(backward)
    return out


def launches_per_step() -> dict[str, dict[str, float]]:
    """Device kernels (mxcheck's Triton kernels among them), launch API calls and aten ops
    of one flux-535m step per recipe, from torch.profiler."""
    cfg = TrainConfig(model="flux-535m", samples=4, img_tokens=1024, txt_tokens=256, device="cuda")
    rows = {}
    for name in ("bf16", *RECIPES):
        step = make_step(cfg, None if name == "bf16" else name, "emulated")
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        events = prof.key_averages()
        kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
        launch = {e.key: e.count for e in events if "Launch" in e.key or "cuLaunch" in e.key}
        triton = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                     and ("mx_" in e.key or "fp8_" in e.key or "blocks_amax" in e.key or "outer_scaled" in e.key
                          or "transpose_bytes" in e.key))
        aten = sum(e.count for e in events if e.key.startswith("aten::") and e.device_type == torch.autograd.DeviceType.CPU)
        rows[name] = {"device_kernels": kernels, "mxcheck_triton_kernels": triton, "launch_calls": launch,
                      "aten_ops": aten}
        del step
        torch.cuda.empty_cache()
        print(name, rows[name], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument("--parts", nargs="+", default=["micro", "breakdown", "steps"])
    args = p.parse_args()
    record: dict[str, object] = {"torch": torch.__version__}
    if "micro" in args.parts:
        record["per_call_us"] = costs = micro()
        for k, v in costs.items():
            print(f"{k:40s} {v:8.1f} us", flush=True)
    if "breakdown" in args.parts:
        record["linear_breakdown_us"] = breakdown()
    if "steps" in args.parts:
        record["per_step"] = launches_per_step()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
