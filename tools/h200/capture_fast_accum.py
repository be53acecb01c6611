"""Capture torch._scaled_mm FP8 GEMMs with and without fast accumulation, for modelling
Hopper's reduced-precision accumulation on the CPU (mxcheck.diagnose.outputs).

Writes three .pt files (PATH.0, .1, .2 by K): a list of cases, each {"m", "n", "k", "granularity", "fmt_a", "fmt_b",
"family", "a", "b" (uint8 codes, [M, K] and [N, K]), "sa", "sb" (float32 scale_inv),
"fast": {out_dtype: tensor}, "exact_kernel": {out_dtype: tensor}} (the kernel with
use_fast_accum=False), plus the torch/CUDA/device facts.

    python tools/h200/capture_fast_accum.py $OUT/fast_accum.pt
"""

from __future__ import annotations

import sys

import torch

# Contraction sizes: the edge shapes' (mxcheck.conformance.edges.EDGE_SHAPES: K 64, 96, 384,
# 128, 256 and their dgrad contraction N 64, 128), the regular check's K 512, and long ones
# where a promotion interval would show.
KS = (16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 192, 256, 384, 512, 640, 1024, 2048, 4096)
MN = ((32, 64), (13, 64), (1, 128), (200, 32), (64, 128))
FAMILIES = ("randn", "heavy", "same_sign", "cancel")
LONG_MN = ((32, 64), (1, 128))  # K above 512: fewer shapes, so the file stays under 16 MB
LONG_FAMILIES = ("randn", "same_sign")


def operand(gen: torch.Generator, rows: int, k: int, family: str, dtype: torch.dtype) -> torch.Tensor:
    if family == "randn":
        x = torch.randn(rows, k, generator=gen)
    elif family == "heavy":  # magnitudes over many binades: alignment truncation shows
        x = torch.randn(rows, k, generator=gen) * torch.exp2(torch.randint(-8, 8, (rows, k), generator=gen).float())
    elif family == "same_sign":  # every product positive: the sum grows, low bits fall off
        x = torch.rand(rows, k, generator=gen) + 0.01
    else:  # large terms that cancel, small ones that survive
        x = torch.randn(rows, k, generator=gen)
        x[:, ::2] *= 64
    x = x / x.abs().amax() * 200  # inside e4m3's range
    return x.to(dtype)


def main(path: str) -> None:
    dev = "cuda"
    gen = torch.Generator().manual_seed(0)
    cases = []
    for k in KS:
        for m, n in (MN if k <= 512 else LONG_MN):
            for family in (FAMILIES if k <= 512 else LONG_FAMILIES):
                for gran in ("tensor", "row"):
                    for fa, fb in (((torch.float8_e4m3fn, torch.float8_e4m3fn),) if gran == "row" else
                                   ((torch.float8_e4m3fn, torch.float8_e4m3fn), (torch.float8_e5m2, torch.float8_e4m3fn))):
                        a = operand(gen, m, k, family, fa)
                        b = operand(gen, n, k, family, fb)
                        if gran == "tensor":
                            sa = torch.tensor(2.0 ** -3, dtype=torch.float32)
                            sb = torch.tensor(2.0 ** -5, dtype=torch.float32)
                        else:
                            sa = torch.exp2(torch.randint(-6, 2, (m, 1), generator=gen).float())
                            sb = torch.exp2(torch.randint(-6, 2, (1, n), generator=gen).float())
                        case = {"m": m, "n": n, "k": k, "granularity": gran, "fmt_a": str(fa), "fmt_b": str(fb),
                                "family": family, "a": a.view(torch.uint8), "b": b.view(torch.uint8),
                                "sa": sa.reshape(-1), "sb": sb.reshape(-1), "fast": {}, "exact_kernel": {}}
                        ad, bd = a.to(dev), b.to(dev)
                        sad, sbd = sa.to(dev), sb.to(dev)
                        for out in (torch.float32,):  # bf16 out: the float32 sum rounded once more
                            for fast, key in ((True, "fast"), (False, "exact_kernel")):
                                try:
                                    y = torch._scaled_mm(ad, bd.t(), scale_a=sad, scale_b=sbd, out_dtype=out,
                                                         use_fast_accum=fast)
                                    case[key][str(out)] = y.cpu()
                                except RuntimeError as e:
                                    case[key][str(out)] = f"error: {str(e)[:200]}"
                        cases.append(case)
    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(),
             "capability": torch.cuda.get_device_capability()}
    # three files of under 16 MB each (the device tool's limit per file)
    for part, (low, high) in enumerate(((0, 96), (97, 256), (257, 1 << 20))):
        mine = [c for c in cases if low <= c["k"] <= high]
        torch.save({"facts": facts, "cases": mine}, f"{path}.{part}")
        print(facts, len(mine), "cases in", f"{path}.{part}")


if __name__ == "__main__":
    main(sys.argv[1])
