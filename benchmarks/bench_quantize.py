"""mx_quantize against torchao's to_mx: same process, same input, ratios only.

    python benchmarks/bench_quantize.py [--device cpu|cuda] [--rows 16384 --cols 3072] [--compile]

Prints, per case (e2m1 `even`, e4m3 `rceil`), the median time of each implementation and
the ratio mxcheck / torchao (target: <= 1.0 eager). On CUDA it also measures copy
bandwidth and prints each time's ratio to the memory floor (bytes a quantizer must move:
bf16 in, one code byte and 1/32 scale byte out, over the copy bandwidth; target for the
compiled oracle: <= 2.0). Not a test: numbers go to benchmarks/README.md.
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


def copy_bandwidth(device: str, nbytes: int = 2 << 30) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = median_seconds(lambda: dst.copy_(src), device, 10)
    return 2 * nbytes / t  # read + write


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
            ta = median_seconds(a, args.device, args.repeat)
            try:
                tb = median_seconds(b, args.device, args.repeat)
            except Exception as e:  # torchao's EVEN mode does not compile, by its own docstring
                print(f"device={args.device} case={fmt}-{rule} mode={mode} mxcheck_ms={ta * 1e3:.3f} "
                      f"torchao failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
                results.append({"device": args.device, "case": f"{fmt}-{rule}", "mode": mode,
                                "mxcheck_ms": ta * 1e3, "torchao_error": type(e).__name__,
                                **({"mxcheck_over_floor": ta / floor_s} if floor_s else {})})
                continue
            row = {"device": args.device, "case": f"{fmt}-{rule}", "mode": mode,
                   "mxcheck_ms": ta * 1e3, "torchao_ms": tb * 1e3, "ratio": ta / tb}
            if floor_s:
                row["mxcheck_over_floor"] = ta / floor_s
                row["torchao_over_floor"] = tb / floor_s
            results.append(row)
            print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
