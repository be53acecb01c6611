"""mxcheck inside a torch.distributed job: two CPU processes over gloo, on 127.0.0.1.

The end-to-end tests launch ``torchrun --nproc-per-node 2 -m mxcheck.distributed_check``
(the command a user runs) and, at the same time, two spawned processes that run the same
check again from the same seed (the byte-identity check) and then, in the same process
group, the negative control: one layer sabotaged on rank 1 only. The spawned ranks do both
so that the suite starts two Python processes with torch fewer (about 3 s of CPU each);
both jobs take about 25 s on two CPU cores.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mxcheck import distributed_check
from mxcheck.backends.known_bad import Bf16Fallback
from mxcheck.distributed import (
    gather_report,
    leave_process_group,
    merge_payloads,
    pick_device,
    rank_from_env,
)
from mxcheck.report import Record, Report, compare
from mxcheck.training import check_loss_falls, check_tracks
from tests.convergence import test_convergence as single_process

pytestmark = pytest.mark.emulated

ROOT = Path(__file__).parents[1]
SABOTAGED = "double_blocks.0.img_mlp.0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    # gloo on CPUs, also on a GPU runner (2 ranks would need 2 GPUs there).
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}


# ---- pieces, in one process ------------------------------------------------------------


def test_rank_comes_from_torchrun_variables():
    assert rank_from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == (1, 2, 1)
    assert rank_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == (3, 4, 1)  # 2 nodes
    assert rank_from_env({}) == (0, 1, 0)
    with pytest.raises(ValueError, match="RANK is not set"):
        rank_from_env({"WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match=r"RANK=2 WORLD_SIZE=2"):
        rank_from_env({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match=r"LOCAL_RANK='gpu0'"):
        rank_from_env({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "gpu0"})


def test_each_rank_computes_on_the_gpu_its_local_rank_names():
    assert pick_device(3, cuda=True) == torch.device("cuda", 3)
    assert pick_device(3, cuda=False) == torch.device("cpu")


def _payload(rank: int, world: int, snr: float, **over) -> dict:
    rec = Record(test_id="t", backend="emulated", recipe="mxfp8", layer="output", direction="fwd",
                 snr_db=snr, threshold_db=20.0, passed=True)
    tagged = Record.from_json({**rec.to_json(), "layer": f"rank{rank}/output",
                               "extra": {"rank": rank, "world_size": world}})
    return {"rank": rank, "world_size": world, "backend": "gloo",
            "device": {"rank": rank, "local_rank": rank, "device": f"cuda:{rank}"},
            "environment": {"torch": "2.13.0", "visible_devices": {"CUDA_VISIBLE_DEVICES": str(rank)}},
            "records": [tagged.to_json()], "block_stats": {"output/fwd/x_row": {"snr_db": snr}},
            "precision_manifest": {"layers": {}}, **over}


def test_merge_keeps_each_rank_once_whatever_the_arrival_order():
    a, b = _payload(0, 2, 30.0), _payload(1, 2, 31.0)
    merged = merge_payloads([b, a])
    assert merged.dumps() == merge_payloads([a, b]).dumps()
    assert [(r.layer, r.snr_db, r.extra["rank"]) for r in merged.records] == [("rank0/output", 30.0, 0),
                                                                             ("rank1/output", 31.0, 1)]
    assert sorted(merged.unknown["block_stats"]) == ["rank0/output/fwd/x_row", "rank1/output/fwd/x_row"]
    assert sorted(merged.unknown["precision_manifest"]) == ["rank0", "rank1"]
    assert merged.environment["visible_devices"] == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    assert merged.environment["torch"] == "2.13.0"
    # A version-1 report: loads back unchanged, and compare pairs every rank's record.
    again = Report.loads(merged.dumps())
    assert again.dumps() == merged.dumps()
    assert len(compare(again, merged).unchanged) == 2


@pytest.mark.parametrize(("ranks", "worlds"), [((0, 0), (2, 2)), ((0,), (2,)), ((0, 1), (2, 3))],
                         ids=["rank-twice", "rank-missing", "world-sizes-differ"])
def test_merge_refuses_anything_but_each_rank_once(ranks, worlds):
    with pytest.raises(ValueError, match=r"each rank 0 \.\. world_size - 1 exactly once"):
        merge_payloads([_payload(r, w, 30.0) for r, w in zip(ranks, worlds, strict=True)])


def test_a_lone_process_merges_its_own_payload():
    assert [r.layer for r in gather_report(_payload(0, 1, 30.0)).records] == ["rank0/output"]


def test_the_bands_are_the_single_process_bands():
    assert distributed_check.BANDS == single_process.BANDS
    assert distributed_check.LOSS_FALL == single_process.LOSS_FALL


# ---- two ranks: torchrun, as a user runs it ---------------------------------------------


def _torchrun_command(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
            "127.0.0.1", "--master-port", str(_free_port()), "-m", "mxcheck.distributed_check",
            "--out", str(out), *args]


def _torchrun(out: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    done = subprocess.run(_torchrun_command(out, *args), capture_output=True, text=True, env=_env(),
                          cwd=ROOT, timeout=300)
    return done, time.perf_counter() - start


def _bf16_on_rank_1(model: torch.nn.Module, rank: int) -> None:
    if rank == 1:
        model.get_submodule(SABOTAGED).backend = Bf16Fallback()


def _spawned(rank: int, port: int, again: str, sabotaged: str) -> None:
    """One rank of the spawned job: the torchrun job's check again, then the negative control."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    finished = False
    try:
        distributed_check.run(distributed_check.parse_args(["--recipe", "mxfp8", "--out", again]))
        # The same process group again (run reuses it): collection only, rank 1 sabotaged.
        distributed_check.run(distributed_check.parse_args(["--recipe", "mxfp8", "--steps", "0", "--out", sabotaged]),
                              prepare=_bf16_on_rank_1)
        finished = True
    finally:
        leave_process_group(wait_for_peers=finished)  # both ranks tear gloo down together


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The mxfp8 check (collection and a 30-step convergence run) twice from one seed, once
    by torchrun and once by two spawned ranks, and the spawned ranks' sabotaged collection;
    the two jobs run at the same time."""
    out = tmp_path_factory.mktemp("torchrun")
    start = time.perf_counter()
    # Its output to files, not pipes: nothing reads a pipe while the spawned ranks run.
    with open(out / "stdout", "w+") as stdout, open(out / "stderr", "w+") as stderr:
        torchrun = subprocess.Popen(_torchrun_command(out / "a.json", "--recipe", "mxfp8"), stdout=stdout,
                                    stderr=stderr, text=True, env=_env(), cwd=ROOT)
        try:
            with pytest.MonkeyPatch.context() as mp:
                for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):  # gloo on CPUs, also on a GPU runner
                    mp.setenv(name, "")
                torch.multiprocessing.spawn(_spawned, nprocs=2, join=True,
                                            args=(_free_port(), str(out / "b.json"), str(out / "sabotaged.json")))
            torchrun.wait(timeout=300)
        finally:
            if torchrun.poll() is None:  # the spawned job failed: stop torchrun and its ranks
                torchrun.terminate()
                torchrun.wait(timeout=60)
    done = subprocess.CompletedProcess(torchrun.args, torchrun.returncode, (out / "stdout").read_text(),
                                       (out / "stderr").read_text())
    assert (out / "a.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]  # each test checks its part
    return {"torchrun": (Report.load(out / "a.json"), done, time.perf_counter() - start),
            "again": Report.load(out / "b.json"), "sabotaged": Report.load(out / "sabotaged.json")}


def test_both_ranks_records_are_merged_once_on_rank_0(runs):
    report, done, _ = runs["torchrun"]
    assert done.returncode == 0, done.stdout[-3000:]
    assert done.stdout.count("records from 2 ranks (gloo)") == 1  # only rank 0 merged and wrote
    per_rank = [(r.layer, r.kind, r.extra["rank"], r.extra["world_size"])
                for r in report.records if r.test_id.endswith("::collect")]
    assert per_rank == [("rank0/model", "precision", 0, 2), ("rank0/output", "snr", 0, 2),
                        ("rank1/model", "precision", 1, 2), ("rank1/output", "snr", 1, 2)]
    assert all(r.passed for r in report.records)
    stats = report.unknown["block_stats"]
    for rank in (0, 1):  # 10 quantized linears x 6 operand copies, on each rank
        assert sum(k.startswith(f"rank{rank}/") for k in stats) == 60
    assert sorted(report.unknown["precision_manifest"]) == ["rank0", "rank1"]
    assert report.unknown["distributed"]["ranks"] == [{"device": "cpu", "local_rank": r, "rank": r} for r in (0, 1)]
    # The two ranks saw different rows: their block statistics differ.
    assert stats["rank0/single_blocks.0.linear1/fwd/x_row"] != stats["rank1/single_blocks.0.linear1/fwd/x_row"]


def test_the_merged_report_is_identical_across_two_runs(runs):
    report, _, seconds = runs["torchrun"]
    print(f"wall time of both jobs: {seconds:.1f} s")
    assert report.dumps() == runs["again"].dumps()


@pytest.mark.convergence
def test_sharded_mxfp8_loss_falls_and_tracks_bf16(runs):
    report = runs["torchrun"][0]
    found = {(r.recipe, r.kind): r for r in report.records if r.test_id.endswith("::converge")}
    assert sorted(found) == [("bf16", "loss_falls"), ("mxfp8", "grads"), ("mxfp8", "loss_falls"),
                             ("mxfp8", "tracks")]
    assert all(r.passed for r in found.values()), [r.message for r in found.values() if not r.passed]
    assert found["mxfp8", "grads"].total == 10  # every quantized linear had a first-step gradient
    bf16, mxfp8 = found["bf16", "loss_falls"].extra["losses"], found["mxfp8", "loss_falls"].extra["losses"]
    assert len(bf16) == len(mxfp8) == 30 and bf16 != mxfp8
    check_loss_falls(bf16, single_process.LOSS_FALL, what="sharded bf16")
    check_loss_falls(mxfp8, single_process.LOSS_FALL, what="sharded mxfp8")
    check_tracks(mxfp8, bf16, single_process.BANDS["mxfp8"], what="sharded mxfp8")


# ---- negative control: one rank's layer silently runs bf16 --------------------------------


def test_the_manifest_fails_when_one_ranks_layer_silently_runs_bf16(runs):
    checks = {r.layer: r for r in runs["sabotaged"].records if r.kind == "precision"}
    assert checks["rank0/model"].passed
    assert not checks["rank1/model"].passed
    message = checks["rank1/model"].message
    assert "3 precision problem(s)" in message  # that one layer, in each direction, and nothing else
    for direction, op in (("fwd", "addmm"), ("dgrad", "mm"), ("wgrad", "mm")):
        assert f"{SABOTAGED} {direction}: GEMM aten::{op} ran in bfloat16" in message
