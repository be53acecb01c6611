"""mxcheck.assertions: every helper passes a good case and fails the case it exists for."""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch

from mxcheck.assertions import (
    NumericsError,
    assert_bitwise_equal,
    assert_deterministic,
    assert_nonzero_grads,
    assert_snr,
    assert_within_rounding,
    count_graph_breaks,
    ulp,
)
from mxcheck.report.recorder import Numerics
from mxcheck.report.schema import Record

pytestmark = pytest.mark.emulated

CONTEXT = {"backend": "triton", "recipe": "mxfp4", "layer": "double_blocks.0.img_mlp.2",
           "direction": "wgrad", "m": 64, "n": 32, "k": 128}
WHERE = "backend=triton recipe=mxfp4 layer=double_blocks.0.img_mlp.2 wgrad M=64 N=32 K=128"


def _bits(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).to(torch.int32).view(torch.float32)


# ----------------------------------------------------------------------------- SNR


def _noisy(gen: torch.Generator, scale: float) -> tuple[torch.Tensor, torch.Tensor, float]:
    """ref, ref + noise, and their SNR computed here in float64."""
    ref = torch.randn(4096, generator=gen, dtype=torch.float64)
    noise = scale * torch.randn(4096, generator=gen, dtype=torch.float64)
    snr = 10 * math.log10(float((ref**2).sum()) / float((noise**2).sum()))
    return ref, ref + noise, snr


def test_assert_snr_passes_above_threshold_and_returns_what_it_measured(gen):
    ref, test, snr = _noisy(gen, 0.1)
    got = assert_snr(test, ref, snr - 0.5)
    assert got.passed and got.snr_db == pytest.approx(snr, abs=1e-9)
    assert got.threshold_db == snr - 0.5 and 0.99 < got.cosine <= 1.0
    assert got.max_abs_error == pytest.approx(float((test - ref).abs().max()))
    assert len(got.worst) == 5 and got.worst[0][0] == (int((test - ref).abs().argmax()),)
    assert got.to_record_fields()["snr_db"] == got.snr_db and got.total == 4096


def test_assert_snr_fails_half_a_db_below_threshold(gen):
    ref, test, snr = _noisy(gen, 0.1)
    threshold = snr + 0.5
    head = f"SNR {snr:.1f} dB < {threshold:.1f} dB: {WHERE}; 4,096 of 4,096 elements differ"
    with pytest.raises(NumericsError, match=re.escape(head)) as info:
        assert_snr(test, ref, threshold, context=CONTEXT)
    assert "largest errors: [" in str(info.value) and "cosine 0.99" in str(info.value)


def test_assert_snr_fails_an_all_zero_comparison_as_vacuous():
    zeros = torch.zeros(8, 16)
    with pytest.raises(NumericsError, match=r"SNR comparison is vacuous: test and ref are all "
                                            r"zero \(128 elements\).*zero-init"):
        assert_snr(zeros, zeros.clone(), -100.0)


def test_assert_snr_fails_a_nan_snr(gen):
    ref = torch.randn(64, generator=gen)
    test = ref.clone()
    test[3] = math.nan
    with pytest.raises(NumericsError, match=r"SNR is NaN \(threshold 10\.0 dB\): test has 1 NaN"):
        assert_snr(test, ref, 10.0)


# ----------------------------------------------------------------------------- bits


def test_assert_bitwise_equal_passes_identical_bits(gen):
    x = torch.randn(32, generator=gen).bfloat16()
    assert assert_bitwise_equal(x, x.clone()).equal


def test_assert_bitwise_equal_fails_a_one_ulp_bf16_difference(gen):
    ref = torch.ones(4, 16, dtype=torch.bfloat16)
    test = ref.clone()
    test[2, 5] = torch.nextafter(ref[2, 5], torch.tensor(2.0, dtype=torch.bfloat16))
    msg = (rf"1 of 64 elements differ bitwise \(bf16, max 1 ulp\): {WHERE}; shape \[4, 16\]\n"
           r"first 1:\n  \[2, 5\]: test 0x3f81 ref 0x3f80 \(1\.0078125 vs 1\.0\)")
    with pytest.raises(NumericsError, match=msg):
        assert_bitwise_equal(test, ref, context=CONTEXT)


@pytest.mark.parametrize(("test_bits", "ref_bits"), [
    (0x7FC00001, 0x7FC00000),  # NaN payload
    (0xFFC00000, 0x7FC00000),  # NaN sign
    (0x80000000, 0x00000000),  # -0 against +0
], ids=["nan-payload", "nan-sign", "negative-zero"])
def test_assert_bitwise_equal_sees_differences_equal_values_hide(test_bits, ref_bits):
    test, ref = _bits([0x3F800000, test_bits]), _bits([0x3F800000, ref_bits])
    with pytest.raises(NumericsError, match=rf"(?s)1 of 2 elements differ bitwise \(float32, max .*"
                                            rf"\[1\]: test 0x{test_bits:08x}"):
        assert_bitwise_equal(test, ref)
    assert assert_bitwise_equal(test, test.clone()).equal  # the same NaN bits are equal


def test_assert_bitwise_equal_measures_float32_ulps():
    ref = torch.tensor([1.0, -2.0])
    test = torch.nextafter(ref, torch.tensor([9.0, -9.0]))
    with pytest.raises(NumericsError, match=r"2 of 2 elements differ bitwise \(float32, max 1 ulp\)"):
        assert_bitwise_equal(test, ref)


def test_assert_bitwise_equal_decodes_codes_with_a_format():
    ref = torch.tensor([0x1, 0x2, 0xA], dtype=torch.uint8)  # e2m1: 0.5, 1.0, -1.0
    test = torch.tensor([0x1, 0x3, 0xA], dtype=torch.uint8)  # 1.5 where ref holds 1.0
    with pytest.raises(NumericsError, match=r"\(e2m1, max 1 ulp\).*\n.*\n  \[1\]: test 0x03 ref "
                                            r"0x02 \(1\.5 vs 1\.0\)"):
        assert_bitwise_equal(test, ref, fmt="e2m1")


def test_assert_bitwise_equal_refuses_two_dtypes():
    with pytest.raises(TypeError, match="needs one dtype"):
        assert_bitwise_equal(torch.ones(2), torch.ones(2, dtype=torch.bfloat16))


# ----------------------------------------------------------------------------- rounding

ROUNDING_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.parametrize("dtype", ROUNDING_DTYPES, ids=str)
def test_ulp_is_the_step_to_the_next_value_away_from_zero(dtype, gen):
    bits = torch.finfo(dtype).bits
    raw = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (20000,), generator=gen)
    x = raw.to({16: torch.int16, 32: torch.int32}[bits]).view(dtype)
    x = torch.cat([x, torch.tensor([0.0, torch.finfo(dtype).smallest_normal], dtype=dtype)])
    x = x[x.isfinite() & (x.abs() < torch.finfo(dtype).max)]
    away = torch.nextafter(x, torch.where(x < 0, -math.inf, math.inf).to(dtype))
    step = (away.double() - x.double()).abs()
    assert torch.equal(ulp(x, dtype), step)  # x holds subnormals, zero and every binade


@pytest.mark.parametrize("dtype", ROUNDING_DTYPES, ids=str)
@pytest.mark.parametrize("exact", [1.3, -0.7, 0.0, 3e-41], ids=["normal", "negative", "zero",
                                                                 "tiny"])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_assert_within_rounding_accepts_k_ulps_and_rejects_k_plus_one(dtype, exact, k):
    e = torch.tensor([exact, 5.0], dtype=torch.float64)
    u = ulp(e, dtype)
    ok = e + k * u
    assert assert_within_rounding(ok, e, dtype, k=k).max_ulps == pytest.approx(k)
    bad = e.clone()
    bad[0] += (k + 1) * u[0]
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(NumericsError, match=rf"1 of 2 elements more than {k} {name} ulp from "
                                            rf"exact.*worst \[0\]: .* is {k + 1} ulp"):
        assert_within_rounding(bad, e, dtype, k=k)


def test_assert_within_rounding_takes_equal_infinities_and_nans():
    e = torch.tensor([math.inf, math.nan, 1.0], dtype=torch.float64)
    assert assert_within_rounding(e.clone().bfloat16(), e, torch.bfloat16, k=0).passed
    with pytest.raises(NumericsError, match="worst \\[2\\]: result nan"):
        assert_within_rounding(torch.tensor([math.inf, math.nan, math.nan]), e, torch.bfloat16)


# ----------------------------------------------------------------------------- gradients


def _zero_init_model(gen: torch.Generator) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A tiny MLP whose last layer is zero-initialised, as adaLN-Zero and Flux's final layer."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    for p in model[0].parameters():  # re-drawn from the per-test generator, not the global RNG
        torch.nn.init.normal_(p, generator=gen)
    torch.nn.init.zeros_(model[2].weight)
    torch.nn.init.zeros_(model[2].bias)
    return model, torch.randn(16, 4, generator=gen), torch.randn(16, 2, generator=gen)


def test_zero_init_model_is_inert_at_init(gen):
    model, x, _ = _zero_init_model(gen)
    assert not model(x).any()  # the premise: a fresh model outputs exactly zero


def test_assert_nonzero_grads_fails_zero_gradients_behind_a_zero_init_layer(gen):
    model, x, target = _zero_init_model(gen)
    ((model(x) - target) ** 2).mean().backward()
    with pytest.raises(NumericsError, match=r"2 of 4 parameters have no usable gradient: "
                       r"backend=emulated; 0\.weight: grad is all zeros; 0\.bias: grad is all "
                       r"zeros; a zero-initialised output layer") as info:
        assert_nonzero_grads(model, context={"backend": "emulated"})
    assert "2.weight" not in str(info.value)  # the zero-init layer itself does learn


def test_assert_nonzero_grads_fails_a_missing_gradient_and_says_so(gen):
    model, x, target = _zero_init_model(gen)
    torch.nn.init.normal_(model[2].weight, generator=gen)  # break the zero-init
    model.add_module("unused", torch.nn.Linear(2, 2))
    ((model[:3](x) - target) ** 2).mean().backward()
    with pytest.raises(NumericsError, match=r"2 of 6 parameters .*unused\.weight: grad is None; "
                                            r"unused\.bias: grad is None$"):
        assert_nonzero_grads(model)
    got = assert_nonzero_grads(model, names=["0.weight", "2.weight"])
    assert set(got) == {"0.weight", "2.weight"} and all(v > 0 for v in got.values())


def test_assert_nonzero_grads_refuses_nothing_to_check():
    with pytest.raises(ValueError, match="empty list passes vacuously"):
        assert_nonzero_grads([])
    with pytest.raises(ValueError, match="empty list"):
        assert_nonzero_grads(torch.nn.Linear(2, 2).requires_grad_(False))


# ----------------------------------------------------------------------------- graph breaks


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class _BreaksInBackward(_Scale):
    @staticmethod
    def backward(ctx, g):
        torch._dynamo.graph_break()
        return g * 2


def _clean(x):
    return _Scale.apply(x).sin()


def _item_branch(x):
    return x.cos() if x.sum().item() > 0 else x.sin()


def _explicit_break(x):
    y = x * 2
    torch._dynamo.graph_break()
    return y.sin()


def _backward_break(x):
    return _BreaksInBackward.apply(x).sin()


def test_count_graph_breaks_refuses_inputs_without_requires_grad():
    with pytest.raises(ValueError, match=r"none of the 1 tensor inputs requires grad.*trap 3"):
        count_graph_breaks(_backward_break, torch.ones(4))


def test_graph_break_in_a_backward_is_invisible_without_requires_grad():
    # The trap itself: explain on a detached input never traces the Function's backward.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="torch")
        assert torch._dynamo.explain(_backward_break)(torch.ones(4)).graph_break_count == 0
    torch._dynamo.reset()


def test_count_graph_breaks_is_zero_for_a_clean_function():
    x = torch.ones(4, requires_grad=True)
    assert count_graph_breaks(_clean, x) == 0
    assert x.grad is None  # the backward count takes gradients without accumulating them


def test_count_graph_breaks_sees_module_weights_as_the_autograd_graph():
    assert count_graph_breaks(torch.nn.Linear(4, 3), torch.ones(2, 4), backward=False) == 0


@pytest.mark.parametrize("fn", [_item_branch, _explicit_break], ids=lambda f: f.__name__)
def test_count_graph_breaks_counts_forward_breaks(fn):
    assert count_graph_breaks(fn, torch.ones(4, requires_grad=True), backward=False) >= 1


def test_count_graph_breaks_sees_a_break_only_in_a_custom_backward():
    x = torch.ones(4, requires_grad=True)
    assert count_graph_breaks(_backward_break, x, backward=False) >= 1  # traced with the forward
    assert count_graph_breaks(_backward_break, x) >= 2  # and again under compiled autograd


# ----------------------------------------------------------------------------- determinism


def test_assert_deterministic_passes_a_pure_function_and_returns_its_output(gen):
    x = torch.randn(8, generator=gen)
    out = assert_deterministic(lambda t: {"y": [t.exp(), t.sum()]}, x)
    assert torch.equal(out["y"][0], x.exp())


def test_assert_deterministic_fails_a_function_that_adds_noise(gen):
    x = torch.randn(8, generator=gen)

    def noisy(t):
        return t.sin(), {"noise": t + torch.rand(t.shape)}  # global RNG: nondeterministic

    with pytest.raises(NumericsError, match=rf"not deterministic: run 2 of 3 differs from run 1: "
                       rf"{WHERE}; out\[1\]\['noise'\]: 8 of 8 elements differ; first \[0\]"):
        assert_deterministic(noisy, x, context=CONTEXT)


def test_assert_deterministic_refuses_fewer_than_two_runs():
    with pytest.raises(ValueError, match="runs=1; expected an int >= 2"):
        assert_deterministic(torch.zeros, 2, runs=1)


# ----------------------------------------------------------------------------- Numerics


@pytest.fixture
def recorded() -> list[Record]:
    return []


@pytest.fixture
def numerics(recorded) -> Numerics:
    return Numerics(recorded.append, "tests/x.py::t", recipe="mxfp4").context(
        layer="final_layer.linear", direction="fwd", m=16, n=8, k=32)


def test_numerics_records_a_passing_snr_with_the_context(numerics, recorded, gen):
    ref, test, snr = _noisy(gen, 0.01)
    numerics.snr(test, ref, 30.0)
    (r,) = recorded
    assert (r.test_id, r.backend, r.recipe, r.layer, r.direction, r.m, r.n, r.k, r.kind) == (
        "tests/x.py::t", "emulated", "mxfp4", "final_layer.linear", "fwd", 16, 8, 32, "snr")
    assert r.passed and r.snr_db == pytest.approx(snr) and r.threshold_db == 30.0
    assert re.fullmatch("[0-9a-f]{16}", r.extra["digest"])
    assert r.message.startswith(f"SNR {snr:.1f} dB >= 30.0 dB: backend=emulated recipe=mxfp4")


def test_numerics_records_a_failure_before_raising_it(numerics, recorded, gen):
    ref, test, _ = _noisy(gen, 0.1)
    with pytest.raises(NumericsError) as info:
        numerics.context(backend="triton").snr(test, ref, 40.0)
    (r,) = recorded
    assert not r.passed and r.backend == "triton" and r.message == str(info.value)


def test_numerics_records_every_kind(numerics, recorded, gen):
    x = torch.randn(8, generator=gen)
    numerics.bitwise(x, x.clone())
    numerics.within_rounding(x.bfloat16(), x.double(), torch.bfloat16)
    lin = torch.nn.Linear(2, 2)
    lin(torch.ones(1, 2)).sum().backward()
    numerics.nonzero_grads(lin)
    numerics.deterministic(torch.sin, x)
    with pytest.raises(NumericsError):
        numerics.bitwise(-x, x)
    with pytest.raises(NumericsError):
        numerics.deterministic(lambda: torch.rand(3))
    assert [(r.kind, r.passed) for r in recorded] == [
        ("bitwise", True), ("rounding", True), ("grads", True), ("deterministic", True),
        ("bitwise", False), ("deterministic", False)]
    assert recorded[0].bit_equal and recorded[0].total == 8 and recorded[4].mismatches == 8
    assert recorded[0].extra["digest"] != recorded[4].extra["digest"]
    assert recorded[2].total == 2 and recorded[5].mismatches == 3


def test_numerics_refuses_an_unknown_context_field_and_leaves_its_parent_alone(numerics):
    with pytest.raises(ValueError, match=r"unknown context field\(s\) \['dir'\]"):
        numerics.context(dir="fwd")
    child = numerics.context(layer="x")
    assert child._context["layer"] == "x" and numerics._context["layer"] == "final_layer.linear"


def test_numerics_records_an_empty_recipe_as_none(recorded):
    Numerics(recorded.append, "t").bitwise(torch.ones(2), torch.ones(2))
    assert recorded[0].recipe == "none" and recorded[0].backend == "emulated"
