"""mxcheck inside a training job: ``torchrun --nproc-per-node 2 -m mxcheck.distributed_check
--recipe mxfp8 --out report.json`` (gloo on CPUs, NCCL with one GPU per rank on GPUs).

Every rank, on its own rows of the batch:

1. *collect*: on a whole bf16 replica of the quantized model (see ``_prepared`` for why not a
   shard), one forward and backward under ``trace_precision`` and a
   ``StatsProbe``; ``numerics`` records of the precision-manifest check (fails closed when a
   linear ran another precision) and of the model output's SNR against the bf16 model's on
   the same rows;
2. *converge* (``--steps`` > 0): FSDP2-sharded (``mxcheck.sharded_training``) bf16 and recipe
   runs from one seed; the
   recipe's loss falls and tracks bf16 within the band tests/convergence uses.

Rank 0 merges every rank's records, block statistics and manifest into one report
(``mxcheck.distributed``) and writes it; the exit status is 1 when a check failed. The
report holds no timings (they are printed), so two runs give byte-identical files.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mxcheck.assertions import NumericsError
from mxcheck.distributed import (
    RankInfo,
    gather_report,
    init_process_group,
    leave_process_group,
    rank_payload,
)
from mxcheck.flux import quantized_linears
from mxcheck.manifest import trace_precision
from mxcheck.report import Record
from mxcheck.report.recorder import Numerics
from mxcheck.sharded_training import (
    rows_of,
    sharded_forward,
    sharded_model,
    train_sharded,
)
from mxcheck.stats_probe import StatsProbe
from mxcheck.training import (
    TrainConfig,
    _dataset,
    check_loss_falls,
    check_tracks,
    flow_matching_batch,
    make_model,
)

__all__ = ["BANDS", "LOSS_FALL", "OUTPUT_SNR_DB", "collect", "converge", "main"]

TEST_ID = "mxcheck.distributed_check"
# The single-process bands (tests/convergence/test_convergence.py; a test keeps them equal).
LOSS_FALL = 0.15
BANDS = {"mxfp4": 0.08, "mxfp4-fp8bwd": 0.08, "nvfp4": 0.08, "fp8": 0.02, "mxfp8": 0.02}
# Floors for the whole model's output SNR against bf16 at init, well under the measured
# values (flux-tiny, 2 ranks of 2 samples: mxfp8 about 33 dB, mxfp4 about 20 dB).
OUTPUT_SNR_DB = {"mxfp4": 12.0, "mxfp4-fp8bwd": 12.0, "nvfp4": 12.0, "fp8": 22.0, "mxfp8": 22.0}

Prepare = Callable[[nn.Module, int], None]  # edits the quantized model before sharding (tests)


def _recorded(fn: Callable[[], Any]) -> None:
    """Run one recorded check; its failure is already in the records, so go on to the next."""
    try:
        fn()
    except NumericsError:
        pass


def collect(info: RankInfo, cfg: TrainConfig, recipe: str, *, prepare: Prepare | None = None,
            ) -> tuple[list[Record], dict[str, Any], dict[str, Any]]:
    """This rank's records, ``StatsProbe.to_json()`` and manifest for one step on its rows."""
    rows = rows_of(info.rank, info.world_size, cfg.samples)
    inputs, target = flow_matching_batch(_dataset(cfg), torch.Generator().manual_seed(cfg.seed + 2), rows=rows)
    bf16, quantized = sharded_model(cfg), _prepared(cfg, recipe, info.rank, prepare)
    with torch.no_grad():
        ref = sharded_forward(bf16, inputs).float()
    with trace_precision(quantized) as manifest, StatsProbe(quantized) as probe:
        out = sharded_forward(quantized, inputs)
        F.mse_loss(out.float(), target.float()).backward()
    records: list[Record] = []
    numerics = Numerics(records.append, f"{TEST_ID}::collect", recipe=recipe)
    _recorded(lambda: numerics.context(layer="output", direction="fwd").snr(
        out.detach().float(), ref, OUTPUT_SNR_DB[recipe]))
    _recorded(lambda: numerics.context(layer="model").precision(manifest, recipe))
    return records, probe.to_json(), manifest.to_json()


def _prepared(cfg: TrainConfig, recipe: str, rank: int, prepare: Prepare | None) -> nn.Module:
    # A whole bf16 replica on each rank, not an FSDP2 shard: trace_precision attributes
    # backward GEMMs partly by storage address, and FSDP2 frees and reuses its all-gather
    # buffers. (A bf16 GEMM of an unquantized layer was filed under a quantized linear's wgrad
    # in 2 of 4 CI runs; the manifest now ignores addresses of freed inputs too.) The sharded
    # path is what `converge` trains.
    model = make_model(cfg, recipe)
    if prepare is not None:
        prepare(model, rank)
    return model


def _record(recipe: str, kind: str, check: Callable[[], float], extra: dict[str, Any]) -> Record:
    try:
        value, passed, message = check(), True, ""
    except NumericsError as e:
        value, passed, message = None, False, str(e)
    return Record(test_id=f"{TEST_ID}::converge", backend="emulated", recipe=recipe, kind=kind,
                  passed=passed, message=message, extra={**extra, "value": value})


def converge(cfg: TrainConfig, recipe: str) -> list[Record]:
    """Sharded bf16 and ``recipe`` runs; records that the recipe's first-step gradients are
    non-zero, that both losses fall, and that the recipe tracks bf16 (same on every rank)."""
    bf16 = train_sharded(sharded_model(cfg), cfg)
    model = sharded_model(cfg, recipe)
    run = train_sharded(model, cfg)
    names = [f"{n}.weight" for n in quantized_linears(model)]
    zero = [n for n in names if run.first_grads[n] == 0.0]
    grads = Record(test_id=f"{TEST_ID}::converge", backend="emulated", recipe=recipe, kind="grads",
                   mismatches=len(zero), total=len(names), passed=bool(names) and not zero,
                   message=f"zero first-step gradient in {zero}" if zero else "")
    return [
        grads,
        _record("bf16", "loss_falls", lambda: check_loss_falls(bf16.losses, LOSS_FALL, what="sharded bf16"),
                {"fraction": LOSS_FALL, "losses": bf16.losses}),
        _record(recipe, "loss_falls", lambda: check_loss_falls(run.losses, LOSS_FALL, what=f"sharded {recipe}"),
                {"fraction": LOSS_FALL, "losses": run.losses}),
        _record(recipe, "tracks", lambda: check_tracks(run.losses, bf16.losses, BANDS[recipe],
                                                       what=f"sharded {recipe}"),
                {"band": BANDS[recipe]}),
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchrun ... -m mxcheck.distributed_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", choices=sorted(BANDS), default="mxfp8", help="Default: %(default)r")
    p.add_argument("--out", metavar="PATH", help="where rank 0 writes the merged report. Default: %(default)r")
    p.add_argument("--steps", type=int, default=TrainConfig.steps, metavar="N",
                   help="convergence steps; 0 skips the convergence run. Default: %(default)r")
    p.add_argument("--samples-per-rank", type=int, default=2, metavar="N", help="Default: %(default)r")
    p.add_argument("--seed", type=int, default=0, metavar="INT", help="Default: %(default)r")
    args = p.parse_args(argv)
    for name in ("steps", "samples_per_rank"):
        if getattr(args, name) < (0 if name == "steps" else 1):
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)}; expected a positive integer")
    return args


def run(args: argparse.Namespace, *, prepare: Prepare | None = None) -> int:
    """The whole check on this rank; 1 on rank 0 when any check failed, else 0."""
    info = init_process_group()
    cfg = TrainConfig(samples=args.samples_per_rank * info.world_size, seed=args.seed, device=str(info.device))
    clock = time.perf_counter()
    records, stats, manifest = collect(info, cfg, args.recipe, prepare=prepare)
    timings = {"collect_s": time.perf_counter() - clock}
    report = gather_report(rank_payload(info, records, block_stats=stats, manifest=manifest, seed=args.seed))
    if args.steps:
        clock = time.perf_counter()
        trained = converge(replace(cfg, steps=args.steps), args.recipe)
        timings["converge_s"] = time.perf_counter() - clock
        if report is not None:
            report.records += [_tag_world(r, info.world_size) for r in trained]
    if report is None:
        return 0
    if args.out:
        report.save(args.out)
    failed = [r for r in report.records if not r.passed]
    print(f"mxcheck.distributed_check: {len(report.records)} records from {info.world_size} ranks "
          f"({info.backend}), {len(failed)} failed; "
          + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()), flush=True)
    for r in failed:
        print(f"FAILED {r.layer or ''} {r.kind}: {r.message}", flush=True)
    return 1 if failed else 0


def _tag_world(record: Record, world_size: int) -> Record:
    record.extra["world_size"] = world_size  # a job-wide result: no rank, the whole world
    return record


def main(argv: list[str] | None = None) -> int:
    finished = False
    try:
        code = run(parse_args(argv))
        finished = True
        return code
    finally:
        leave_process_group(wait_for_peers=finished)


if __name__ == "__main__":
    sys.exit(main())
