"""On the H200: time the fused MX quantize kernel at several (elements per program, warps)
settings, 16384x3072 bf16, median device time of 20 calls (``bench_quantize.device_seconds``:
the host's launch time hidden, L2 cold), and check every setting gives the default's codes
and scales. Prints one line per case and setting.

    PYTHONPATH=.:/tmp/site python3 benchmarks/bench_fused_configs.py
"""

from __future__ import annotations

import torch
from bench_quantize import device_seconds  # this folder is sys.path[0] when run as a script

import mxcheck
from mxcheck.scaling import mx_cuda

CASES = [("e2m1", dict(scale_rule="even")), ("e4m3", dict(scale_rule="rceil")),
         ("e2m1", dict(scale_rule="even", hadamard="h16x2")),
         ("e2m3", dict(scale_rule="floor", rounding="half_away", hadamard="h32", zero_scale=127))]


def main() -> None:
    x = torch.randn(16384, 3072, device="cuda", dtype=torch.bfloat16)
    floor_ms = device_seconds(lambda: x.clone(), 50) * 1e3  # read + write of the input: a bandwidth yardstick
    print(f"clone of the input (2 x 96 MiB moved): {floor_ms:.4f} ms")
    for fmt, kw in CASES:
        want = mxcheck.mx_quantize(x, fmt, **kw)
        for block in (1024, 2048, 4096, 8192):
            for warps in (2, 4, 8, 16):
                mx_cuda._QUANT_BLOCK, mx_cuda._QUANT_WARPS = block, warps
                try:
                    got = mxcheck.mx_quantize(x, fmt, **kw)
                    same = torch.equal(got.codes, want.codes) and torch.equal(got.scales, want.scales)
                    ms = device_seconds(lambda f=fmt, k=kw: mxcheck.mx_quantize(x, f, **k), 20) * 1e3
                    print(f"{fmt} {kw} block={block} warps={warps}: {ms:.4f} ms same={same}")
                except Exception as e:  # a setting the compiler refuses
                    print(f"{fmt} {kw} block={block} warps={warps}: failed {type(e).__name__}: {str(e)[:80]}")
        mx_cuda._QUANT_BLOCK, mx_cuda._QUANT_WARPS = 2048, 4


if __name__ == "__main__":
    main()
