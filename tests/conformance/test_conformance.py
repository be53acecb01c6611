"""What the conformance suite (mxcheck/conformance/suite) runs on: every recipe has a floor."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mxcheck import thresholds
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.conformance import DEFAULT_RECIPES
from mxcheck.recipes import OPERANDS, RECIPES, OperandSpec

pytestmark = pytest.mark.emulated

# Every recipe the suite runs by default: a recipe without a floor fails check_linear
# (thresholds.linear_floor raises), it does not drop out of this list.
RECIPE_NAMES = list(DEFAULT_RECIPES)


@pytest.mark.parametrize("recipe", RECIPE_NAMES)
def test_every_conformance_recipe_has_a_floor(recipe):
    assert thresholds.linear_floor(recipe) >= 10.0


def test_a_recipe_name_without_a_floor_is_an_error_not_a_skip():
    with pytest.raises(ValueError, match="no linear SNR floor for recipe 'mxfp8-unfloored'"):
        thresholds.linear_floor("mxfp8-unfloored")


def test_a_recipe_the_tables_do_not_name_gets_its_least_precise_copys_floor():
    # mxfp4's forward (e2m1 x e2m1) and mxfp4-fp8bwd's e5m2 tensorwise backward, under a new name
    mixed = replace(RECIPES["mxfp4-fp8bwd"], name="my-mixed")
    assert thresholds.linear_floor(mixed, "fwd") == thresholds.FORMAT_LINEAR_FLOORS["mx", "e2m1"] == 10.0
    assert thresholds.linear_floor(mixed, "dgrad") == thresholds.FORMAT_LINEAR_FLOORS["fp8", "e5m2"] == 20.0
    assert thresholds.linear_floor(mixed, "bgrad") == thresholds.BGRAD_FLOOR_DB
    with pytest.raises(ValueError, match="quantizes none of"):
        thresholds.linear_floor(replace(RECIPES["mxfp8"], name="bf16-only", **dict.fromkeys(OPERANDS, OperandSpec())))


def test_a_pinned_recipe_has_its_base_recipes_floor():
    assert thresholds.linear_floor("mxfp8@torchao.rceil", "wgrad") == thresholds.linear_floor("mxfp8", "wgrad")


class _NanBlockCodes(EmulatedBackend):
    """The oracle, but inside blocks whose scale byte is NaN it leaves other element codes
    (as torchao's cast does); with ``also`` it changes one code outside such blocks too."""

    def __init__(self, also: str = "") -> None:
        self.also = also

    def quantize(self, x, spec, *, state=None):
        q = super().quantize(x, spec, state=state)
        nan = (q.scales == 0xFF).repeat_interleave(q.block_size, dim=-1)
        codes = torch.where(nan, torch.full_like(q.codes, 0x01), q.codes)
        scales = q.scales
        if self.also == "code":
            first = (~nan).nonzero()[0].tolist()
            codes[tuple(first)] ^= 0x01
        if self.also == "scale":
            scales = torch.where(q.scales == 0xFF, 0xFE, q.scales).to(torch.uint8)
        return replace(q, codes=codes, scales=scales)


@pytest.mark.parametrize(("also", "verdict"), [("", "ok"), ("code", "FAILED"), ("scale", "FAILED")],
                         ids=["codes-in-nan-blocks", "a-code-elsewhere", "the-nan-scale-byte"])
def test_codes_inside_nan_scaled_blocks_are_not_compared_but_everything_else_is(also, verdict, monkeypatch):
    from mxcheck.conformance import basic, run_checks

    # the tiled families hold the NaN blocks (and are what this test ran on before the small ones)
    monkeypatch.setattr(basic, "QUANTIZE_INPUTS", {k: f for k, f in basic.QUANTIZE_INPUTS.items() if f.tiles})

    got = run_checks(_NanBlockCodes(also), RECIPES["mxfp8"], names=["quantize"])["quantize"]
    assert got.startswith(verdict), got
    if verdict == "FAILED":  # the scale is compared first, the codes of finite blocks after it
        assert ("scales" if also == "scale" else "codes") in got, got
