"""Where an emulated training step makes the host wait for the GPU, per recipe (CUDA only).

A synchronizing call (a device-to-host read, a copy from pageable host memory, ``.item()``,
``nonzero``) drains the GPU's queue: the host, which runs ahead of the GPU in a step that
is bound by it, then waits for every kernel queued before. torch's sync debug mode warns at
each; this counts them by the innermost mxcheck line that made them (and prints that
line's call path once).

    python benchmarks/find_syncs.py --recipes mxfp4 mxfp8 fp8 nvfp4
"""

from __future__ import annotations

import argparse
import collections
import traceback
import warnings

import torch
from bench_training_step import make_step  # this folder is sys.path[0] when run as a script

from mxcheck.training import TrainConfig


def syncs_of(step) -> collections.Counter:
    """Counter of (mxcheck frame, call path) for each synchronizing call one step makes."""
    found: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "/mxcheck/" in f.filename]
        where = f"{frames[-1].filename.split('/mxcheck/')[-1]}:{frames[-1].lineno}" if frames else "(outside mxcheck)"
        path = " <- ".join(f"{f.name}:{f.lineno}" for f in reversed(frames[-6:]))
        found[(where, path)] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipes", nargs="+", default=["mxfp4", "mxfp8", "fp8", "nvfp4"])
    args = p.parse_args()
    cfg = TrainConfig(model="flux-535m", samples=4, img_tokens=1024, txt_tokens=256, device="cuda")
    for recipe in [None, *args.recipes]:
        step = make_step(cfg, recipe, "emulated")
        step()
        step()
        torch.cuda.synchronize()
        found = syncs_of(step)
        print(f"== {recipe or 'bf16'}: {sum(found.values())} synchronizing calls in one step", flush=True)
        for (where, path), n in found.most_common():
            print(f"{n:5d}  {where}    {path}")
        del step


if __name__ == "__main__":
    main()
