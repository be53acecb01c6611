"""Hopper's FP8 tensor-core accumulation (mxcheck.diagnose.accumulation) against real H100
outputs: references/vectors/hopper_fp8_accumulation_h100.json holds rows cut from a capture
of torch._scaled_mm with and without fast accumulation (see references/vectors/README.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.backends.known_bad import FastAccumulation
from mxcheck.conformance._common import _assert_in_bound
from mxcheck.conformance.search import judge
from mxcheck.diagnose.accumulation import (
    EPILOGUES,
    HOPPER_FAST_ACCUMULATION,
    HOPPER_SPLIT_ACCUMULATION,
    TensorCoreAccumulation,
)
from mxcheck.diagnose.outputs import exact_and_bound, outside_bound
from mxcheck.formats import get_format
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import get_recipe
from mxcheck.scaling import FP8Tensor

FIXTURE = Path(__file__).parents[1] / "references" / "vectors" / "hopper_fp8_accumulation_h100.json"
CASES = json.loads(FIXTURE.read_text())["cases"]
MODELS = {"fast": HOPPER_FAST_ACCUMULATION, "split": HOPPER_SPLIT_ACCUMULATION}


def _floats(hex_bits: list[str]) -> torch.Tensor:
    return torch.tensor([int(h, 16) for h in hex_bits], dtype=torch.int64).to(torch.int32).view(torch.float32)


def _operand(case: dict, side: str) -> FP8Tensor:
    codes = torch.tensor([list(bytes.fromhex(row)) for row in case[side]], dtype=torch.uint8)
    inv = _floats(case[f"scale_inv_{side}"])
    inv = inv.reshape(()) if case["granularity"] == "tensor" else inv.reshape(-1, 1)
    fmt = get_format("e5m2" if "e5m2" in case[f"fmt_{side}"] else "e4m3")
    return FP8Tensor(codes, inv, fmt, case["granularity"], 1 / inv, torch.zeros_like(inv))


def _measured(case: dict, mode: str) -> torch.Tensor:
    return _floats(case[mode]).reshape(len(case["a"]), len(case["b"]))


def _id(case: dict) -> str:
    return f"K{case['k']}-{case['family']}-{case['granularity']}-{case['fmt_a'].removeprefix('torch.float8_')}"


@pytest.mark.emulated
@pytest.mark.parametrize("mode", MODELS)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_the_model_gives_the_h100s_bits(case, mode):
    a, b = _operand(case, "a"), _operand(case, "b")
    got = MODELS[mode](a, b, out_dtype=torch.float32)
    assert torch.equal(got.view(torch.int32), _measured(case, mode).view(torch.int32))


@pytest.mark.emulated
def test_the_fixture_tells_the_two_modes_and_float32_apart():
    """The premise: past 128 products fast and split accumulation differ, and neither is the
    exact sum rounded once to float32 (so the test above is not met by a float32 GEMM)."""
    long = [c for c in CASES if c["k"] > 128]
    assert long and all(not torch.equal(_measured(c, "fast"), _measured(c, "split")) for c in long)
    for case in CASES:
        exact, _ = exact_and_bound(_operand(case, "a"), _operand(case, "b"))
        assert not torch.equal(exact.float(), _measured(case, "split"))


@pytest.mark.emulated
def test_the_gemm_check_accepts_the_h100s_split_accumulation():
    """use_fast_accum=False is a correct kernel: no false failure, though some of its outputs
    lie outside the fp32-accumulation bound."""
    outside = 0
    for case in CASES:
        a, b = _operand(case, "a"), _operand(case, "b")
        got = _measured(case, "split")
        outside += int(outside_bound(got, *exact_and_bound(a, b)).sum())
        _assert_in_bound(got, a, b, _id(case))
    assert outside > 0


@pytest.mark.emulated
def test_the_gemm_check_fails_fast_accumulation_and_names_every_output():
    case = next(c for c in CASES if c["k"] == 384)
    a, b = _operand(case, "a"), _operand(case, "b")
    with pytest.raises(NumericsError) as failure:
        _assert_in_bound(_measured(case, "fast"), a, b, _id(case))
    head = str(failure.value).splitlines()[0]
    n = head.split("; ")[1].split(" of ")[0]
    assert f"{n} of {n} differing outputs are reproduced by: FP8 GEMM accumulated in Hopper's tensor cores" \
        in str(failure.value)


@pytest.mark.emulated
def test_the_model_applies_to_fp8_tensorwise_and_rowwise_operands_only():
    case = CASES[0]
    a, b = _operand(case, "a"), _operand(case, "b")
    blockwise = FP8Tensor(a.codes, a.scale_inv.reshape(1, 1).expand(a.codes.shape[0], 1), a.fmt, "block1x128",
                          a.scale, a.amax)
    assert HOPPER_FAST_ACCUMULATION(blockwise, b) is None


@pytest.mark.emulated
@pytest.mark.parametrize(("field", "value", "accepted"), [
    ("group", 0, "positive number of products"),
    ("fraction_bits", 24, "1 to 20"),
    ("promote_every", 48, "multiple of group=32"),
])
def test_a_bad_accumulation_parameter_is_named(field, value, accepted):
    with pytest.raises(ValueError, match=rf"{field}={value}; expected .*{accepted}"):
        TensorCoreAccumulation(**{field: value})


@pytest.mark.sm90
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "split"])
def test_the_model_gives_scaled_mm_bits_on_this_device(fast):
    """torch._scaled_mm itself on this Hopper GPU, K = 1,008 (31.5 k-steps, 7.9 promotions)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(48, 1008, generator=gen) * torch.exp2(torch.randint(-6, 6, (48, 1008), generator=gen).float())
    codes = (x / x.abs().amax() * 200).to(torch.float8_e4m3fn)
    a = FP8Tensor(codes[:16].view(torch.uint8), torch.tensor(0.5), get_format("e4m3"), "tensor", torch.tensor(2.0),
                  torch.tensor(0.0))
    b = replace(a, codes=codes[16:].view(torch.uint8), scale_inv=torch.tensor(0.25), scale=torch.tensor(4.0))
    got = torch._scaled_mm(codes[:16].cuda(), codes[16:].cuda().t(), scale_a=a.scale_inv.cuda(),
                           scale_b=b.scale_inv.cuda(), out_dtype=torch.float32, use_fast_accum=fast).cpu()
    want = MODELS["fast" if fast else "split"](a, b, out_dtype=torch.float32)
    assert torch.equal(want.view(torch.int32), got.view(torch.int32))


class _SplitAccumulation(EmulatedBackend):
    """A correct Hopper FP8 GEMM: the split accumulation model as the kernel, its scales
    applied in the order ``epilogue``."""

    name = "split-accumulation"

    def __init__(self, epilogue: str) -> None:
        self.epilogue = epilogue

    def gemm(self, a, b, *, out_dtype=torch.bfloat16, bias=None):
        return HOPPER_SPLIT_ACCUMULATION(a, b, out_dtype=out_dtype, epilogue=self.epilogue)


@pytest.mark.emulated
def test_the_search_judges_split_accumulation_correct_and_fast_accumulation_not():
    """With scales that are not powers of two, in whichever order the epilogue multiplies."""
    gen = torch.Generator().manual_seed(3)
    tensors = {"a": torch.randn(32, 512, generator=gen), "b": torch.randn(32, 512, generator=gen)}
    a, b = (quantize_operand(tensors[s], get_recipe("fp8").x_row) for s in "ab")
    outputs = [HOPPER_SPLIT_ACCUMULATION(a, b, out_dtype=torch.float32, epilogue=e) for e in EPILOGUES]
    assert outside_bound(outputs[0], *exact_and_bound(a, b)).any()  # the premise: float32's bound rejects it
    assert not torch.equal(outputs[0], outputs[1])  # and the orders differ
    for epilogue in EPILOGUES:
        assert judge("gemm", _SplitAccumulation(epilogue), "fp8", tensors) is None
    assert "Hopper's tensor cores" in judge("gemm", FastAccumulation(), "fp8", tensors)


@pytest.mark.emulated
@pytest.mark.parametrize("mode", MODELS)
def test_a_zero_k_step_adds_nothing_and_is_never_nan(mode):
    """A k-step whose products are all zero on a zero running sum (a zero block of an operand
    at the start of a promotion interval, as the GEMM check's inputs hold) has no exponent to
    truncate below: it must leave the sum what the other k-steps make it (it once gave NaN,
    0 / 0, on the H100 run of the check)."""
    case = next(c for c in CASES if c["k"] >= 64)
    a, b = _operand(case, "a"), _operand(case, "b")
    zero_first = replace(a, codes=a.codes.clone())
    zero_first.codes[:, :32] = 0
    rest = replace(a, codes=a.codes[:, 32:]), replace(b, codes=b.codes[:, 32:])
    got = MODELS[mode](zero_first, b)
    assert not got.isnan().any()
    # without promotion the k-steps after it see the same running sum as a GEMM without it
    if mode == "fast":
        assert torch.equal(got, MODELS[mode](*rest))
