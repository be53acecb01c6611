"""Measure the SNR margin distribution of every seeded SNR check over many seeds.

An SNR floor on seeded random data passes or fails deterministically per seed, so its
false-failure probability per run is P(margin < 0) over the seed. This script calls each
check's own function (the test function, or the conformance check) directly, once per
seed, with a recorder in place of the ``numerics`` fixture, and prints per comparison the
margin (SNR - floor) mean, standard deviation, minimum and z = mean / sd. Under a normal
model of the margin, P(fail) = Phi(-z); ``mxcheck.false_failure`` stores these numbers.

    PYTHONPATH=$PWD .venv/bin/python tools/flake_margins.py --seeds 200 [--only linear,mx]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.conformance import CHECKS, DEFAULT_RECIPES
from mxcheck.conformance.edges import EDGE_SHAPES, edge_shape_outcome
from mxcheck.metrics import snr_db
from mxcheck.recipes import RECIPES, get_recipe
from tests import test_fp8, test_functions, test_mx, test_nvfp4


class Recorder:
    """Stands in for the ``numerics`` fixture: records SNR comparisons, never raises."""

    def __init__(self, out: list[tuple[str, float, float]], ctx: dict[str, Any] | None = None) -> None:
        self.out, self.ctx = out, ctx or {}

    def context(self, **fields: Any) -> Recorder:
        return Recorder(self.out, {**self.ctx, **fields})

    def snr(self, test: torch.Tensor, ref: torch.Tensor, threshold_db: float) -> SimpleNamespace:
        key = "/".join(str(self.ctx[k]) for k in ("recipe", "layer", "direction") if self.ctx.get(k) is not None)
        self.out.append((key, snr_db(test, ref), float(threshold_db)))
        return SimpleNamespace(snr_db=self.out[-1][1])

    def bitwise(self, test: torch.Tensor, ref: torch.Tensor, fmt: Any = None) -> None:
        if not torch.equal(test.view(torch.uint8) if test.dtype == torch.bool else test, ref):
            raise AssertionError(f"bitwise check failed at {self.ctx}")

    def nonzero_grads(self, params: Any, **_: Any) -> None:
        return None


def _hadamard_pair(g: torch.Generator, n: Recorder) -> None:
    """test_mxfp4_wgrad_hadamard_pair_cancels, and its |SNR with H - SNR without| < 2 dB as a
    margin 2 - |difference| over a floor of 0."""
    try:
        test_functions.test_mxfp4_wgrad_hadamard_pair_cancels(g, n)
    except AssertionError:
        pass  # the difference is recorded below
    (_, with_h, _), (_, plain, _) = n.out[-2:]
    n.out.append(("|difference| under 2 dB", 2.0 - abs(with_h - plain), 0.0))


def _cases() -> dict[str, list[tuple[str, Callable[[torch.Generator, Recorder], Any]]]]:
    recipes = list(DEFAULT_RECIPES)
    return {
        "linear": [(r, lambda g, n, r=r: CHECKS["linear"](EmulatedBackend(), get_recipe(r), g, n)) for r in recipes],
        "edge": [(f"{r}-{s}", lambda g, n, r=r, s=s: edge_shape_outcome(EmulatedBackend(), get_recipe(r), s, g, n))
                 for r in recipes for s in EDGE_SHAPES],
        "functions": [(r, lambda g, n, r=r: test_functions.test_each_recipe_reaches_its_snr_floor_against_float64_truth(
            r, g, n)) for r in RECIPES],
        "mlp": [("mxfp6", lambda g, n: test_functions.test_fused_mlp_is_close_to_float64_truth(g, n))],
        "hpair": [("mxfp4", _hadamard_pair)],
        "mx": [(f"{f}-{r}", lambda g, n, f=f, r=r: test_mx.test_snr_of_gaussian_data_clears_its_floor(f, r, g, n))
               for f in ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2") for r in test_mx.RULES],
        "fp8": [(f"{f}-{gr}", lambda g, n, f=f, gr=gr: test_fp8.test_dequantize_is_value_times_scale_inv_and_beats_snr_floor(
            f, gr, g, n)) for f in test_fp8.FP8_FORMATS for gr in ("tensor", "row", "block1x128", "block128x128")],
        "nvfp4": [(m, lambda g, n, m=m: test_nvfp4.test_snr_against_float64_input_is_above_the_measured_floor(m, g, n))
                  for m in test_nvfp4.SNR_FLOORS],
    }


def measure(group: str, seeds: int) -> Iterator[tuple[str, list[float], float]]:
    margins: dict[str, list[float]] = defaultdict(list)
    floors: dict[str, float] = {}
    for param, fn in _cases()[group]:
        for seed in range(seeds):
            out: list[tuple[str, float, float]] = []
            fn(torch.Generator().manual_seed(1_000_003 * seed + 17), Recorder(out))
            for key, snr, floor in out:
                margins[f"{group}:{param}:{key}"].append(snr - floor)
                floors[f"{group}:{param}:{key}"] = floor
    for key, m in margins.items():
        yield key, m, floors[key]


def summary(margins: list[float]) -> dict[str, float]:
    finite = [m for m in margins if math.isfinite(m)]
    n = len(margins)
    if len(finite) < n:  # an infinite SNR (bit-identical) cannot fail
        return {"n": n, "mean": math.inf, "sd": 0.0, "min": min(margins), "z": math.inf}
    mean = sum(finite) / n
    sd = math.sqrt(sum((m - mean) ** 2 for m in finite) / (n - 1))
    return {"n": n, "mean": mean, "sd": sd, "min": min(finite), "z": mean / sd if sd else math.inf}


def _family_key(key: str) -> tuple[str, tuple[str, ...]] | None:
    """'linear:mxfp4:mxfp4/vs float64 truth/fwd' -> ('linear', ('mxfp4', 'fwd')); None for
    comparisons that are not held to a floor on seeded data (vs the reference Function)."""
    family, param, rest = key.split(":", 2)
    direction = rest.rsplit("/", 1)[-1]
    if "vs reference" in rest or family == "edge":
        return None
    if family == "hpair":
        return family, (rest.split("/")[0],)
    if family in ("linear", "functions"):
        return family, (param, direction)
    if family in ("mx", "fp8"):
        return family, tuple(param.split("-", 1))
    return family, (param,)


def emit(paths: list[Path]) -> None:
    rows = {k: v for path in paths for k, v in json.loads(path.read_text()).items()}
    by_family: dict[str, list[str]] = defaultdict(list)
    for key, r in sorted(rows.items()):
        fk = _family_key(key)
        if fk is None:
            if math.isfinite(r["mean"]):
                print(f"# NOT EXACT: {key} {r}")
            continue
        snr = [r[f] + r["floor"] if f != "sd" else r[f] for f in ("mean", "sd", "min")]
        by_family[fk[0]].append(f"        {fk[1]!r}: MeasuredSNR({snr[0]:.3f}, {snr[1]:.3f}, {snr[2]:.3f}, {r['n']}),")
    print("MEASURED_SNR: dict[str, dict[tuple[str, ...], MeasuredSNR]] = {")
    for family, lines in by_family.items():
        print(f"    {family!r}: {{")
        print("\n".join(lines))
        print("    },")
    print("}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=200)
    p.add_argument("--only", default="linear,edge,functions,hpair,mlp,mx,fp8,nvfp4")
    p.add_argument("--json", type=Path)
    p.add_argument("--emit", type=Path, nargs="*", help="print MEASURED_SNR for mxcheck/false_failure.py "
                   "from earlier --json files, and measure nothing")
    args = p.parse_args()
    if args.emit:
        emit(args.emit)
        return
    torch.set_num_threads(1)
    rows = {}
    for group in args.only.split(","):
        t0 = time.time()
        for key, margins, floor in measure(group, args.seeds):
            s = summary(margins)
            rows[key] = {**s, "floor": floor}
            print(f"{key:70s} floor {floor:5.1f} n {s['n']:4d} mean {s['mean']:7.3f} sd {s['sd']:6.3f} "
                  f"min {s['min']:7.3f} z {s['z']:8.1f}", flush=True)
        print(f"# {group}: {time.time() - t0:.0f}s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
