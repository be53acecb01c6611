"""The convergence run of mxcheck.training, data-parallel with the Flux sharded by FSDP2.

Run inside a torch.distributed job (``mxcheck.distributed.init_process_group``):

- Parameters are FP32 and sharded with ``fully_shard`` (one unit per double and single
  block, the embedders and final layer in the root unit) under
  ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``: forward and backward
  see bf16 weights all-gathered from the FP32 shards, gradients are reduce-scattered
  (averaged over ranks) in FP32, and AdamW steps the FP32 shards. Those shards are the FP32
  master copy of DESIGN.md trap 2; no second copy is kept, as ``MasterWeights`` keeps in one
  process. The alternative (bf16 parameters, ``param_dtype=None``) would step bf16 in place.
- ``cast_forward_inputs=False``: the model casts its own inputs exactly as in one process
  (position ids and RoPE stay FP32); FSDP's default would round every float input to bf16.
- The parameters start from the bf16-rounded init that ``mxcheck.training.train`` starts from
  (``make_model`` then ``float()``), zero-init broken (DESIGN.md trap 1).
- Each rank trains on its slice of the dataset; t and noise are drawn for the whole batch on
  every rank and sliced (``flow_matching_batch``), and the logged loss is the mean over the
  ranks: with equal slices, the one-process loss of the whole batch.

FSDP2 runs on CPUs with gloo in torch 2.13 (checked), so one code path serves gloo on CPUs
and NCCL on GPUs.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch
from torch import nn

from mxcheck.rng import seeded_default_rng
from mxcheck.training import TrainConfig, TrainResult, _dataset, flow_matching_loss, make_model

__all__ = ["rows_of", "shard_flux", "sharded_forward", "sharded_loss", "sharded_model", "train_sharded"]


def rows_of(rank: int, world_size: int, samples: int) -> slice:
    """The rows of a ``samples``-row batch that ``rank`` trains on: equal contiguous slices."""
    if samples % world_size:
        raise ValueError(f"samples={samples} is not a multiple of world_size={world_size}: give every "
                         "rank the same number of rows, so the mean over ranks is the batch loss")
    per = samples // world_size
    return slice(rank * per, (rank + 1) * per)


def shard_flux(model: nn.Module, *, reshard_after_forward: bool = True) -> nn.Module:
    """``fully_shard`` each transformer block, then the root; FP32 parameters required.

    ``reshard_after_forward=False`` keeps each unit's gathered weights alive (at one address)
    from forward to backward. ``trace_precision`` needs that: it attributes backward GEMMs by
    storage address, and with resharding a freed weight's memory is reused by the next unit's
    all-gather, so a bf16 GEMM of a modulation linear was pinned on a quantized linear.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: PLC0415

    wrong = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
    if wrong:
        raise ValueError(f"parameters in {wrong}: shard an FP32 model (model.float()); the FP32 shards "
                         "are the master copy the optimizer steps")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                  cast_forward_inputs=False)
    for block in (*model.double_blocks, *model.single_blocks):
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return fully_shard(model, mp_policy=policy, reshard_after_forward=reshard_after_forward)


def sharded_model(cfg: TrainConfig, recipe: str | None = None, backend: str = "emulated", *,
                  reshard_after_forward: bool = True) -> nn.Module:
    """``make_model``'s Flux (bf16-rounded init, zero-init broken, linears quantized) in FP32,
    sharded."""
    return shard_flux(make_model(cfg, recipe, backend).float(), reshard_after_forward=reshard_after_forward)


@contextlib.contextmanager
def _quiet_view_output() -> Iterator[None]:
    # FSDP2 warns that Flux returns a view (final_layer of a slice); the loss only reads it
    # out of place (.float()), which is the use the warning says is safe.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        yield


def sharded_forward(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The sharded model's prediction (keyword inputs of ``Flux.forward``)."""
    with _quiet_view_output():
        return model(**inputs)


def sharded_loss(model: nn.Module, data: dict[str, torch.Tensor], generator: torch.Generator,
                 rows: slice) -> torch.Tensor:
    """This rank's flow-matching loss on its rows of the batch."""
    with _quiet_view_output():
        return flow_matching_loss(model, data, generator, rows=rows)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor shard, or a plain tensor


def _first_grads(model: nn.Module) -> dict[str, float]:
    """max |grad| of every parameter over all ranks' shards (0.0 for no gradient)."""
    import torch.distributed as dist  # noqa: PLC0415

    named = list(model.named_parameters())
    local = [0.0 if p.grad is None or not _local(p.grad).numel() else float(_local(p.grad).abs().max())
             for _, p in named]
    peak = torch.tensor(local, dtype=torch.float64, device=next(model.parameters()).device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return {n: float(v) for (n, _), v in zip(named, peak.tolist(), strict=True)}


def train_sharded(model: nn.Module, cfg: TrainConfig) -> TrainResult:
    """``cfg.steps`` AdamW steps on this rank's rows; every rank returns the same mean losses."""
    import torch.distributed as dist  # noqa: PLC0415

    rank, world = dist.get_rank(), dist.get_world_size()
    rows = rows_of(rank, world, cfg.samples)
    data = _dataset(cfg)
    noise_gen = torch.Generator().manual_seed(cfg.seed + 2)
    # as train(): stochastic rounding draws from the default generator, seeded and forked
    with seeded_default_rng(cfg.seed + 3, cfg.device):
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        result = TrainResult(losses=[])
        for step in range(cfg.steps):
            loss = sharded_loss(model, data, noise_gen, rows)
            loss.backward()
            if step == 0:
                result.first_grads = _first_grads(model)
            mean = loss.detach().double()
            dist.all_reduce(mean)
            result.losses.append(mean.item() / world)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return result
