"""A training step captured as a CUDA graph computes what the eager step computes, bit for bit.

``mxcheck.training.CUDAGraphStep`` replays one captured step (loss, backward, AdamW on the
FP32 master, the copy back); a replay must use this step's t and noise (copied into the
graph's inputs) and this step's stochastic-rounding bits (the default CUDA generator, which a
graph advances per replay as eager calls do). A graph that replayed stale inputs, or the
same SR bits each step, would still train; here it would differ from the eager run. The
step object is the only owner of its model here (as in the benchmark): a graph holds only
addresses, so anything it reads that the object does not keep is freed under the replay.
"""

from __future__ import annotations

import gc
import re

import pytest
import torch

from mxcheck.rng import seeded_default_rng
from mxcheck.training import (
    CUDAGraphStep,
    MasterWeights,
    TrainConfig,
    _dataset,
    draw_t_noise,
    flow_matching_batch,
    flow_matching_loss,
    make_model,
)

# flux-small: every linear dimension tiles MX, NVFP4 and FP8's blocks; 2 x 128 tokens
CFG = TrainConfig(model="flux-small", samples=2, img_tokens=64, txt_tokens=64, device="cuda")
WARMUP, STEPS = 2, 3


def _build(recipe: str | None, cfg: TrainConfig = CFG):
    model = make_model(cfg, recipe)
    master = MasterWeights(model, lambda ps: torch.optim.AdamW(ps, lr=cfg.lr, betas=cfg.betas, capturable=True))
    return model, master, _dataset(cfg), torch.Generator().manual_seed(cfg.seed + 2)


def _graphed(recipe: str | None) -> CUDAGraphStep:
    return CUDAGraphStep(*_build(recipe), warmup=WARMUP)


def _run(recipe: str | None, graphed: bool) -> tuple[list[float], list[torch.Tensor]]:
    """The losses of the STEPS steps after WARMUP eager ones, and the parameters after them."""
    losses = []
    with seeded_default_rng(CFG.seed + 3, CFG.device):  # SR recipes draw their bits from it
        if graphed:
            step = _graphed(recipe)
            gc.collect()  # whatever only _graphed's frame held is gone now
            torch.cuda.empty_cache()  # and its memory back with the driver or reused
            _filler = torch.full((1 << 24,), float("nan"), device=CFG.device)  # takes freed blocks, if any
            losses = [step().item() for _ in range(STEPS)]
            model = step.model
        else:
            model, master, data, gen = _build(recipe)
            for i in range(WARMUP + STEPS):
                loss = flow_matching_loss(model, data, gen)
                loss.backward()
                master.step()
                if i >= WARMUP:
                    losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.cuda
@pytest.mark.parametrize("recipe", [None, "mxfp4", "mxfp8", "fp8", "nvfp4"])
def test_graph_replays_give_the_eager_steps_bits(recipe):
    pytest.importorskip("triton")
    eager_losses, eager_params = _run(recipe, graphed=False)
    graph_losses, graph_params = _run(recipe, graphed=True)
    initial = [p.detach() for p in make_model(CFG, recipe).parameters()]
    # the premise: each step saw new draws, and the steps moved every parameter
    assert len(set(eager_losses)) == STEPS
    assert all(not torch.equal(p, q) for p, q in zip(eager_params, initial, strict=True))
    assert graph_losses == eager_losses
    moved = [i for i, (p, q) in enumerate(zip(graph_params, eager_params, strict=True)) if not torch.equal(p, q)]
    assert not moved, f"{len(moved)} of {len(eager_params)} parameters differ from the eager run's"


@pytest.mark.emulated
def test_a_cuda_graph_step_refuses_cpu_data_no_warmup_and_no_cpu_generator():
    cfg = TrainConfig(device="cpu")
    model, master, data, gen = _build(None, cfg)
    with pytest.raises(ValueError, match="data is on cpu"):
        CUDAGraphStep(model, master, data, gen)
    for generator in (None, 0, "cpu"):  # (a CUDA generator is refused too; no CUDA device here)
        with pytest.raises(TypeError, match=r"expected a CPU torch\.Generator"):
            CUDAGraphStep(model, master, data, generator)
    for warmup in (0, -1, 1.5):
        with pytest.raises(ValueError, match=re.escape(f"warmup={warmup}")):
            CUDAGraphStep(model, master, data, gen, warmup=warmup)


@pytest.mark.emulated
def test_drawn_ahead_batches_are_the_generator_s_batches():
    """The graph's inputs come from draw_t_noise: the batch built from them is the one the
    eager step builds from the generator, step after step (same draws, same order)."""
    data = _dataset(TrainConfig(device="cpu"))
    eager, ahead = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for _ in range(3):
        (inputs, target) = flow_matching_batch(data, eager)
        (inputs_ahead, target_ahead) = flow_matching_batch(data, None, draws=draw_t_noise(data["x0"], ahead))
        assert torch.equal(target, target_ahead)
        assert inputs.keys() == inputs_ahead.keys()
        assert all(torch.equal(inputs[k], inputs_ahead[k]) for k in inputs)
    with pytest.raises(TypeError, match=r"expected a torch\.Generator, or pass draws"):
        flow_matching_batch(data, None)
