"""mxcheck inside a torch.distributed job: one process per device, results merged on rank 0.

Under ``torchrun`` every rank runs the same checks on its own data shard (and, with FSDP,
its own shard of the parameters). Each rank packs what it found into a JSON-able
*payload* (``rank_payload``): its ``numerics`` Records, its ``StatsProbe.to_json()``,
its precision manifest and its environment. ``gather_report`` sends the payloads to rank 0
with ``torch.distributed.gather_object`` and merges them into one ``Report``.

Report schema (no new fields; a merged report loads with any mxcheck that reads version 1):
- each record's ``layer`` gets the prefix ``rank<r>/`` (``rank<r>`` when it had none), so
  the same check on two ranks has two keys and ``mxcheck compare`` can pair each with its
  baseline; ``extra["rank"]`` and ``extra["world_size"]`` say the same as numbers;
- top-level ``block_stats``: the ranks' probes in one dict, names prefixed ``rank<r>/`` (the
  HTML rendering draws them as it draws a single process's);
- top-level ``precision_manifest``: ``{"rank<r>": manifest.to_json()}``;
- top-level ``distributed``: world size, process-group backend, and each rank's device;
- ``environment``: the ranks' environments merged as ``Report.merge`` merges xdist workers'
  (a key on which ranks differ, e.g. ``visible_devices``, becomes the list of values).

torch.distributed is imported inside the functions that use it, so importing this module
costs nothing where no job runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from mxcheck.report import Record, Report, collect_environment

__all__ = [
    "RankInfo",
    "gather_report",
    "init_process_group",
    "leave_process_group",
    "merge_payloads",
    "pick_device",
    "rank_from_env",
    "rank_payload",
    "tag_record",
]

DISTRIBUTED_KEY = "distributed"
BLOCK_STATS_KEY = "block_stats"  # as mxcheck.report.html reads it
MANIFEST_KEY = "precision_manifest"


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the job, and the device it computes on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str  # process-group backend: "gloo" or "nccl"

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "device": str(self.device)}


def _env_int(environ: Mapping[str, str], name: str, default: int | None) -> int:
    raw = environ.get(name)
    if raw is None:
        if default is None:
            raise ValueError(f"{name} is not set; run under torchrun, which sets RANK, WORLD_SIZE "
                             "and LOCAL_RANK, or set them yourself")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}; expected a non-negative integer") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r}; expected a non-negative integer")
    return value


def rank_from_env(environ: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's variables; a lone process is (0, 1, 0)."""
    environ = os.environ if environ is None else environ
    world = _env_int(environ, "WORLD_SIZE", 1)
    rank = _env_int(environ, "RANK", 0 if world == 1 else None)
    local = _env_int(environ, "LOCAL_RANK", rank)
    if world < 1 or rank >= world:
        raise ValueError(f"RANK={rank} WORLD_SIZE={world}; expected 0 <= RANK < WORLD_SIZE")
    return rank, world, local


def pick_device(local_rank: int, *, cuda: bool | None = None) -> torch.device:
    """``cuda:<local_rank>`` when CUDA (or ROCm) is present, else the CPU.

    One GPU per rank, as NCCL requires (two ranks on one GPU is refused by NCCL).
    """
    cuda = torch.cuda.is_available() if cuda is None else cuda
    return torch.device("cuda", local_rank) if cuda else torch.device("cpu")


def init_process_group(*, backend: str | None = None, timeout_s: float = 300.0,
                       environ: Mapping[str, str] | None = None) -> RankInfo:
    """Join the job torchrun started (``env://``): nccl on GPUs, gloo on CPUs.

    Picks and sets this rank's device from LOCAL_RANK. Already initialised: reuses the group.
    """
    import torch.distributed as dist  # noqa: PLC0415

    rank, world, local = rank_from_env(environ)
    device = pick_device(local)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r}; expected 'gloo' or 'nccl'")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before NCCL starts, so its communicator uses this GPU
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s),
                                **({"device_id": device} if backend == "nccl" else {}))
    return RankInfo(rank, world, local, device, dist.get_backend())


def leave_process_group(*, wait_for_peers: bool = True) -> None:
    """Destroy this rank's process group, once every rank got here (``wait_for_peers``).

    Without the barrier a rank that finished its last collective first (rank 1, once
    ``gather_object`` has sent) tears its gloo group down and exits while its peer still
    works on the pairs and on rank 0's store: the likely way a rank dies of SIGABRT at exit
    ("terminate called without an active exception": a gloo thread still joinable). After
    an exception the peers may never arrive, so there is no wait then.
    """
    import torch.distributed as dist  # noqa: PLC0415

    if not dist.is_initialized():
        return
    if wait_for_peers and dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()


def tag_record(record: Record | Mapping[str, Any], rank: int, world_size: int) -> Record:
    """A copy of ``record`` whose layer and extra say which rank made it (module docstring)."""
    data = dict(record.to_json() if isinstance(record, Record) else record)
    layer = data.get("layer")
    data["layer"] = f"rank{rank}/{layer}" if layer else f"rank{rank}"
    data["extra"] = {**(data.get("extra") or {}), "rank": rank, "world_size": world_size}
    return Record.from_json(data)


def rank_payload(info: RankInfo, records: Iterable[Record], *, block_stats: Mapping[str, Any] | None = None,
                 manifest: Mapping[str, Any] | None = None, seed: int | None = None) -> dict[str, Any]:
    """What one rank sends to rank 0: plain JSON-able data, tagged with its rank."""
    return {
        "rank": info.rank,
        "world_size": info.world_size,
        "backend": info.backend,
        "device": info.describe(),
        "environment": collect_environment(seed=seed, backends=["emulated"]),
        "records": [tag_record(r, info.rank, info.world_size).to_json() for r in records],
        BLOCK_STATS_KEY: dict(block_stats or {}),
        MANIFEST_KEY: None if manifest is None else dict(manifest),
    }


def merge_payloads(payloads: list[dict[str, Any]]) -> Report:
    """One Report from every rank's payload, each rank exactly once; independent of order."""
    ranks = sorted(p["rank"] for p in payloads)
    worlds, backends = {p["world_size"] for p in payloads}, {p["backend"] for p in payloads}
    if len(worlds) != 1 or ranks != list(range(min(worlds))) or len(backends) != 1:
        raise ValueError(f"payloads from ranks {ranks}, world sizes {sorted(worlds)}, backends "
                         f"{sorted(backends)}; expected each rank 0 .. world_size - 1 exactly once, "
                         "all with one world size and one backend")
    payloads = sorted(payloads, key=lambda p: p["rank"])
    parts = [Report(environment=p["environment"], records=[Record.from_json(r) for r in p["records"]])
             for p in payloads]
    merged = Report.merge(parts)
    merged.unknown[DISTRIBUTED_KEY] = {
        "world_size": len(payloads),
        "backend": backends.pop(),
        "ranks": [p["device"] for p in payloads],
    }
    merged.unknown[BLOCK_STATS_KEY] = {f"rank{p['rank']}/{k}": v for p in payloads
                                       for k, v in p[BLOCK_STATS_KEY].items()}
    manifests = {f"rank{p['rank']}": p[MANIFEST_KEY] for p in payloads if p[MANIFEST_KEY] is not None}
    if manifests:
        merged.unknown[MANIFEST_KEY] = manifests
    return merged


def gather_report(payload: dict[str, Any], *, dst: int = 0, group: Any = None) -> Report | None:
    """Gather every rank's payload on ``dst`` and merge them there; other ranks get None.

    A lone process (no process group) merges its own payload.
    """
    import torch.distributed as dist  # noqa: PLC0415

    if not dist.is_initialized():
        return merge_payloads([payload])
    rank = dist.get_rank(group)
    received: list[Any] | None = [None] * dist.get_world_size(group) if rank == dst else None
    dist.gather_object(payload, received, dst=dst, group=group)
    return merge_payloads(received) if rank == dst else None
