"""Hold mxcheck's model of Hopper FP8 accumulation (mxcheck.diagnose.accumulation) to a fresh
torch._scaled_mm capture on this device, then run torchao's fp8 edge shapes through the
conformance suite and count the GEMM outputs it leaves unexplained.

    PYTHONPATH=/tmp/tao:. python3 tools/h200/verify_fast_accum.py $OUT

Part 1 draws new operands (another seed than capture_fast_accum.py), with power-of-two
scales as the capture had and with scales that are not powers of two (which tell the order
the epilogue multiplies in), float32 and bfloat16 outputs, and prints, per mode, how many
outputs the model reproduces bit for bit. Part 2 runs

    python3 -m pytest -p mxcheck.plugin -m "cuda or emulated" --pyargs mxcheck.conformance.suite
        -k edge --mxcheck-backend torchao

and sums, over its failures, the GEMM outputs outside the bound and those no behaviour
reproduces; then the same with --mxcheck-backend torch -k "edge or gemm" (torch._scaled_mm
without fast accumulation, which the check used to fail). Part 0 runs tests/test_accumulation.py's sm90 test (torch._scaled_mm against the
model on this device). Writes $OUT/verify_fast_accum.{log,json}.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from importlib.metadata import entry_points
from pathlib import Path

import torch

from mxcheck.diagnose.accumulation import (
    EPILOGUES,
    HOPPER_FAST_ACCUMULATION,
    HOPPER_SPLIT_ACCUMULATION,
)
from mxcheck.formats import get_format
from mxcheck.scaling import FP8Tensor

# The plugin by name where mxcheck is only on PYTHONPATH; an installed one registers itself
# through its pytest11 entry point (naming it again is an error).
PLUGIN = () if any(e.value.startswith("mxcheck") for e in entry_points(group="pytest11")) else ("-p", "mxcheck.plugin")
KS = (16, 96, 128, 144, 256, 384, 1008, 4096)  # 1008: a K off the 32-product k-step
MN = ((64, 128), (13, 64), (1, 256))
MODELS = {True: HOPPER_FAST_ACCUMULATION, False: HOPPER_SPLIT_ACCUMULATION}
TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _operand(gen: torch.Generator, rows: int, k: int, fmt: str, granularity: str, pow2: bool) -> FP8Tensor:
    x = torch.randn(rows, k, generator=gen) * torch.exp2(torch.randint(-6, 6, (rows, k), generator=gen).float())
    x = x / x.abs().amax() * 200
    codes = x.to(TORCH_FP8[fmt]).view(torch.uint8)
    shape = () if granularity == "tensor" else (rows, 1)
    inv = torch.rand(shape, generator=gen) + 0.5
    inv = torch.exp2(inv.log2().round()) if pow2 else inv
    return FP8Tensor(codes, inv, get_format(fmt), granularity, 1 / inv, torch.zeros_like(inv))


def _scaled_mm(a: FP8Tensor, b: FP8Tensor, out_dtype: torch.dtype, fast: bool) -> torch.Tensor:
    ca = a.codes.cuda().view(TORCH_FP8[a.fmt.name])
    cb = b.codes.cuda().view(TORCH_FP8[b.fmt.name])
    sa, sb = a.scale_inv.cuda().float(), b.scale_inv.cuda().float()
    if a.granularity == "row":
        sb = sb.reshape(1, -1)
    return torch._scaled_mm(ca, cb.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype, use_fast_accum=fast).cpu()


def _ones(q: FP8Tensor) -> FP8Tensor:
    return replace(q, scale_inv=torch.ones_like(q.scale_inv))


def capture(log: list[str]) -> dict:
    gen = torch.Generator().manual_seed(42)
    tally: dict[str, list[int]] = {}
    for k in KS:
        for m, n in MN:
            for granularity, fmts in (("tensor", ("e4m3", "e4m3")), ("tensor", ("e5m2", "e4m3")), ("row", ("e4m3", "e4m3"))):
                for pow2 in (True, False):
                    a = _operand(gen, m, k, fmts[0], granularity, pow2)
                    b = _operand(gen, n, k, fmts[1], granularity, pow2)
                    sa, sb = a.scale_inv.float().reshape(-1, 1), b.scale_inv.float().reshape(1, -1)
                    for fast, model in MODELS.items():
                        total = model(_ones(a), _ones(b), out_dtype=torch.float32)  # the sum before the epilogue
                        for out_dtype in (torch.float32, torch.bfloat16):
                            try:
                                got = _scaled_mm(a, b, out_dtype, fast)
                            except RuntimeError as e:
                                log.append(f"K={k} M={m} N={n} {granularity} {out_dtype}: {str(e)[:120]}")
                                continue
                            ints = torch.int16 if out_dtype == torch.bfloat16 else torch.int32
                            for order, epilogue in EPILOGUES.items():
                                want = epilogue(total, sa, sb).to(out_dtype)
                                same = int((want.view(ints) == got.view(ints)).sum())
                                key = (f"{'fast' if fast else 'split'} {granularity} "
                                       f"{'pow2' if pow2 else 'any'}-scales {str(out_dtype)[6:]} {order}")
                                t = tally.setdefault(key, [0, 0])
                                t[0] += same
                                t[1] += got.numel()
    for key, (same, total) in sorted(tally.items()):
        log.append(f"model vs _scaled_mm, {key}: {same:,} of {total:,} outputs bit for bit")
    return {key: {"same": s, "total": t} for key, (s, t) in tally.items()}


def conformance(log: list[str], out: Path, backend: str, select: str) -> dict:
    cmd = [sys.executable, "-m", "pytest", *PLUGIN, "-m", "cuda or emulated", "--pyargs",
           "mxcheck.conformance.suite", "-k", select, "--mxcheck-backend", backend, "-p", "no:cacheprovider",
           "-rN"]  # -rN: each failure message once (no short summary to count twice)
    run = subprocess.run(cmd, capture_output=True, text=True)
    text = run.stdout + run.stderr
    (out / f"verify_fast_accum_pytest_{backend}.log").write_text(text)
    outside = sum(int(n.replace(",", "")) for n in re.findall(r"fp32-accumulation bound of the exact GEMM; ([\d,]+) of", text))
    total = sum(int(n.replace(",", "")) for n in re.findall(r"bound of the exact GEMM; [\d,]+ of ([\d,]+) outputs", text))
    unexplained = sum(int(n.replace(",", "")) for n in
                      re.findall(r"([\d,]+) of [\d,]+ differing outputs are reproduced by no known", text))
    named = re.findall(r"differing outputs are reproduced by: ([^(]+)", text)
    summary = text.strip().splitlines()[-1] if text.strip() else ""
    log += [f"conformance --mxcheck-backend {backend} -k {select!r} (exit {run.returncode}): {summary}",
            f"edge GEMM outputs outside the fp32 bound (and not Hopper's split accumulation): {outside:,} of "
            f"{total:,} in failing checks; unexplained: {unexplained:,}",
            *(f"  named: {t.strip()}" for t in sorted(set(named)))]
    return {"exit": run.returncode, "summary": summary, "outside": outside, "total": total,
            "unexplained": unexplained, "named": sorted(set(t.strip() for t in named))}


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    log = [f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}, "
           f"sm{''.join(map(str, torch.cuda.get_device_capability()))}"]
    device_test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-m", "sm90", *PLUGIN,
                                  "-p", "no:cacheprovider", "tests/test_accumulation.py"], capture_output=True, text=True)
    log.append(f"tests/test_accumulation.py -m sm90 (exit {device_test.returncode}): "
               f"{(device_test.stdout.strip().splitlines() or [''])[-1]}")
    result = {"facts": log[0], "capture": capture(log), "conformance": conformance(log, out, "torchao", "edge"),
              # torch._scaled_mm without fast accumulation: the false failure of docs/findings.md
              "conformance_torch": conformance(log, out, "torch", "edge or gemm"),
              "device_test_exit": device_test.returncode}
    (out / "verify_fast_accum.log").write_text("\n".join(log) + "\n")
    (out / "verify_fast_accum.json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(log))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
