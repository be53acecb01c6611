"""The reference quantized linear and fused MLP: SNR of every recipe and direction against
float64 truth, bit-exactness against the emulated GEMM, shape and determinism properties,
the bf16 main_grad store, and the fused MLP against its unfused composition."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from mxcheck import thresholds
from mxcheck.functions import (
    make_delayed_states,
    quant_linear,
    quant_mlp,
    reset_main_grad_step,
)
from mxcheck.functions.linear import is_fp8_backward
from mxcheck.gemm import emulated_gemm, quantize_operand
from mxcheck.metrics import snr_db
from mxcheck.recipes import LINEAR_DIRECTIONS, OCP_MX_RECIPES, PLAIN_RECIPES, RECIPES

pytestmark = pytest.mark.emulated

M, N, K = 256, 256, 512  # MXFP6 needs every GEMM dim a multiple of 256

# SNR floors (dB) against float64 truth, per recipe and GEMM, at M, N, K above with
# Gaussian X, W ~ N(0, 1/K) and dY. Measured over seeds 0..11 (min-max):
#   mxfp4        fwd 15.5-15.6  dgrad 15.5-15.6  wgrad 16.0-16.1
#   mxfp4-fp8bwd fwd 15.5-15.6  dgrad 22.5-22.6  wgrad 22.5-22.6
#   mxfp6        fwd 28.0       dgrad 28.0       wgrad 28.0
#   fp8, mxfp8   fwd 28.5       dgrad 28.4-28.6  wgrad 28.4-28.6
#   fp8-hybrid, fp8-delayed (2nd step)  fwd 28.5  dgrad 24.5-24.6  wgrad 24.5-24.7
#   nvfp4        fwd 16.7-16.8  dgrad 15.1       wgrad 15.5-15.6
#   bgrad (every recipe: a float32 column sum cast to bf16)  55.3-56.4
# The floors are mxcheck.thresholds' (one table for every test and check), at or above
# DESIGN.md's anchors (MXFP4 > 10, MXFP6 > 24, e4m3 > 25, e5m2/hybrid > 20, bias grad > 35).
SR_RECIPES = [RECIPES["nvfp4"], RECIPES["mxfp4"].with_gradient_sr()]


def test_every_named_recipe_has_floors():
    assert set(thresholds.LINEAR_SNR_FLOORS) == set(RECIPES) | set(PLAIN_RECIPES) | set(OCP_MX_RECIPES)


def inputs(gen: torch.Generator, m: int = M, n: int = N, k: int = K):
    """bf16 X[M,K], W[N,K] ~ N(0, 1/K), b[N] and dY[M,N]: nothing zero-initialised (trap 1)."""
    x = torch.randn(m, k, generator=gen).bfloat16()
    w = (torch.randn(n, k, generator=gen) * k**-0.5).bfloat16()
    b = (torch.randn(n, generator=gen) * 0.1).bfloat16()
    dy = (torch.randn(m, n, generator=gen) * 1e-2).bfloat16()
    return x, w, b, dy


def run(recipe, x, w, b, dy, **kw):
    """(y, dX, dW, db) of quant_linear on fresh leaves."""
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    b = None if b is None else b.clone().requires_grad_()
    y = quant_linear(x, w, b, recipe, **kw)
    y.backward(dy.reshape(y.shape))
    return y.detach(), x.grad, w.grad, None if b is None else b.grad


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


# ------------------------------------------------------------------ SNR against float64 truth


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_each_recipe_reaches_its_snr_floor_against_float64_truth(recipe, gen, numerics):
    # False failure per run < 1e-300: z >= 41 over 60 seeds (mxcheck.false_failure, "functions").
    x, w, b, dy = inputs(gen)
    states = make_delayed_states(recipe)
    if states:
        # Delayed scaling starts from scale 1 and lags its amax by a step (TE): measure
        # the second step, as a training run sees it after warm-up.
        run(recipe, x, w, b, dy, states=states)
    y, dx, dw, db = run(recipe, x, w, b, dy, states=states, generator=gen)
    X, W, G = x.double(), w.double(), dy.double()
    truth = {"fwd": X @ W.T + b.double(), "dgrad": G @ W, "wgrad": G.T @ X, "bgrad": G.sum(0)}
    got = {"fwd": y, "dgrad": dx, "wgrad": dw, "bgrad": db}
    floors = {d: thresholds.linear_floor(recipe, d) for d in LINEAR_DIRECTIONS}
    # trap 1: an all-zero gradient would make every SNR below meaningless
    numerics.context(recipe=recipe, layer="linear", m=M, n=N, k=K).nonzero_grads(_as_params(dx, dw, db))
    for d in LINEAR_DIRECTIONS:
        numerics.context(recipe=recipe, layer="linear", direction=d, m=M, n=N, k=K).snr(
            got[d], truth[d], floors[d])


def _as_params(*grads):
    """(name, tensor-with-.grad) pairs for numerics.nonzero_grads."""
    out = []
    for name, g in zip(("x", "weight", "bias"), grads, strict=True):
        holder = torch.zeros_like(g)
        holder.grad = g
        out.append((name, holder))
    return out


def test_mxfp4_wgrad_hadamard_pair_cancels(gen, numerics):
    # The H16 (+) H16 / 4 pair on g_col and x_col is orthonormal and rotates both wgrad
    # operands along M, so it cancels in the product: with and without it the wgrad is the
    # same product up to quantization noise (one-sided rotation is refused in test_gemm).
    # False failure per run < 1e-300: z >= 94 over 60 seeds (mxcheck.false_failure, "hpair").
    plain = replace(RECIPES["mxfp4"], name="mxfp4-noH", g_col=replace(RECIPES["mxfp4"].g_col, hadamard=None),
                    x_col=replace(RECIPES["mxfp4"].x_col, hadamard=None))
    x, w, b, dy = inputs(gen)
    truth = dy.double().T @ x.double()
    with_h = run("mxfp4", x, w, b, dy)[2]
    without = run(plain, x, w, b, dy)[2]
    ctx = numerics.context(layer="linear", direction="wgrad", m=M, n=N, k=K)
    s_h = ctx.context(recipe="mxfp4").snr(with_h, truth, 12.0).snr_db
    s_plain = ctx.context(recipe="mxfp4-noH").snr(without, truth, 12.0).snr_db
    assert abs(s_h - s_plain) < 2.0, (s_h, s_plain)
    assert not same_bits(with_h, without)  # the rotation did run


# ------------------------------------------------------------------ exactness and shape


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_forward_equals_emulated_gemm_on_the_same_quantized_operands(recipe, gen, numerics):
    r = RECIPES[recipe]
    x, w, b, _ = inputs(gen)
    s1, s2 = make_delayed_states(r), make_delayed_states(r)
    y = quant_linear(x, w, b, r, states=s1)
    qx = quantize_operand(x, r.x_row, state=s2.get("x_row"))
    qw = quantize_operand(w, r.w_row, state=s2.get("w_row"))
    ref = emulated_gemm(qx, qw, out_dtype=r.out_dtype, bias=b)
    numerics.context(recipe=recipe, layer="linear", direction="fwd", m=M, n=N, k=K).bitwise(y, ref)


@pytest.mark.parametrize("recipe", [*RECIPES.values(), SR_RECIPES[1]], ids=lambda r: r.name)
def test_backward_equals_emulated_gemm_on_the_quantized_column_copies(recipe, gen, numerics):
    # SR bits come from the generator in the documented order: g_row, w_col, g_col, x_col.
    x, w, b, dy = inputs(gen)
    s1, s2 = make_delayed_states(recipe), make_delayed_states(recipe)
    _, dx, dw, _ = run(recipe, x, w, b, dy, generator=seeded(5), states=s1)
    # replay the forward's state updates (x_row, w_row), then the backward's quantizations
    for op, t in (("x_row", x), ("w_row", w)):
        if op in s2:
            s2[op].quantize(t)
    g = seeded(5)

    def q(op, t):
        t = t.contiguous()
        spec = recipe.spec(op)
        rand = torch.randint(0, 256, t.shape, dtype=torch.uint8, generator=g) if spec.rounding == "sr" else None
        return quantize_operand(t, spec, rand=rand, state=s2.get(op))

    want_dx = emulated_gemm(q("g_row", dy), q("w_col", w.t()), out_dtype=recipe.out_dtype)
    want_dw = emulated_gemm(q("g_col", dy.t()), q("x_col", x.t()), out_dtype=recipe.out_dtype)
    ctx = numerics.context(recipe=recipe.name, layer="linear", m=M, n=N, k=K)
    ctx.context(direction="dgrad").bitwise(dx, want_dx)
    ctx.context(direction="wgrad").bitwise(dw, want_dw)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_3d_input_equals_its_2d_reshape(recipe, gen):
    x, w, b, dy = inputs(gen)
    states2d, states3d = make_delayed_states(recipe), make_delayed_states(recipe)
    flat = run(recipe, x, w, b, dy, generator=seeded(1), states=states2d)
    lead = run(recipe, x.reshape(2, M // 2, K), w, b, dy.reshape(2, M // 2, N), generator=seeded(1),
               states=states3d)
    assert lead[0].shape == (2, M // 2, N) and lead[1].shape == (2, M // 2, K)
    for a, c in zip(flat, lead, strict=True):
        assert same_bits(a, c.reshape(a.shape))


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_a_changed_weight_changes_the_output(recipe, gen):
    x, w, b, _ = inputs(gen)
    y = quant_linear(x, w, b, recipe, states=make_delayed_states(recipe))
    w2 = w.clone()
    w2[:, :32] *= -1  # one K-block of every output column flips sign
    y2 = quant_linear(x, w2, b, recipe, states=make_delayed_states(recipe))
    assert not torch.equal(y, y2)


def test_mxfp6_refuses_a_shape_off_256_naming_the_layer_and_m(gen):
    x, w, b, _ = inputs(gen, m=100)
    with pytest.raises(ValueError, match=r"mxfp6 needs M, N, K multiples of 256; layer "
                                         r"double_blocks\.0\.img_mlp\.0 has M=100"):
        quant_linear(x, w, b, "mxfp6", layer="double_blocks.0.img_mlp.0")


def test_delayed_recipe_without_states_names_the_layer_and_operand(gen):
    x, w, b, _ = inputs(gen, m=32, n=32, k=64)
    with pytest.raises(ValueError, match=r"layer blocks\.3\.qkv: .*x_row"):
        quant_linear(x, w, b, "fp8-delayed", layer="blocks.3.qkv")


def test_linear_argument_checks_name_the_layer(gen):
    x, w, b, _ = inputs(gen, m=32, n=32, k=64)
    with pytest.raises(ValueError, match=r"layer L: x must be \[\.\.\., K\] with K=64"):
        quant_linear(x[:, :32], w, b, "fp8", layer="L")
    with pytest.raises(ValueError, match=r"layer L: bias must be \[N\]"):
        quant_linear(x, w, b[:8], "fp8", layer="L")
    with pytest.raises(TypeError, match=r"layer L: x\.dtype=torch\.float64"):
        quant_linear(x.double(), w, b, "fp8", layer="L")


# ------------------------------------------------------------------ determinism


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_repeat_calls_are_bit_identical(recipe, gen):
    x, w, b, dy = inputs(gen)
    first = run(recipe, x, w, b, dy, generator=seeded(7), states=make_delayed_states(recipe))
    again = run(recipe, x, w, b, dy, generator=seeded(7), states=make_delayed_states(recipe))
    assert all(same_bits(a, c) for a, c in zip(first, again, strict=True))


@pytest.mark.parametrize("recipe", SR_RECIPES, ids=lambda r: r.name)
def test_stochastic_rounding_follows_the_generator_seed(recipe, gen):
    x, w, b, dy = inputs(gen)
    a = run(recipe, x, w, b, dy, generator=seeded(1))
    same = run(recipe, x, w, b, dy, generator=seeded(1))
    other = run(recipe, x, w, b, dy, generator=seeded(2))
    assert all(same_bits(p, q) for p, q in zip(a, same, strict=True))
    assert same_bits(a[0], other[0])  # SR is on the gradients only: the forward is RNE
    assert not same_bits(a[1], other[1]) and not same_bits(a[2], other[2])


# ------------------------------------------------------------------ wgrad into main_grad


def with_main_grad(w: torch.Tensor, dtype=torch.bfloat16) -> torch.nn.Parameter:
    p = torch.nn.Parameter(w.clone())
    p.main_grad = torch.ones(w.shape, dtype=dtype)  # ones: a store must overwrite, an add would not
    return p


@pytest.mark.parametrize("recipe", ["mxfp4", "mxfp6", "mxfp8"])
def test_fused_wgrad_is_stored_into_main_grad_not_added(recipe, gen, numerics):
    x, w, b, dy = inputs(gen)
    unfused = run(recipe, x, w, b, dy)[2]
    p = with_main_grad(w)
    xx = x.clone().requires_grad_()
    quant_linear(xx, p, b, recipe, fuse_wgrad_into_main_grad=True).backward(dy)
    assert p.grad is None and p.grad_added_to_main_grad is True
    assert bool(unfused.any())
    numerics.context(recipe=recipe, layer="linear", direction="wgrad", m=M, n=N, k=K).bitwise(
        p.main_grad, unfused)


def test_fused_wgrad_refuses_a_second_microbatch_until_the_step_is_reset(gen):
    x, w, b, dy = inputs(gen)
    p = with_main_grad(w)
    quant_linear(x, p, b, "mxfp4", fuse_wgrad_into_main_grad=True).backward(dy)
    with pytest.raises(RuntimeError, match=r"layer img_mlp\.0: wgrad was already stored.*one microbatch"):
        quant_linear(x, p, b, "mxfp4", layer="img_mlp.0", fuse_wgrad_into_main_grad=True).backward(dy)
    reset_main_grad_step(p)
    quant_linear(x, p, b, "mxfp4", fuse_wgrad_into_main_grad=True).backward(dy)
    assert p.grad_added_to_main_grad is True


def test_fused_wgrad_refuses_a_float32_main_grad_naming_layer_and_dtype(gen):
    x, w, b, _ = inputs(gen)
    with pytest.raises(ValueError, match=r"layer proj: weight\.main_grad\.dtype=torch\.float32"):
        quant_linear(x, with_main_grad(w, torch.float32), b, "mxfp4", layer="proj",
                     fuse_wgrad_into_main_grad=True)
    with pytest.raises(ValueError, match=r"layer proj: .*needs weight\.main_grad"):
        quant_linear(x, torch.nn.Parameter(w.clone()), b, "mxfp4", layer="proj",
                     fuse_wgrad_into_main_grad=True)


@pytest.mark.parametrize("recipe", [r for r in RECIPES if is_fp8_backward(RECIPES[r])])
def test_fused_wgrad_refuses_an_fp8_backward(recipe, gen):
    assert recipe in ("mxfp4-fp8bwd", "fp8", "fp8-hybrid", "fp8-delayed", "fp8-rowwise", "fp8-block")
    x, w, b, _ = inputs(gen)
    with pytest.raises(ValueError, match=rf"layer proj: recipe {recipe} has an FP8 backward"):
        quant_linear(x, with_main_grad(w), b, recipe, layer="proj", fuse_wgrad_into_main_grad=True,
                     states=make_delayed_states(recipe))


# ------------------------------------------------------------------ fused MLP


def mlp_inputs(gen: torch.Generator, m: int = 256, c: int = 256, hidden: int = 512):
    x = torch.randn(2, m // 2, c, generator=gen).bfloat16()
    w1 = (torch.randn(hidden, c, generator=gen) * c**-0.5).bfloat16()
    b1 = (torch.randn(hidden, generator=gen) * 0.1).bfloat16()
    w2 = (torch.randn(c, hidden, generator=gen) * hidden**-0.5).bfloat16()
    b2 = (torch.randn(c, generator=gen) * 0.1).bfloat16()
    dy = (torch.randn(2, m // 2, c, generator=gen) * 1e-2).bfloat16()
    return (x, w1, b1, w2, b2), dy


def _mlp_grads(fn, args, dy):
    leaves = [a.clone().requires_grad_() for a in args]
    y = fn(*leaves)
    y.backward(dy)
    return [y.detach(), *(a.grad for a in leaves)]


@pytest.mark.parametrize("recipe", [*RECIPES, SR_RECIPES[1]], ids=lambda r: getattr(r, "name", r))
def test_fused_mlp_equals_the_unfused_composition_bit_for_bit(recipe, gen, numerics):
    # Bound: bit-identical (0 differing bits) in the output and all five gradients. Both
    # paths quantize the same operands with the same GEMMs, draw SR bits from one seed in
    # the same order, and run the same GELU arithmetic: torch's bf16 tanh-GELU (Flux's
    # nn.GELU) computes in float32 and rounds once, which is what gelu_tanh writes out, and
    # autograd's GELU backward is the aten.gelu_backward the fused backward recomputes.
    args, dy = mlp_inputs(gen)
    fused_states = {"fc1": make_delayed_states(recipe), "fc2": make_delayed_states(recipe)}
    s1, s2 = make_delayed_states(recipe), make_delayed_states(recipe)

    def fused(x, w1, b1, w2, b2):
        return quant_mlp(x, w1, b1, w2, b2, recipe, layer="img_mlp", generator=seeded(3), states=fused_states)

    g = seeded(3)

    def unfused(x, w1, b1, w2, b2):
        h = quant_linear(x, w1, b1, recipe, layer="img_mlp.0", generator=g, states=s1)
        h = F.gelu(h, approximate="tanh")
        return quant_linear(h, w2, b2, recipe, layer="img_mlp.2", generator=g, states=s2)

    got, want = _mlp_grads(fused, args, dy), _mlp_grads(unfused, args, dy)
    name = getattr(recipe, "name", recipe)
    where = [("img_mlp", "fwd"), ("img_mlp.0", "dgrad"), ("img_mlp.0", "wgrad"), ("img_mlp.0", "bgrad"),
             ("img_mlp.2", "wgrad"), ("img_mlp.2", "bgrad")]
    for (layer, direction), a, c in zip(where, got, want, strict=True):
        assert bool(c.any()), (layer, direction)  # trap 1
        numerics.context(recipe=name, layer=layer, direction=direction).bitwise(a, c)


def test_fused_mlp_is_close_to_float64_truth(gen, numerics):
    # A sanity floor beside the bit-exactness above: mxfp6 through fc1, GELU and fc2
    # (two GEMMs' noise compounds: a single mxfp6 GEMM gives 28); floor and measurement in
    # mxcheck.thresholds.MODEL_FLOORS. False failure per run < 1e-300: z = 43 over 60 seeds
    # (mxcheck.false_failure, "mlp").
    (x, w1, b1, w2, b2), _ = mlp_inputs(gen)
    X = x.double().reshape(-1, x.shape[-1])
    h = F.gelu(X @ w1.double().T + b1.double(), approximate="tanh")
    truth = (h @ w2.double().T + b2.double()).reshape(*x.shape[:-1], -1)
    y = quant_mlp(x, w1, b1, w2, b2, "mxfp6", layer="img_mlp")
    assert snr_db(y, truth) > 0  # non-vacuous before the recorded check
    numerics.context(recipe="mxfp6", layer="img_mlp", direction="fwd", m=256, n=256, k=256).snr(
        y, truth, thresholds.model_floor("mlp/mxfp6"))


def test_fused_mlp_checks_the_hidden_shape_naming_the_second_linear(gen):
    (x, w1, b1, w2, b2), _ = mlp_inputs(gen)
    with pytest.raises(ValueError, match=r"layer img_mlp\.2: x must be \[\.\.\., K\] with K=256"):
        quant_mlp(x, w1, b1, w2[:, :256], b2, "mxfp8", layer="img_mlp")
