"""mx_quantize against torchao's to_mx: same process, same input, ratios only.

    python benchmarks/bench_quantize.py [--device cpu|cuda] [--rows 16384 --cols 3072] [--compile]

Prints, per case (e2m1 `even`, e4m3 `rceil`), the median time of one call of each
implementation, host included (``*_ms``: launch to synchronize), and the ratio mxcheck /
torchao (target: <= 1.0 eager). On CUDA it also measures the device time of a call
(``*_device_ms``: the kernels' time in torch.profiler, without the host's launch time; L2
cleared before each call, as triton.testing.do_bench does) and the copy bandwidth the same way, and
prints the ratio to the memory floor (bytes a quantizer must move: bf16 in, one code byte
and 1/32 scale byte out, over the copy bandwidth; target for the compiled oracle: <= 2.0)
of the device time (``*_over_floor``) and, as before 2026-12-02, of the time with the host
(``*_wall_over_floor``). The floor is a property of the device's memory, so the device time
is what it bounds; the host's part is in ``*_ms``. Not a test: numbers go to
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import torch

from mxcheck.scaling.mx import mx_quantize

CASES = [("e2m1", "even", "float4_e2m1fn_x2"), ("e4m3", "rceil", "float8_e4m3fn")]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn, device: str, repeat: int) -> float:
    fn()
    fn()  # warm-up (and compile)
    times = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def device_seconds(fn, repeat: int, l2_bytes: int = 256 << 20) -> float:
    """Median over calls of the device time of the kernels (and copies) one call runs, from
    torch.profiler: the host's launch time and any gap between kernels left out, L2 cleared
    before each call (as triton.testing.do_bench clears it)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    flush = torch.empty(l2_bytes, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(repeat):
        flush.zero_()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        us = sum(e.device_time_total for e in prof.events() if e.device_type == DeviceType.CUDA)
        if us <= 0:
            raise RuntimeError("the profiler recorded no device time for the call")
        times.append(us / 1e6)
    return statistics.median(times)


def copy_bandwidth(device: str, nbytes: int = 2 << 30) -> float:
    """Bytes moved per second by a device copy (read + write) of nbytes, device time."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    device = 2 * nbytes / device_seconds(lambda: dst.copy_(src), 10)
    with_host = 2 * nbytes / median_seconds(lambda: dst.copy_(src), "cuda", 10)  # the host's part is small here
    print(f"copy bandwidth: {device / 1e12:.3f} TB/s device time, {with_host / 1e12:.3f} TB/s with the host", flush=True)
    return device


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--cols", type=int, default=3072)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="also time torch.compile'd versions")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode, e.g. max-autotune-no-cudagraphs")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args()

    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    g = torch.Generator(device=args.device).manual_seed(0)
    x = torch.randn(args.rows, args.cols, device=args.device, generator=g).bfloat16()
    floor_s = None
    if args.device == "cuda":
        moved = x.numel() * (2 + 1 + 1 / 32)
        floor_s = moved / copy_bandwidth(args.device)
    results = []
    for fmt, rule, ao_dtype in CASES:
        ours = functools.partial(mx_quantize, x, fmt, scale_rule=rule)
        theirs = functools.partial(to_mx, x, getattr(torch, ao_dtype), 32, ScaleCalculationMode(rule))
        variants = [("eager", ours, theirs)]
        if args.compile:
            mode = f"compile:{args.compile_mode or 'default'}"
            variants.append((mode, torch.compile(ours, mode=args.compile_mode),
                             torch.compile(theirs, mode=args.compile_mode)))
        for mode, a, b in variants:
            row = {"device": args.device, "case": f"{fmt}-{rule}", "mode": mode}
            for who, fn in (("mxcheck", a), ("torchao", b)):
                try:
                    row[f"{who}_ms"] = median_seconds(fn, args.device, args.repeat) * 1e3
                    if floor_s:
                        row[f"{who}_device_ms"] = device_seconds(fn, args.repeat) * 1e3
                except Exception as e:  # torchao's EVEN mode does not compile, by its own docstring
                    row[f"{who}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            if "torchao_ms" in row and "mxcheck_ms" in row:
                row["ratio"] = row["mxcheck_ms"] / row["torchao_ms"]
            for who in ("mxcheck", "torchao"):
                if floor_s and f"{who}_device_ms" in row:
                    row[f"{who}_over_floor"] = row[f"{who}_device_ms"] / (floor_s * 1e3)
                    row[f"{who}_wall_over_floor"] = row[f"{who}_ms"] / (floor_s * 1e3)
            results.append(row)
            print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
