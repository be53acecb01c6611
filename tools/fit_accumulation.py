"""How many captured FP8 GEMM outputs each candidate accumulation model reproduces bit for bit.

Reads the capture of ``tools/h200/capture_fast_accum.py`` (torch._scaled_mm on an H100, with
and without fast accumulation) and prints, per model and mode, the outputs it reproduces
exactly. The measured rule is ``mxcheck.diagnose.accumulation``.

    python tools/fit_accumulation.py /work/gpu-results/fast_accum/fa.pt.0 ... fa.pt.5
    python tools/fit_accumulation.py --check PATHS...   # what the conformance GEMM check says
    python tools/fit_accumulation.py --cut references/vectors/hopper_fp8_accumulation_h100.json PATHS...
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator

import torch

from mxcheck.diagnose.accumulation import TensorCoreAccumulation
from mxcheck.diagnose.outputs import (
    GEMM_BEHAVIOURS,
    exact_and_bound,
    outside_bound,
    reproduced_by_split_accumulation,
)
from mxcheck.formats import get_format
from mxcheck.scaling import FP8Tensor

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


def fp8_tensor(case: dict, side: str) -> FP8Tensor:
    """One captured operand as the oracle's FP8Tensor (scale_inv () or (rows, 1))."""
    codes, inv = case[side], case["s" + side].float()
    fmt = get_format("e5m2" if "e5m2" in case["fmt_" + side] else "e4m3")
    inv = inv.reshape(()) if inv.numel() == 1 else inv.reshape(-1, 1)
    return FP8Tensor(codes, inv, fmt, "tensor" if inv.dim() == 0 else "row", 1 / inv, inv * 0)


def check(paths: list[str]) -> None:
    """Per mode: outputs outside the fp32-accumulation bound, those the check still rejects
    after accepting Hopper's split accumulation, and those the fast-accumulation behaviour names."""
    fast_model = next(b for b in GEMM_BEHAVIOURS if b.key == "gemm-reduced-accumulation").run
    counts = dict.fromkeys(("outputs", "fast outside", "fast rejected", "fast named", "split outside",
                            "split rejected"), 0)
    for case in cases(paths):
        a, b = fp8_tensor(case, "a"), fp8_tensor(case, "b")
        exact, bound = exact_and_bound(a, b)
        counts["outputs"] += exact.numel()
        for mode, key in MODES.items():
            got = case[key]["torch.float32"]
            bad = outside_bound(got, exact, bound)
            counts[f"{mode} outside"] += int(bad.sum())
            if bad.any():
                bad &= ~reproduced_by_split_accumulation(got, a, b)
            counts[f"{mode} rejected"] += int(bad.sum())
            if mode == "fast" and bad.any():
                named = fast_model(a, b, out_dtype=torch.float32).view(torch.int32) == got.view(torch.int32)
                counts["fast named"] += int((bad & named).sum())
    print(counts)


# The committed fixture: (k, m, n, family, granularity, fmt_a) of a captured case, and the
# rows of a and of b kept (an output depends only on its row of a and its row of b).
CUTS = ((16, 32, 64, "heavy", "tensor", "torch.float8_e4m3fn", (28,), (9, 26, 27)),  # subnormal elements' emin
        (48, 200, 32, "heavy", "tensor", "torch.float8_e5m2", range(0, 3), range(0, 4)),
        (144, 13, 64, "cancel", "row", "torch.float8_e4m3fn", range(0, 3), range(0, 4)),
        (384, 64, 128, "randn", "tensor", "torch.float8_e4m3fn", range(0, 2), range(0, 4)),
        (640, 1, 128, "same_sign", "tensor", "torch.float8_e4m3fn", range(0, 1), range(0, 4)))


def cut(out: str, paths: list[str]) -> None:
    """Write CUTS as JSON: codes in hex, scale_inv and outputs as float32 bit patterns."""
    def bits(t: torch.Tensor) -> list[str]:
        return [f"{v & 0xFFFFFFFF:08x}" for v in t.float().contiguous().view(torch.int32).flatten().tolist()]
    kept = []
    for case in cases(paths):
        for k, m, n, family, gran, fmt_a, rows_a, rows_b in CUTS:
            if (case["k"], case["m"], case["n"], case["family"], case["granularity"], case["fmt_a"]) != (
                    k, m, n, family, gran, fmt_a):
                continue
            ia, ib = list(rows_a), list(rows_b)
            sa = case["sa"][ia] if case["sa"].numel() > 1 else case["sa"]
            sb = case["sb"][ib] if case["sb"].numel() > 1 else case["sb"]
            kept.append({"k": k, "family": family, "granularity": gran, "fmt_a": fmt_a, "fmt_b": case["fmt_b"],
                         "a": [bytes(r).hex() for r in case["a"][ia].tolist()],
                         "b": [bytes(r).hex() for r in case["b"][ib].tolist()],
                         "scale_inv_a": bits(sa), "scale_inv_b": bits(sb),
                         **{mode: bits(case[key]["torch.float32"][ia][:, ib]) for mode, key in MODES.items()}})
    facts = torch.load(paths[0], weights_only=False)["facts"]
    with open(out, "w") as f:
        json.dump({"source": "torch._scaled_mm on the device below, tools/h200/capture_fast_accum.py; rows cut "
                             "by tools/fit_accumulation.py --cut", "facts": facts, "cases": kept}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        check(sys.argv[2:])
    elif sys.argv[1] == "--cut":
        cut(sys.argv[2], sys.argv[3:])
    else:
        main(sys.argv[1:])
