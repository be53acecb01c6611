"""How many captured FP8 GEMM outputs each candidate accumulation model reproduces bit for bit.

Reads the capture of ``tools/h200/capture_fast_accum.py`` (torch._scaled_mm on an H100, with
and without fast accumulation) and prints, per model and mode, the outputs it reproduces
exactly. The measured rule is ``mxcheck.diagnose.accumulation``.

    python tools/fit_accumulation.py /work/gpu-results/fast_accum/fa.pt.0 ... fa.pt.5
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import torch

from mxcheck.diagnose.accumulation import TensorCoreAccumulation

DTYPES = {"torch.float8_e4m3fn": (torch.float8_e4m3fn, -6), "torch.float8_e5m2": (torch.float8_e5m2, -14)}
MODES = {"fast": "fast", "split": "exact_kernel"}  # capture key of each mode


def operand(codes: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 values in float32 and the exponent a tensor core reads for each (emin for subnormals)."""
    dtype, emin = DTYPES[fmt]
    values = codes.view(dtype).float()
    _, e = torch.frexp(values)
    return values, (e.to(torch.int32) - 1).clamp_min(emin)


def measured_sums(case: dict, key: str) -> torch.Tensor:
    """The kernel's float32 output with the scales divided out (powers of two: exact)."""
    m, n = case["a"].shape[0], case["b"].shape[0]
    sa = case["sa"].reshape(-1, 1).expand(m, 1) if case["sa"].numel() > 1 else case["sa"].reshape(1, 1)
    sb = case["sb"].reshape(1, -1).expand(1, n) if case["sb"].numel() > 1 else case["sb"].reshape(1, 1)
    return case[key]["torch.float32"] / (sa * sb)


def _round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    mantissa, e = torch.frexp(x)
    return torch.ldexp(torch.round(mantissa * 2.0 ** (bits + 1)) / 2.0 ** (bits + 1), e)


def described(va, ea, vb, eb, bits: int = 13, every: int = 128) -> torch.Tensor:
    """The catalogue's model before this capture: chunks of 128 exact products added to a
    running sum rounded to 13 mantissa bits (round to nearest)."""
    da, db = va.double(), vb.double()
    acc = torch.zeros(da.shape[0], db.shape[0], dtype=torch.float64)
    for k in range(0, da.shape[1], every):
        acc = _round_mantissa(acc + da[:, k:k + every] @ db[:, k:k + every].T, bits)
    return acc.float()


def float32_once(va, ea, vb, eb) -> torch.Tensor:
    """The exact sum rounded once to float32 (any fp32 accumulation is within K ulps of it)."""
    return (va.double() @ vb.double().T).float()


Model = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
CANDIDATES: dict[str, tuple[str, Model]] = {
    "exact sum, rounded once to float32": ("both", float32_once),
    "13 bits RNE every 128 exact products (described)": ("both", described),
    **{f"k-step {g}, {f} bits, truncate, no promotion": ("fast", TensorCoreAccumulation(g, f).sum_of_values)
       for g, f in ((16, 13), (32, 12), (32, 13), (32, 14), (64, 13))},
    **{f"k-step 32, 13 bits, float32 promotion every {p}": ("split", TensorCoreAccumulation(32, 13, p).sum_of_values)
       for p in (64, 128, 256)},
}


def cases(paths: list[str]) -> Iterator[dict]:
    for path in paths:
        yield from torch.load(path, weights_only=False)["cases"]


def main(paths: list[str]) -> None:
    counts: dict[tuple[str, str], int] = {}
    total = 0
    for case in cases(paths):
        va, ea = operand(case["a"], case["fmt_a"])
        vb, eb = operand(case["b"], case["fmt_b"])
        total += case["a"].shape[0] * case["b"].shape[0]
        for name, (modes, model) in CANDIDATES.items():
            got = model(va, ea, vb, eb)
            for mode, key in MODES.items():
                if modes in ("both", mode):
                    same = got.view(torch.int32) == measured_sums(case, key).view(torch.int32)
                    counts[name, mode] = counts.get((name, mode), 0) + int(same.sum())
    print(f"| model | mode | outputs reproduced bit for bit (of {total:,}) |\n|---|---|---|")
    for (name, mode), n in counts.items():
        print(f"| {name} | {mode} | {n:,} |")


if __name__ == "__main__":
    main(sys.argv[1:])
