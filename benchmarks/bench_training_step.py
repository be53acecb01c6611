"""An emulated training step per recipe against the same step in plain bf16, same process.

    python benchmarks/bench_training_step.py --device cuda [--recipes mxfp4 mxfp8 fp8]
        [--backend emulated] [--profile 25] [--json out.json]

The step is the convergence tests' step (``mxcheck.training``): Flux flux-535m (1 double +
1 single block, hidden 3072), 4 samples of 1024 image + 256 text tokens (4 x 1280 tokens),
bf16 compute, forward, backward, then AdamW on an FP32 master copy and the copy back. The
baseline is the same model with nn.Linear (no recipe). Every model is built first; then
``--rounds`` rounds time bf16 and each recipe in turn (a median of ``--steps`` steps after
two each). A recipe's ratio is the median over rounds of its time / that round's bf16 time
(issue 15 goal: <= 1.5x); each round's ratio is printed too. Every model, its FP32 master and
AdamW state live at once (about 9 GB each for flux-535m): on a small CPU machine pass
``--model flux-small`` or fewer ``--recipes``.
``--profile N`` prints torch.profiler's N most expensive ops (self device time on CUDA,
self CPU time on a CPU) of one step per recipe: where the step's extra time goes.
``--cuda-graph`` captures every step (bf16's too) as a CUDA graph
(``mxcheck.training.CUDAGraphStep``) and replays it: the host's Python, dispatch and
launches leave the step (what stays is drawing t and noise on the CPU and copying them), so
the ratio is the device's arithmetic; the eager ratio is what a user running the emulation
without graphs sees.
``--compile-quantizers`` is an experiment, not a supported mode: it wraps the quantizers
the emulated GEMMs call in ``torch.compile`` (one graph per shape) to measure what fusing
their elementwise passes would give, and reports whether the first step's loss and every
gradient are bit-identical to the eager step's. Not a test: numbers go to
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from bench_quantize import _sync, median_seconds  # this folder is sys.path[0] when run as a script

from mxcheck.training import (
    CUDAGraphStep,
    MasterWeights,
    TrainConfig,
    _dataset,
    flow_matching_loss,
    make_model,
)

GOAL = 1.5


def make_step(cfg: TrainConfig, recipe: str | None, backend: str, cuda_graph: bool = False):
    """One training step on its own model, data and generators (the model is built here);
    ``cuda_graph``: the step captured as a CUDA graph (``mxcheck.training.CUDAGraphStep``,
    AdamW capturable), replayed per call."""
    model = make_model(cfg, recipe, backend)
    master = MasterWeights(model, lambda ps: torch.optim.AdamW(ps, lr=cfg.lr, betas=cfg.betas, capturable=cuda_graph))
    data = _dataset(cfg)
    gen = torch.Generator().manual_seed(cfg.seed + 2)
    if cuda_graph:
        return CUDAGraphStep(model, master, data, gen)

    def step() -> None:
        flow_matching_loss(model, data, gen).backward()
        master.step()

    return step


def first_grads(cfg: TrainConfig, recipe: str, backend: str) -> list[torch.Tensor]:
    """The loss and every gradient of a fresh model's first step (fixed seeds)."""
    model = make_model(cfg, recipe, backend)
    torch.manual_seed(cfg.seed + 3)  # stochastic-rounding recipes draw from the default stream
    loss = flow_matching_loss(model, _dataset(cfg), torch.Generator().manual_seed(cfg.seed + 2))
    loss.backward()
    return [loss.detach()] + [p.grad for p in model.parameters() if p.grad is not None]


def compile_quantizers() -> None:
    """Swap the quantizers mxcheck.gemm calls for torch.compile'd ones (the experiment)."""
    import mxcheck.gemm as gemm

    torch._dynamo.config.cache_size_limit = 64  # one graph per operand shape and option set
    for name in ("mx_quantize", "nvfp4_quantize", "fp8_quantize"):
        setattr(gemm, name, torch.compile(getattr(gemm, name), dynamic=False))


def host_seconds(step, device: str, repeat: int) -> float:
    """Median time for ``step()`` to return with the device idle at its start: the host's
    share (Python, dispatch, launches, any wait for the device). Near the synchronized time
    the step is bound by the host; well under it, by the device."""
    times = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    _sync(device)
    return statistics.median(times)


def profile_step(step, device: str, top: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        _sync(device)
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=top, max_name_column_width=70)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="flux-535m")
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--img-tokens", type=int, default=1024)
    p.add_argument("--txt-tokens", type=int, default=256)
    p.add_argument("--recipes", nargs="+", default=["mxfp4", "mxfp8", "fp8", "nvfp4"])
    p.add_argument("--backend", default="emulated")
    p.add_argument("--steps", type=int, default=10, help="steps timed per round (their median)")
    p.add_argument("--rounds", type=int, default=3, help="rounds over bf16 and every recipe, interleaved")
    p.add_argument("--profile", type=int, default=0, help="print the N most expensive ops per recipe")
    p.add_argument("--compile-quantizers", action="store_true", help="the experiment above")
    p.add_argument("--cuda-graph", action="store_true",
                   help="every step (bf16's too) captured as a CUDA graph and replayed: the device's share")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args()
    cfg = TrainConfig(model=args.model, samples=args.samples, img_tokens=args.img_tokens,
                      txt_tokens=args.txt_tokens, device=args.device)
    eager = {}
    if args.compile_quantizers:
        eager = {r: first_grads(cfg, r, args.backend) for r in args.recipes}
        compile_quantizers()
    # Every step is built first and the rounds interleave them (bf16, then each recipe), so a
    # drift of the machine during the run moves the baseline with the recipes; a round's
    # ratio is against that round's bf16.
    names = ["bf16", *args.recipes]
    steps = {name: make_step(cfg, None if name == "bf16" else name, args.backend, args.cuda_graph) for name in names}
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name in names:
            per_round[name].append(median_seconds(steps[name], args.device, args.steps) * 1e3)
    host_ms = {name: host_seconds(steps[name], args.device, args.steps) * 1e3 for name in names}
    rows = []
    for name in names:
        ratios = [ms / base for ms, base in zip(per_round[name], per_round["bf16"], strict=True)]
        ms, ratio = statistics.median(per_round[name]), statistics.median(ratios)
        row = {"recipe": name, "backend": args.backend if name != "bf16" else "nn.Linear",
               "mode": "cuda graph" if args.cuda_graph else "eager", "ms": round(ms, 2),
               "ratio": round(ratio, 3), "round_ms": [round(t, 2) for t in per_round[name]],
               "round_ratios": [round(r, 3) for r in ratios],
               "host_ms": round(host_ms[name], 2), "goal": GOAL if name != "bf16" else None}
        if name in eager:
            same = all(torch.equal(a, b) for a, b in zip(eager.pop(name), first_grads(cfg, name, args.backend),
                                                         strict=True))
            row["compiled_quantizers_bit_identical"] = same
            print(f"{name}: compiled quantizers give the eager step's loss and gradients bit for bit: {same}")
        rows.append(row)
        print(f"{name:12s} {row['backend']:10s} {ms:9.2f} ms  {ratio:5.2f}x   rounds: "
              + " ".join(f"{r:.2f}" for r in ratios) + f"   host {host_ms[name]:.2f} ms", flush=True)
        if args.profile:
            print(profile_step(steps[name], args.device, args.profile), flush=True)
    if args.json:
        env = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "environment": env, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
