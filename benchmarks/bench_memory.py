"""Peak memory of each quantizer beyond its input, against the goal (issue 15: <= 2.0x).

    python benchmarks/bench_memory.py [--device cpu|cuda] [--rows 8192 --cols 3072]

The figure is (peak memory while quantizing - memory before) / (the input's float32 size),
for a bf16 input: codes, scales and every temporary count; the input does not. On CUDA it
is ``torch.cuda.max_memory_allocated`` (the caching allocator's live bytes). On a CPU each
case runs in its own child process, which reads its resident set before the call and its
peak (``ru_maxrss``) after: a fresh process has no earlier peak to hide this one, and a
warm-up on a small tensor loads the code and tables first. The resident set also holds what
the C allocator keeps of freed temporaries, so on a CPU each case also reports the peak of
the bytes torch's tensors hold at once (``live_peak``: torch.profiler's memory events,
allocations minus frees in time order). Not a test: numbers go to benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

import torch

GOAL = 2.0
# name -> (function, kwargs); mx_quantize's element formats at the rules the recipes use.
# ``"rand": "uint8"``: SR bits shaped like the input, made before the measure (an input too).
CASES = {
    "mx e2m1 floor": ("mx", {"fmt": "e2m1"}),
    "mx e2m1 even": ("mx", {"fmt": "e2m1", "scale_rule": "even"}),
    "mx e2m1 even 32x32 (mxfp4 weight)": ("mx", {"fmt": "e2m1", "scale_rule": "even", "block_2d": True}),
    "mx e2m3 floor": ("mx", {"fmt": "e2m3"}),
    "mx e2m3 half_away h32 (mxfp6)": ("mx", {"fmt": "e2m3", "rounding": "half_away", "hadamard": "h32",
                                             "zero_scale": 127}),
    "mx e4m3 floor": ("mx", {"fmt": "e4m3"}),
    "mx e4m3 rceil (mxfp8)": ("mx", {"fmt": "e4m3", "scale_rule": "rceil"}),
    "nvfp4": ("nvfp4", {}),
    "nvfp4 16x16": ("nvfp4", {"block_2d": True}),
    "nvfp4 sr (gradients)": ("nvfp4", {"rand": "uint8"}),
    "nvfp4 rht sr (g_col)": ("nvfp4", {"hadamard": "h16_te", "rand": "uint8"}),
    "fp8 e4m3 tensor": ("fp8", {"fmt": "e4m3"}),
    "fp8 e4m3 row": ("fp8", {"fmt": "e4m3", "granularity": "row"}),
    "fp8 e4m3 block1x128": ("fp8", {"fmt": "e4m3", "granularity": "block1x128"}),
}


def _quantizer(kind: str):
    import mxcheck

    return {"mx": mxcheck.mx_quantize, "nvfp4": mxcheck.nvfp4_quantize, "fp8": mxcheck.fp8_quantize}[kind]


def _with_rand(kw: dict, x: torch.Tensor, g: torch.Generator) -> dict:
    """kw with SR bits shaped like x where the case asks for them (``"rand": "uint8"``)."""
    if kw.get("rand") != "uint8":
        return kw
    return {**kw, "rand": torch.randint(0, 256, x.shape, device=x.device, generator=g, dtype=torch.uint8)}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def measure(case: str, rows: int, cols: int, device: str) -> dict:
    """Quantize one bf16 (rows, cols) input as ``case`` says; bytes beyond the input."""
    kind, kw = CASES[case]
    fn = _quantizer(kind)
    g = torch.Generator(device=device).manual_seed(0)
    small = torch.randn(64, 256, device=device, generator=g, dtype=torch.bfloat16)
    fn(small, **_with_rand(kw, small, g))  # warm-up
    x = torch.randn(rows, cols, device=device, generator=g, dtype=torch.bfloat16)
    kw = _with_rand(kw, x, g)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        q = fn(x, **kw)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        before = _rss_bytes()
        earlier_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        q = fn(x, **kw)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
        if earlier_peak > before + peak:  # an earlier peak would hide this one
            raise RuntimeError(f"{case}: the peak before the call ({earlier_peak} B) hides the call's")
        live = _live_peak_bytes(lambda: fn(x, **kw))
    del q
    ratio = peak / (x.numel() * 4)
    row = {"case": case, "rows": rows, "cols": cols, "device": device, "peak_beyond_input_bytes": peak,
           "ratio_to_f32_input": round(ratio, 3), "goal": GOAL, "met": ratio <= GOAL}
    if device == "cpu":
        row["live_peak_ratio_to_f32_input"] = round(live / (x.numel() * 4), 3)
    return row


def _live_peak_bytes(call) -> int:
    """The most bytes torch's tensors made during call hold at once (the profiler's memory
    events: + on allocation, - on free, in time order)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--cols", type=int, default=3072)
    p.add_argument("--cases", nargs="+", default=list(CASES), metavar="CASE", choices=list(CASES))
    p.add_argument("--json", help="write the results here too")
    p.add_argument("--child", help=argparse.SUPPRESS)  # one case, in a fresh process (CPU)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.rows, args.cols, args.device)))
        return
    results = []
    for case in args.cases:
        if args.device == "cuda":
            r = measure(case, args.rows, args.cols, args.device)
        else:
            out = subprocess.run([sys.executable, __file__, "--device", "cpu", "--rows", str(args.rows),
                                  "--cols", str(args.cols), "--child", case],
                                 check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
        results.append(r)
        live = (f"; tensors alive at once {r['live_peak_ratio_to_f32_input']:.2f}x"
                if "live_peak_ratio_to_f32_input" in r else "")
        print(f"{case:36s} {r['ratio_to_f32_input']:6.2f}x the float32 input beyond it "
              f"(goal <= {GOAL}) {'met' if r['met'] else 'NOT MET'}{live}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
