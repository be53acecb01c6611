"""A quantized linear's step on CUDA does not wait for the GPU.

A synchronizing call (a device-to-host read, a copy from pageable host memory) drains the
GPU's queue, so the host stops running ahead of it: in a training step that is bound by the
host, every such call costs the time of the kernels queued before it. torch's sync debug
mode warns once per synchronizing call; `benchmarks/find_syncs.py` lists them for a whole
Flux step.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from mxcheck import gemm
from mxcheck.functions import quant_linear
from mxcheck.functions.linear import make_delayed_states
from mxcheck.recipes import DERIVED_RECIPES, RECIPES
from mxcheck.scaling.fp8 import DelayedScaling

pytestmark = pytest.mark.cuda

ALL_RECIPES = sorted({**RECIPES, **DERIVED_RECIPES})


def synchronizing_calls(fn) -> list[str]:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    # the prototype notice ("...does not yet detect all synchronizing operations") comes once
    # per process, in whichever test sets the mode first: count only the calls
    return [str(c.message) for c in caught if "called a synchronizing" in str(c.message)]


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_a_linear_forward_and_backward_make_no_synchronizing_call(recipe, gen, monkeypatch):
    pytest.importorskip("triton")
    x = torch.randn(256, 256, generator=gen).bfloat16().cuda().requires_grad_()
    w = (torch.randn(256, 256, generator=gen) / 16).bfloat16().cuda().requires_grad_()
    b = torch.randn(256, generator=gen).bfloat16().cuda().requires_grad_()
    dy = torch.randn(256, 256, generator=gen).bfloat16().cuda()
    states = make_delayed_states(recipe)

    def step() -> None:
        quant_linear(x, w, b, recipe, states=states or None).backward(dy)

    step()  # compile the Triton kernels and make the cached constants first: steady state counts
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()  # the premise: a real step ran
    # Two reads are allowed, each counted here: DelayedScaling holds its amax history on the
    # host (TE's update, run by torch), so each update reads its amax; and a GEMM operand that
    # is neither MX nor tensor- or row-scaled FP8 (fp8-block's 1x128 and 128x128 blocks) is
    # compared with its bf16 cast on the host to pick the bf16 or the float32 GEMM.
    updates, bf16_checks = [], []
    update, as_bf16 = DelayedScaling.update, gemm._as_bf16_exactly
    monkeypatch.setattr(DelayedScaling, "update", lambda self, amax: (updates.append(1), update(self, amax))[1])
    monkeypatch.setattr(gemm, "_as_bf16_exactly", lambda q, d: (bf16_checks.append(1), as_bf16(q, d))[1])
    got = synchronizing_calls(step)
    assert len(got) == len(updates) + len(bf16_checks), got
    # the premise: the allowances are not vacuous, and no other recipe takes them
    assert bool(updates) == (recipe == "fp8-delayed") and bool(bf16_checks) == (recipe == "fp8-block")
