"""Library code leaves the caller's global random stream as it was (issue 16).

Each test draws the caller's state before and after a call and compares the two byte for
byte; a function that reseeds (torch.manual_seed) or draws from the global stream changes
it. The results must still follow from the seeds and generators the caller passed.
"""

from __future__ import annotations

import pytest
import torch

from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.conformance import CHECKS
from mxcheck.flux import Flux, get_config, init_weights
from mxcheck.recipes import RECIPES
from mxcheck.rng import seeded_default_rng
from mxcheck.training import TrainConfig, eval_loss, make_model, train

pytestmark = pytest.mark.emulated


def _caller_stream_unchanged(fn):
    """fn()'s result, asserting torch's CPU generator state is the same after as before."""
    torch.manual_seed(1234)  # the caller's own seed: the test owns the global stream
    before = torch.get_rng_state()
    out = fn()
    assert torch.equal(torch.get_rng_state(), before), "the call moved or reseeded torch's global RNG"
    return out


def test_seeded_default_rng_draws_as_after_manual_seed_and_restores():
    got = _caller_stream_unchanged(lambda: _draw_inside(5))
    want = torch.rand(4, generator=torch.Generator().manual_seed(5))  # torch's own seeding
    assert torch.equal(got, want)


def _draw_inside(seed):
    with seeded_default_rng(seed):
        return torch.rand(4)


def _torch_init(seed):
    model = init_weights(Flux(get_config("flux-tiny")), "torch", generator=torch.Generator().manual_seed(seed))
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_torch_init_with_a_generator_leaves_the_global_stream_and_follows_the_generator():
    # Flux() itself draws from the global stream while it builds; reseed before each model so
    # only init_weights is measured, then compare the state after init_weights alone.
    torch.manual_seed(0)
    model = Flux(get_config("flux-tiny"))
    before = torch.get_rng_state()
    init_weights(model, "torch", generator=torch.Generator().manual_seed(3))
    assert torch.equal(torch.get_rng_state(), before), "init_weights(scheme='torch') moved the global RNG"
    first, again, other = _torch_init(3), _torch_init(3), _torch_init(4)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_eval_loss_and_train_leave_the_global_stream_and_repeat():
    cfg = TrainConfig(steps=2)
    model = make_model(cfg)
    loss = _caller_stream_unchanged(lambda: eval_loss(model, cfg))
    assert loss == eval_loss(model, cfg)
    runs = [_caller_stream_unchanged(lambda: train(make_model(cfg, "nvfp4"), cfg).losses) for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("check", ["repeatable", "sr_seeded", "poison_output"])
def test_conformance_checks_leave_the_global_stream(check):
    # nvfp4 rounds its gradients stochastically: the checks seed the default generator for it
    outcome = _caller_stream_unchanged(
        lambda: CHECKS[check](EmulatedBackend(), RECIPES["nvfp4"], torch.Generator().manual_seed(0)))
    assert outcome is None
