"""emulated_gemm (dequantize to bf16 + bf16 matmul, fp32 accumulation) against a plain bf16
matmul of the same shape, at Flux 12B linear shapes. Ratios only, same process.

    python benchmarks/bench_gemm.py --device cuda [--recipe-fmt e2m1 --rule even]

Target (issue 4): <= 1.6x a plain bf16 matmul at 16384x9216x3072. Quantization of the
operands is done once, outside the timed region: this times the GEMM an oracle check runs.
Also times the Triton tl.dot_scaled backend where it is usable.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from mxcheck.gemm import emulated_gemm
from mxcheck.scaling.mx import mx_quantize

# (name, M, N, K): Flux 12B double-block (M = 64 x 256 tokens) and single-block (M = 64 x 512)
SHAPES = [
    ("img_attn.qkv", 16384, 9216, 3072),
    ("img_attn.proj", 16384, 3072, 3072),
    ("img_mlp.0", 16384, 12288, 3072),
    ("img_mlp.2", 16384, 3072, 12288),
    ("single.linear1", 32768, 21504, 3072),
    ("single.linear2", 32768, 3072, 15360),
]


def cuda_ms(fn, repeat: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def profile_table(fn, top: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=top)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--fmt", default="e2m1")
    p.add_argument("--rule", default="even")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--json", help="write the results here too")
    p.add_argument("--profile", type=int, default=0, help="print the N most expensive CUDA ops of one "
                   "emulated GEMM per shape")
    args = p.parse_args()
    if args.device != "cuda":
        raise SystemExit("bench_gemm times CUDA kernels; run it on a GPU (--device cuda)")
    try:
        from mxcheck.backends.triton_mx import triton_mx_gemm
    except ImportError:
        triton_mx_gemm = None
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, m, n, k in SHAPES:
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        w = torch.randn(n, k, device="cuda", generator=g).bfloat16()
        a, b = mx_quantize(x, args.fmt, scale_rule=args.rule), mx_quantize(w, args.fmt, scale_rule=args.rule)
        t_bf16 = cuda_ms(lambda: x @ w.T, args.repeat)  # noqa: B023
        t_emul = cuda_ms(lambda: emulated_gemm(a, b), args.repeat)  # noqa: B023
        row = {"layer": name, "M": m, "N": n, "K": k, "bf16_ms": t_bf16, "emulated_ms": t_emul,
               "ratio": t_emul / t_bf16}
        if triton_mx_gemm is not None:
            t_tri = cuda_ms(lambda: triton_mx_gemm(a, b), args.repeat)  # noqa: B023
            row["triton_ms"], row["triton_ratio"] = t_tri, t_tri / t_bf16
            row["triton_bit_identical"] = bool(torch.equal(triton_mx_gemm(a, b), emulated_gemm(a, b)))
        rows.append(row)
        if args.profile:
            print(profile_table(lambda: emulated_gemm(a, b), args.profile), flush=True)  # noqa: B023
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
