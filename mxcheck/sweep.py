"""The full-Flux sweep: every unique replaced-linear shape through each recipe.

For each unique (in_features, out_features, tokens) of the Flux shape table and each
recipe, one quantized linear runs forward and backward on the chosen backend (the oracle's
quantization, the backend's GEMMs) and its fwd, dgrad, wgrad and bias gradient are compared
by SNR with float64 truth computed from the same bf16 inputs. On a hardware backend the
same linear also runs through the reference Function (the oracle's GEMM on the same
quantized operands) and the report records whether the bits agree.

On a CPU the token count is scaled down (``CPU_TOKENS``) so the defaults finish in about
two minutes; the report's environment says so (``sweep.tokens_scaled_down``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mxcheck import backends
from mxcheck.flux.config import get_config
from mxcheck.flux.shapes import LinearShape, flux_linear_shapes
from mxcheck.functions import make_delayed_states, quant_linear
from mxcheck.metrics import compare, snr_db
from mxcheck.recipes import GEMM_DIRECTIONS, OPERANDS, Recipe, get_recipe
from mxcheck.report import Record, Report
from mxcheck.report.environment import collect_environment
from mxcheck.thresholds import linear_floor

__all__ = [
    "AUTO_ORDER",
    "CPU_TOKENS",
    "DEFAULT_RECIPES",
    "SweepCase",
    "pick_backend",
    "run_sweep",
    "sweep_cases",
]

DEFAULT_RECIPES = ("mxfp4", "mxfp6", "fp8", "mxfp8")
CPU_TOKENS = 256  # M of every linear on a CPU (MXFP6 needs a multiple of 256)
AUTO_ORDER = ("triton", "torch", "emulated")  # --backend auto: first usable that supports the recipe
TEST_ID = "mxcheck sweep"


@dataclass(frozen=True)
class SweepCase:
    """One unique linear shape: its widths, its token count and the layers that share it."""

    in_features: int
    out_features: int
    tokens: int
    layers: tuple[str, ...]

    @property
    def label(self) -> str:
        """The layers as block-index patterns: ``double_blocks.*.img_attn.qkv + ...``."""
        patterns = dict.fromkeys(_block_pattern(name) for name in self.layers)
        return " + ".join(patterns)

    def gemms(self) -> dict[str, tuple[int, int, int]]:
        i, o, t = self.in_features, self.out_features, self.tokens
        return {"fwd": (t, o, i), "dgrad": (t, i, o), "wgrad": (o, i, t), "bgrad": (t, o, 1)}


def _block_pattern(name: str) -> str:
    # double_blocks.7.img_mlp.0 -> double_blocks.*.img_mlp.0 (only the block index varies)
    parts = name.split(".")
    if len(parts) > 1 and parts[0].endswith("_blocks") and parts[1].isdigit():
        parts[1] = "*"
    return ".".join(parts)


def sweep_cases(rows: Sequence[LinearShape], tokens: int | None = None) -> list[SweepCase]:
    """Unique shapes of ``rows``; ``tokens`` overrides every linear's M (the CPU scale-down)."""
    cases: dict[tuple[int, int, int], list[str]] = {}
    for row in rows:
        key = (row.linear.in_features, row.linear.out_features, tokens or row.tokens)
        cases.setdefault(key, []).append(row.name)
    return [SweepCase(i, o, t, tuple(names)) for (i, o, t), names in cases.items()]


def pick_backend(spec: str, recipe: Recipe) -> Any:
    """The backend to run ``recipe`` on: ``spec`` itself, or for "auto" the first of
    ``AUTO_ORDER`` that is usable here and supports the recipe."""
    if spec != "auto":
        backend = backends.get(spec)
        ok, why = backend.available()
        if not ok:
            raise ValueError(f"backend={spec!r} is not usable here: {why}")
        return backend
    for name in AUTO_ORDER:
        backend = backends.get(name)
        if backend.available()[0] and backend.supports(recipe)[0]:
            return backend
    raise AssertionError("the emulated backend supports every recipe")  # pragma: no cover


def _inputs(case: SweepCase, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """bf16 x, W (scaled 1/sqrt(K)), b and dY, drawn on the generator's device."""
    m, n, k = case.tokens, case.out_features, case.in_features

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=gen.device) * scale).to(torch.bfloat16)

    return {"x": randn(m, k), "w": randn(n, k, scale=k**-0.5), "b": randn(n, scale=0.1), "dy": randn(m, n)}


def _truth(t: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """fwd, dgrad, wgrad, bgrad of the bf16 inputs. float32 truth (CPU) sits more than 100 dB
    above any recipe here: products of bf16 values are exact and K-term sums lose ~sqrt(K) ulps."""
    x, w, b, dy = (t[name].to(dtype) for name in ("x", "w", "b", "dy"))
    return {"fwd": x @ w.T + b, "dgrad": dy @ w, "wgrad": dy.T @ x, "bgrad": dy.sum(0)}


DELAYED_STEPS = 3  # a delayed-scaling recipe runs this many steps; the last one is recorded


def _run_linear(t: dict[str, torch.Tensor], recipe: Recipe, layer: str, gemm: Any,
                seed: int, linear: Callable[..., torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """One step, or for a delayed-scaling recipe DELAYED_STEPS steps on fresh amax
    histories (the first step runs at scale 1); the last step's results. ``linear``: a
    backend's own whole linear (TransformerEngine, torchao), else the reference Function
    with ``gemm``."""
    states = make_delayed_states(recipe) if any(recipe.spec(op).scaling == "delayed" for op in OPERANDS) else None
    for _ in range(DELAYED_STEPS if states else 1):
        x, w, b = (t[name].detach().clone().requires_grad_(True) for name in ("x", "w", "b"))
        gen = torch.Generator().manual_seed(seed)  # the same SR bits for backend and reference
        if linear is not None:
            y = linear(x, w, b, recipe, **({"states": states} if states else {}))
        else:
            y = quant_linear(x, w, b, recipe, layer=layer, generator=gen, gemm=gemm, states=states)
        y.backward(t["dy"].to(y.dtype))
    return {"fwd": y.detach(), "dgrad": x.grad, "wgrad": w.grad, "bgrad": b.grad}


def _snr_record(case: SweepCase, recipe: Recipe, backend: str, direction: str, got: torch.Tensor,
                ref: torch.Tensor, threshold: float, layer: str) -> Record:
    c = compare(got, ref)
    m, n, k = case.gemms()[direction]
    return Record(test_id=TEST_ID, backend=backend, recipe=recipe.name, layer=layer, m=m, n=n, k=k,
                  direction=direction, kind="snr", snr_db=c.snr_db, threshold_db=threshold,
                  cosine=c.cosine, max_abs_error=c.max_abs_error, passed=c.snr_db >= threshold,
                  extra={"layers": list(case.layers)})


def _bitwise_record(case: SweepCase, recipe: Recipe, backend: str, direction: str, got: torch.Tensor,
                    ref: torch.Tensor, layer: str) -> Record:
    mismatches = int((got.view(torch.int16) != ref.view(torch.int16)).sum()) if got.dtype == torch.bfloat16 \
        else int((got != ref).sum())
    m, n, k = case.gemms()[direction]
    # Informational: a different accumulation order may legitimately flip output roundings.
    return Record(test_id=f"{TEST_ID} vs reference Function", backend=backend, recipe=recipe.name,
                  layer=layer, m=m, n=n, k=k, direction=direction, kind="bitwise",
                  snr_db=snr_db(got, ref), bit_equal=mismatches == 0, mismatches=mismatches,
                  total=got.numel(), passed=True, extra={"layers": list(case.layers)})


def _case_records(case: SweepCase, recipe: Recipe, be: Any, t: dict[str, torch.Tensor],
                  truth: dict[str, torch.Tensor], seed: int) -> list[Record]:
    """One (shape, recipe) on backend ``be``: an SNR record per direction against truth and,
    for a backend other than the oracle, a bitwise record per GEMM against the reference Function."""
    layer = case.label
    hardware = be.name != "emulated"
    gemm = getattr(be, "gemm", None) if hardware else None
    linear = be.linear if hardware and gemm is None else None  # a whole-linear backend
    got = _run_linear(t, recipe, layer, gemm, seed, linear)
    records = [_snr_record(case, recipe, be.name, direction, got[direction], ref, linear_floor(recipe, direction),
                           layer) for direction, ref in truth.items()]
    if hardware:
        ref_out = _run_linear(t, recipe, layer, None, seed)
        records += [_bitwise_record(case, recipe, be.name, direction, got[direction], ref_out[direction], layer)
                    for direction in GEMM_DIRECTIONS]
    return records


def run_sweep(model: str = "flux-12b", recipes: Sequence[str] = DEFAULT_RECIPES, backend: str = "emulated",
              *, batch: int = 64, img_tokens: int = 256, txt_tokens: int = 256, tokens: int | None = None,
              device: str | None = None, seed: int = 0,
              progress: Callable[[str], None] | None = None) -> Report:
    """Run the sweep and return its report (records, skips, environment with timings).

    ``tokens`` forces every linear's M (default: the shape table's M on CUDA,
    ``CPU_TOKENS`` on a CPU). A recipe that cannot take a shape is listed as skipped with
    the reason, not silently dropped.
    """
    config = get_config(model)
    recipe_objs = [get_recipe(r) for r in recipes]
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if tokens is None and device == "cpu":
        tokens = CPU_TOKENS
    truth_dtype = torch.float32 if device == "cpu" else torch.float64
    cases = sweep_cases(flux_linear_shapes(config, batch, img_tokens, txt_tokens), tokens)
    say = progress or (lambda _msg: None)
    records: list[Record] = []
    skipped: list[dict[str, str]] = []
    used: dict[str, str] = {}
    start = time.perf_counter()
    total = len(cases) * len(recipe_objs)
    gen = torch.Generator(device).manual_seed(seed)  # inputs drawn where they are used
    for ci, case in enumerate(cases):
        t = _inputs(case, gen)
        truth = _truth(t, truth_dtype)
        for ri, recipe in enumerate(recipe_objs):
            step = ci * len(recipe_objs) + ri + 1
            be = pick_backend(backend, recipe)
            used[recipe.name] = be.name
            layer = case.label
            say(f"[{step}/{total} {time.perf_counter() - start:.1f}s] {recipe.name} on {be.name}: {layer} "
                f"M={case.tokens} N={case.out_features} K={case.in_features}")
            try:
                recipe.check_shape(case.tokens, case.out_features, case.in_features, layer)
            except ValueError as e:
                skipped.append({"test_id": f"{TEST_ID}::{recipe.name}::{layer}", "reason": str(e)})
                continue
            records += _case_records(case, recipe, be, t, truth, seed)
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    env = collect_environment(seed, sorted(set(used.values())))
    env["sweep"] = {
        "model": config.name, "batch": batch, "img_tokens": img_tokens, "txt_tokens": txt_tokens,
        "tokens_override": tokens, "tokens_scaled_down": tokens is not None and device == "cpu",
        "device": device, "truth_dtype": str(truth_dtype).removeprefix("torch."), "recipes": list(recipes), "backend_per_recipe": used,
        "unique_shapes": len(cases), "wall_s": round(wall, 2),
    }
    return Report(environment=env, records=records, skipped=skipped)
