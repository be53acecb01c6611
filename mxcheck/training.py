"""Rectified-flow training of a small Flux with an FP32 master copy, for convergence tests.

The objective is Flux's (Primus ``loss_computation.py``, diffusers
``train_dreambooth_flux.py``): ``x_t = (1 - t) x0 + t noise`` with logit-normal t, target
``noise - x0``, MSE in float32. The model computes in bf16; its parameters are copied each
step from an FP32 master copy that AdamW steps (as Megatron's optimizer does), because an
update below half a bf16 ulp applied to bf16 weights in place rounds away (DESIGN.md trap
2). Every run draws its data, t and noise from its own seeded generators, so a bf16 run
and a run per recipe see the same batches and their loss curves can be compared step by step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from mxcheck.assertions import NumericsError
from mxcheck.flux.config import FluxConfig, get_config
from mxcheck.flux.init import break_zero_init, init_weights
from mxcheck.flux.inputs import make_inputs
from mxcheck.flux.model import Flux
from mxcheck.flux.quantize import quantize_model
from mxcheck.rng import seeded_default_rng

__all__ = [
    "CUDAGraphStep",
    "MasterWeights",
    "TrainConfig",
    "TrainResult",
    "check_loss_falls",
    "check_tracks",
    "draw_t_noise",
    "eval_loss",
    "flow_matching_batch",
    "flow_matching_loss",
    "logit_normal",
    "make_model",
    "synthetic_dataset",
    "train",
]


@dataclass(frozen=True)
class TrainConfig:
    """A short convergence run: model, data size, optimizer and seed."""

    model: str | FluxConfig = "flux-tiny"
    steps: int = 30
    samples: int = 2  # dataset size; every step trains on all of it
    img_tokens: int = 16
    txt_tokens: int = 16
    lr: float = 5e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    seed: int = 0
    break_zero_init_std: float = 0.02
    device: str = "cpu"  # data and model live here; random draws stay on CPU generators


@dataclass
class TrainResult:
    losses: list[float]
    # max |grad| of every parameter after the first backward (before any step)
    first_grads: dict[str, float] = field(default_factory=dict)


def logit_normal(batch: int, generator: torch.Generator, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
    """t = sigmoid(N(mean, std)): SD3's ``rf/lognorm``, Primus' ``LogitNormalSampler``."""
    return torch.sigmoid(mean + std * torch.randn(batch, generator=generator))


def synthetic_dataset(config: FluxConfig | str, samples: int, img_tokens: int, txt_tokens: int,
                      generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Latents a small Flux can learn: each sample's x0 is a smooth function of its
    conditioning (a fixed random projection of its pooled vector), plus the model inputs."""
    c = get_config(config)
    data = make_inputs(c, samples, img_tokens, txt_tokens, generator=generator)
    basis = torch.randn(c.vec_in_dim, img_tokens * c.in_channels, generator=generator) / c.vec_in_dim**0.5
    x0 = (data["y"] @ basis).reshape(samples, img_tokens, c.in_channels)
    data["x0"] = x0 / x0.std()
    del data["img"], data["timesteps"]
    return data


def draw_t_noise(x0: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's t (one per sample) and noise (shaped like x0, float32), drawn on the
    (CPU) generator: the same draws whatever device trains."""
    return logit_normal(x0.shape[0], generator), torch.randn(x0.shape, generator=generator)


def flow_matching_batch(data: dict[str, torch.Tensor], generator: torch.Generator | None,
                        dtype: torch.dtype = torch.bfloat16, rows: slice | None = None, *,
                        draws: tuple[torch.Tensor, torch.Tensor] | None = None,
                        ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(model inputs at x_t, velocity target noise - x0) for one step's draw of t and noise.

    ``rows`` keeps a slice of the batch (a data-parallel rank's shard). t and noise are drawn
    for the whole batch first, so the ranks together see exactly a single process's draws.
    ``draws``: this step's (t, noise) from ``draw_t_noise``, drawn already (a CUDA graph's
    inputs); then ``generator`` is not used.
    """
    x0 = data["x0"]
    if draws is None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator={generator!r}; expected a torch.Generator, or pass draws=(t, noise)")
    t, noise = draw_t_noise(x0, generator) if draws is None else draws
    t, noise = t.to(x0.device), noise.to(x0.device)
    if rows is not None:
        data, t, noise = {k: v[rows] for k, v in data.items()}, t[rows], noise[rows]
        x0 = data["x0"]
    x_t = (1 - t[:, None, None]) * x0 + t[:, None, None] * noise
    cond = {k: (v.to(dtype) if k in ("txt", "y", "guidance") else v) for k, v in data.items() if k != "x0"}
    return {"img": x_t.to(dtype), "timesteps": t.to(dtype), **cond}, noise - x0


def flow_matching_loss(model: nn.Module, data: dict[str, torch.Tensor], generator: torch.Generator | None,
                       dtype: torch.dtype = torch.bfloat16, rows: slice | None = None, *,
                       draws: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """MSE between the model's prediction at x_t and the velocity target noise - x0."""
    inputs, target = flow_matching_batch(data, generator, dtype, rows, draws=draws)
    return F.mse_loss(model(**inputs).float(), target.float())


class MasterWeights:
    """FP32 master copies of a (bf16) model's parameters, stepped by an optimizer.

    ``step()`` moves the model's gradients to the masters, steps, and copies the masters
    back into the model (rounding to its dtype once).
    """

    def __init__(self, model: nn.Module, make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer]) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.optimizer = make_optimizer(self.master)

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.master, strict=True):
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None
        self.optimizer.step()
        for p, m in zip(self.params, self.master, strict=True):
            p.copy_(m)


class CUDAGraphStep:
    """The training step (flow-matching loss, backward, ``master.step()``) as a CUDA graph:
    ``warmup`` eager steps (on a side stream, as torch's whole-network capture does: the
    Triton kernels compile, cuBLAS and AdamW make their state), then one capture. Each call
    draws the step's t and noise on ``generator`` (CPU), copies them into the graph's input
    buffers without a host wait and replays; it returns the loss, a device tensor the graph
    rewrites each replay.

    A replay runs the kernels the eager step runs, on the same draws, so a run of warmup
    steps and replays gives the parameters of an eager run with the same (capturable)
    optimizer bit for bit (tests/test_cuda_graph_step.py); what it removes is the host's time per step (Python,
    dispatch, launches), which bounds an emulated step on a fast GPU. The object holds the
    model, master copy, data and buffers the graph reads: a graph keeps only addresses, so
    freed memory under a replay is an illegal access, or another tensor's bits. The step must
    not read the device from the host (DelayedScaling's history does; fp8-block's GEMM
    choice does) and its optimizer must be capturable (``AdamW(..., capturable=True)``).
    """

    def __init__(self, model: nn.Module, master: MasterWeights, data: dict[str, torch.Tensor],
                 generator: torch.Generator, *, warmup: int = 3) -> None:
        if not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"warmup={warmup!r}; expected an int >= 1 (the capture needs the kernels compiled "
                             "and the optimizer's state made by an eager step first)")
        if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
            raise TypeError(f"generator={generator!r}; expected a CPU torch.Generator (t and noise are drawn "
                            "on the CPU, as the eager step draws them, and copied into the graph's inputs)")
        x0 = data["x0"]
        if not x0.is_cuda:
            raise ValueError(f"data is on {x0.device}; a CUDA graph step needs the model and data on a CUDA device")
        self.model, self.master, self.data, self.generator = model, master, data, generator
        # the draws' dtype (torch's default, as draw_t_noise makes them), so the copy is exact
        self.t_in = torch.empty(x0.shape[0], device=x0.device, dtype=torch.get_default_dtype())
        self.noise_in = torch.empty(x0.shape, device=x0.device, dtype=torch.get_default_dtype())
        side = torch.cuda.Stream(device=x0.device)
        side.wait_stream(torch.cuda.current_stream(x0.device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self._fill()
                self._body()
        torch.cuda.current_stream(x0.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = self._body()

    def _fill(self) -> None:  # pinned, so the copies queue behind the last replay instead of waiting for it
        t, noise = draw_t_noise(self.data["x0"], self.generator)
        self.t_in.copy_(t.pin_memory(), non_blocking=True)
        self.noise_in.copy_(noise.pin_memory(), non_blocking=True)

    def _body(self) -> torch.Tensor:
        loss = flow_matching_loss(self.model, self.data, None, draws=(self.t_in, self.noise_in))
        loss.backward()
        self.master.step()
        return loss.detach()

    def __call__(self) -> torch.Tensor:
        self._fill()
        self.graph.replay()
        return self.loss


def make_model(cfg: TrainConfig, recipe: str | None = None, backend: str = "emulated") -> Flux:
    """Primus init, zero-init broken, bf16, and (with a recipe) quantized linears."""
    gen = torch.Generator().manual_seed(cfg.seed)
    # Flux() draws nn.Linear's default init from the global stream (which the primus init
    # then overwrites): forked, so the caller's stream is left as it was.
    with torch.random.fork_rng(devices=[]):
        model = init_weights(Flux(cfg.model), "primus", generator=gen)
    break_zero_init(model, cfg.break_zero_init_std, generator=gen)
    model = model.to(device=cfg.device, dtype=torch.bfloat16)
    if recipe is not None:
        quantize_model(model, recipe, backend)
    return model


def _dataset(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    data = synthetic_dataset(cfg.model, cfg.samples, cfg.img_tokens, cfg.txt_tokens,
                             torch.Generator().manual_seed(cfg.seed + 1))
    return {k: v.to(cfg.device) for k, v in data.items()}


@torch.no_grad()
def eval_loss(model: nn.Module, cfg: TrainConfig, seed: int = 12345) -> float:
    """The loss on the training data with t and noise from ``seed``: the same draw every call."""
    with seeded_default_rng(seed, cfg.device):  # stochastic-rounding recipes draw from it
        return flow_matching_loss(model, _dataset(cfg), torch.Generator().manual_seed(seed)).item()


def train(model: nn.Module, cfg: TrainConfig, *, master_weights: bool = True) -> TrainResult:
    """``cfg.steps`` AdamW steps on the synthetic dataset; the loss before each step.

    ``master_weights=False`` steps the model's own (bf16) parameters in place: the trap
    this module exists to avoid, kept so a test can show it.
    """
    data = _dataset(cfg)
    noise_gen = torch.Generator().manual_seed(cfg.seed + 2)
    # stochastic-rounding recipes draw from the default generator: seeded, and forked so the
    # caller's stream is left as it was
    with seeded_default_rng(cfg.seed + 3, cfg.device):
        return _train_steps(model, cfg, data, noise_gen, master_weights)


def _train_steps(model: nn.Module, cfg: TrainConfig, data: dict[str, torch.Tensor],
                 noise_gen: torch.Generator, master_weights: bool) -> TrainResult:
    def adamw(params: list[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)

    master = MasterWeights(model, adamw) if master_weights else None
    in_place = None if master_weights else adamw([p for p in model.parameters() if p.requires_grad])
    result = TrainResult(losses=[])
    for step in range(cfg.steps):
        loss = flow_matching_loss(model, data, noise_gen)
        loss.backward()
        if step == 0:
            result.first_grads = {n: (0.0 if p.grad is None else float(p.grad.abs().max()))
                                  for n, p in model.named_parameters()}
        result.losses.append(loss.item())
        if master is not None:
            master.step()
        else:
            in_place.step()
            in_place.zero_grad(set_to_none=True)
    return result


# ---- checks a convergence test makes (raise NumericsError, so a negative control can
# show each one failing) -----------------------------------------------------------------


def window_mean(losses: list[float], start: int, window: int) -> float:
    part = losses[start:start + window] if start >= 0 else losses[start:][:window]
    if len(part) < window:
        raise ValueError(f"window={window}: need at least {window} losses, got {len(losses)}")
    return sum(part) / window


def check_loss_falls(losses: list[float], fraction: float, *, window: int = 5, what: str = "run") -> float:
    """The mean of the last ``window`` losses is at least ``fraction`` below the first
    ``window``'s; returns the relative fall."""
    first, last = window_mean(losses, 0, window), window_mean(losses, -window, window)
    fall = (first - last) / first
    if not fall >= fraction:  # NaN fails too
        raise NumericsError(f"{what}: loss fell by {fall:.1%} (mean of the first {window} steps {first:.4f}, "
                            f"last {window} {last:.4f}); expected at least {fraction:.0%}")
    return fall


def check_tracks(losses: list[float], reference: list[float], band: float, *, what: str = "run") -> float:
    """Every step's loss is within ``band`` (relative) of the reference run's at that step;
    returns the largest relative gap."""
    if len(losses) != len(reference):
        raise ValueError(f"{what}: {len(losses)} losses against {len(reference)} reference losses")
    gaps = [abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True)]
    worst = max(range(len(gaps)), key=lambda i: (math.isnan(gaps[i]), gaps[i]))
    if not gaps[worst] <= band:
        raise NumericsError(f"{what}: step {worst} loss {losses[worst]:.4f} is {gaps[worst]:.1%} from the "
                            f"reference {reference[worst]:.4f}; the band is {band:.1%}")
    return gaps[worst]
