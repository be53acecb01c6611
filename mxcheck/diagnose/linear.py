"""What a linear got wrong: known behaviours of a whole linear layer, run on the failing
check's own inputs and named where they reproduce the kernel's forward output.

Reproduced is judged as the conformance suite judges "same quantized operands": the
kernel's output within SAME_OPERANDS_FLOOR_DB of the behaviour's (SNR), with NaN in the
same places. Everything here runs only after a check has failed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mxcheck.diagnose.behaviour import Attribution, Behaviour, render_attributions
from mxcheck.functions import make_delayed_states, quant_linear
from mxcheck.metrics import snr_db
from mxcheck.recipes import OPERANDS, Recipe
from mxcheck.rng import seeded_default_rng
from mxcheck.thresholds import SAME_OPERANDS_FLOOR_DB

__all__ = ["LINEAR_BEHAVIOURS", "LinearCase", "explain_linear"]


@dataclass(frozen=True)
class LinearCase:
    """A linear's inputs as the failing check fed them. ``previous_w``: the weight of the call
    before (check_weight_change), for behaviours that keep state between calls. ``seed``:
    the default generator's seed both the kernel's call and the behaviours run under (SR).
    ``own_linear``: the backend has a linear of its own; without one (a GEMM or fake-quant
    backend) the reference Function adds the bias, caches nothing and quantizes every call,
    so no behaviour of a linear's own path can be the backend's."""

    recipe: Recipe
    x: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor | None
    previous_w: torch.Tensor | None = None
    seed: int = 0
    own_linear: bool = True


def _reference(case: LinearCase, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The reference Function's forward (a delayed-scaling recipe from fresh states, as a
    first step), under the case's seed."""
    delayed = any(case.recipe.spec(op).scaling == "delayed" for op in OPERANDS)
    with torch.no_grad(), seeded_default_rng(case.seed, x.device):
        return quant_linear(x, w, b, case.recipe, states=make_delayed_states(case.recipe) if delayed else None)


def _bf16_unquantized(case: LinearCase) -> torch.Tensor:
    """x @ w^T + b on bf16 copies, float32 accumulation, a bf16 result: no quantization."""
    def bf16(t: torch.Tensor) -> torch.Tensor:
        return t.detach().bfloat16().float()
    y = bf16(case.x) @ bf16(case.w).T + (0 if case.b is None else bf16(case.b))
    return y.bfloat16().to(case.recipe.out_dtype)


def _bias_dropped(case: LinearCase) -> torch.Tensor | None:
    if case.b is None or not bool(case.b.any()):
        return None
    return _reference(case, case.x, case.w, None)


def _nan_flushed(case: LinearCase) -> torch.Tensor | None:
    if not bool(case.x.isnan().any()):
        return None
    return _reference(case, torch.nan_to_num(case.x, nan=0.0), case.w, case.b)


def _stale_weight(case: LinearCase) -> torch.Tensor | None:
    if case.previous_w is None or torch.equal(case.previous_w, case.w):
        return None
    return _reference(case, case.x, case.previous_w, case.b)


LINEAR_BEHAVIOURS: tuple[Behaviour, ...] = (
    Behaviour("linear-bf16-unquantized", "the linear runs unquantized in bf16 (a config that falls back to BF16 "
              "and still trains)", "linear", _bf16_unquantized,
              seen_in="Primus (PR #1010: an import error turned MXFP4 into a bf16 linear)"),
    Behaviour("linear-bias-dropped", "the bias is dropped (not added to the output)", "linear", _bias_dropped),
    Behaviour("linear-nan-flushed", "NaN inputs flushed to zero before quantizing (a diverging run hidden)",
              "linear", _nan_flushed),
    Behaviour("linear-stale-weight", "a stale cached quantized weight (the previous call's weight used)",
              "linear", _stale_weight),
)


def _same_output(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """NaN in the same places and the rest within SAME_OPERANDS_FLOOR_DB."""
    got, ref = got.detach().double(), ref.detach().double()
    if got.shape != ref.shape or not torch.equal(got.isnan(), ref.isnan()):
        return False
    keep = ~got.isnan()
    return bool(keep.any()) and snr_db(got[keep], ref[keep]) >= SAME_OPERANDS_FLOOR_DB


def explain_linear(got: torch.Tensor, case: LinearCase,
                   behaviours: tuple[Behaviour, ...] = LINEAR_BEHAVIOURS) -> list[str]:
    """Report lines: the behaviours whose forward output on ``case`` the kernel's forward
    output ``got`` reproduces (the whole output is one unit: SNR judges it as one). Every
    behaviour here is one of a linear's own path: none is tried for a backend without one."""
    if not case.own_linear:
        return ["no linear behaviour applies: the backend has no linear of its own (the reference Function adds "
                "the bias and runs the backend's GEMM or quantizer)"]
    found = []
    for behaviour in behaviours:
        want = behaviour.run(case)
        if want is not None and _same_output(got, want):
            found.append(Attribution(behaviour, 1, 1, "forward outputs"))
    return render_attributions(found, 1, 0 if found else 1, "forward outputs")
