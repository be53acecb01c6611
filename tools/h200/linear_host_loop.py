"""A quantized linear's forward and backward in a loop, for a sampling profiler (py-spy) to
see where the host's time goes, the autograd thread's backward included.

    python3 tools/h200/linear_host_loop.py mxfp4 --seconds 20 [--device cuda] [--shape 256 512 512] &
    # once it prints "warm":
    py-spy record --pid $! --duration 5 --nonblocking -r 250 -f raw --threads -o spy.txt

``--step``: loop bench_training_step's flux-535m step instead (the recipe's, or bf16's).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from mxcheck.functions.linear import quant_linear
from mxcheck.training import TrainConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe", help="a recipe name, or bf16 for torch's F.linear")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--shape", type=int, nargs=3, default=(256, 512, 512), metavar=("M", "N", "K"))
    p.add_argument("--warmup", type=int, default=5, help="calls before the loop (prints 'warm' after)")
    p.add_argument("--step", action="store_true", help="the flux-535m training step instead")
    args = p.parse_args()
    if args.step:
        sys.path.insert(0, "benchmarks")
        from bench_training_step import make_step  # noqa: PLC0415  (a script beside, not a package)

        cfg = TrainConfig(model="flux-535m", samples=4, img_tokens=1024, txt_tokens=256, device=args.device)
        call = make_step(cfg, None if args.recipe == "bf16" else args.recipe, "emulated")
        call()
    else:
        m, n, k = args.shape
        x = torch.randn(m, k, device=args.device, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(n, k, device=args.device, dtype=torch.bfloat16, requires_grad=True)

        def call() -> None:
            y = torch.nn.functional.linear(x, w) if args.recipe == "bf16" else quant_linear(x, w, None, args.recipe)
            y.sum().backward()

    for _ in range(args.warmup):  # Triton compiles on the first calls: not the host cost looked for
        call()
    if args.device == "cuda":
        torch.cuda.synchronize()
    print("warm", flush=True)
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        call()
        calls += 1
    if args.device == "cuda":
        torch.cuda.synchronize()
    print(f"{args.recipe}: {calls} calls, {(time.perf_counter() - t0) / calls * 1e6:.1f} us a call")


if __name__ == "__main__":
    main()
