"""Where the host's time goes in one emulated training step (cProfile), per recipe.

The H200 step is bound by the host (``bench_training_step.py --profile`` shows self CPU
about equal to the step); this lists the Python functions that take it.

    python benchmarks/profile_host.py --device cuda --recipes mxfp4 mxfp8 [--top 35]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

from bench_quantize import _sync  # this folder is sys.path[0] when run as a script
from bench_training_step import make_step

from mxcheck.training import TrainConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--recipes", nargs="+", default=["mxfp4"])
    p.add_argument("--top", type=int, default=35)
    args = p.parse_args()
    cfg = TrainConfig(model="flux-535m", samples=4, img_tokens=1024, txt_tokens=256, device=args.device)
    for recipe in args.recipes:
        step = make_step(cfg, recipe, "emulated")
        for _ in range(3):
            step()
        _sync(args.device)
        prof = cProfile.Profile()
        prof.enable()
        step()
        _sync(args.device)
        prof.disable()
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(r"mxcheck", args.top)
        print(f"== {recipe}\n{out.getvalue()}")


if __name__ == "__main__":
    main()
