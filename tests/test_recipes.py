"""The named recipes hold the facts DESIGN.md states for each stack."""

from __future__ import annotations

import pytest

from mxcheck.recipes import GEMMS, OPERANDS, RECIPES, OperandSpec, Recipe, get_recipe

pytestmark = pytest.mark.emulated

REQUIRED = ("mxfp4", "mxfp4-fp8bwd", "mxfp6", "fp8", "fp8-hybrid", "fp8-delayed", "mxfp8", "nvfp4")


def test_every_required_recipe_exists_and_quantizes_all_six_operands():
    assert set(REQUIRED) <= set(RECIPES)
    for name in REQUIRED:
        recipe = RECIPES[name]
        assert all(recipe.spec(op).quantized for op in OPERANDS), name


def test_gemm_table_pairs_each_operand_once():
    used = [op for a, b, _ in GEMMS.values() for op in (a, b)]
    assert sorted(used) == sorted(OPERANDS)


def test_mxfp4_is_the_primus_local_spec():
    r = RECIPES["mxfp4"]
    assert {r.spec(op).fmt for op in OPERANDS} == {"e2m1"}
    assert {r.spec(op).scale_rule for op in OPERANDS} == {"even"}
    assert [op for op in OPERANDS if r.spec(op).block_2d] == ["w_row", "w_col"]
    assert [op for op in OPERANDS if r.spec(op).hadamard] == ["g_col", "x_col"]  # the wgrad pair
    assert r.g_col.hadamard == "h16x2" and r.x_row.pad_to == 128
    assert r.with_gradient_sr().g_row.rounding == "sr" and r.with_gradient_sr().x_row.rounding == "rne"


def test_mxfp4_fp8bwd_keeps_the_mxfp4_forward_and_an_e5m2_tensorwise_backward():
    r = RECIPES["mxfp4-fp8bwd"]
    assert r.x_row == RECIPES["mxfp4"].x_row and r.w_row == RECIPES["mxfp4"].w_row
    for op in ("g_row", "w_col", "g_col", "x_col"):
        assert (r.spec(op).fmt, r.spec(op).scaling) == ("e5m2", "tensor")


def test_mxfp6_is_aiter_a6w6():
    r = RECIPES["mxfp6"]
    for op in OPERANDS:
        s = r.spec(op)
        assert (s.fmt, s.scale_rule, s.zero_scale, s.rounding, s.hadamard) == ("e2m3", "floor", 127, "half_away", "h32")
    assert r.shape_multiple == 256


def test_fp8_recipes_use_the_documented_formats():
    assert {RECIPES["fp8"].spec(op).fmt for op in OPERANDS} == {"e4m3"}
    hybrid = RECIPES["fp8-hybrid"]
    assert [op for op in OPERANDS if hybrid.spec(op).fmt == "e5m2"] == ["g_row", "g_col"]
    assert {RECIPES["fp8-delayed"].spec(op).scaling for op in OPERANDS} == {"delayed"}
    mxfp8 = RECIPES["mxfp8"]
    assert {(mxfp8.spec(op).fmt, mxfp8.spec(op).scale_rule) for op in OPERANDS} == {("e4m3", "rceil")}


def test_nvfp4_is_te_nvfp4_block_scaling():
    r = RECIPES["nvfp4"]
    assert {r.spec(op).block_size for op in OPERANDS} == {16}
    assert [op for op in OPERANDS if r.spec(op).block_2d] == ["w_row", "w_col"]
    assert [op for op in OPERANDS if r.spec(op).hadamard == "h16_te"] == ["g_col", "x_col"]
    assert [op for op in OPERANDS if r.spec(op).rounding == "sr"] == ["g_row", "g_col"]


def test_shape_constraint_names_the_layer_and_the_bad_dims():
    with pytest.raises(ValueError, match=r"recipe mxfp6 needs M, N, K multiples of 256; layer img_in has "
                                         r"K=64 \(M=4096 N=3072 K=64\)"):
        RECIPES["mxfp6"].check_shape(4096, 3072, 64, layer="img_in")
    RECIPES["mxfp6"].check_shape(4096, 3072, 3072)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"fmt": "e2m1", "scaling": "blocky"}, "scaling='blocky'"),
    ({"fmt": "bf16", "scaling": "mx"}, "needs an MX element format"),
    ({"fmt": "e2m1", "scaling": "tensor"}, "needs an FP8 format"),
    ({"fmt": "e2m1", "scaling": "nvfp4", "block_size": 32}, "blocks of 16"),
    ({"fmt": "e2m1", "scaling": "mx", "scale_rule": "up"}, "scale_rule='up'"),
    ({"fmt": "e2m1", "scaling": "mx", "hadamard": "h17"}, "h17"),
    ({"fmt": "e9m9"}, "e9m9"),
])
def test_bad_specs_raise_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OperandSpec(**kwargs)


def test_unknown_recipe_and_operand_raise():
    with pytest.raises(ValueError, match="recipe='mxfp5' is not known"):
        get_recipe("mxfp5")
    with pytest.raises(ValueError, match="operand='y_row'"):
        Recipe("r").spec("y_row")


def test_nvfp4_1x16_is_plain_nvfp4_on_all_six_copies():
    # NVFP4 as NVIDIA specifies it for inference and QAT: e2m1, 1x16 blocks, ue4m3 block scales
    # with an fp32 tensor scale, RNE, no rotation, no 2D tiles, no stochastic rounding.
    r = get_recipe("nvfp4-1x16")
    assert {(s.fmt, s.scaling, s.block_size, s.block_2d, s.rounding, s.hadamard)
            for s in (r.spec(op) for op in OPERANDS)} == {("e2m1", "nvfp4", 16, False, "rne", None)}


def test_the_built_in_nvfp4_is_te_training_recipe_not_plain_nvfp4():
    r = RECIPES["nvfp4"]
    assert [op for op in OPERANDS if r.spec(op).block_2d] == ["w_row", "w_col"]
    assert [op for op in OPERANDS if r.spec(op).rounding == "sr"] == ["g_row", "g_col"]
    assert [op for op in OPERANDS if r.spec(op).hadamard] == ["g_col", "x_col"]
    assert "TE" in r.source and "nvfp4" in get_recipe("nvfp4-1x16").notes[1]


def test_fp8_tensorwise_is_e4m3_with_te_current_scaling_where_fp8_is_primus_turbos_formula():
    plain, fp8 = get_recipe("fp8-tensorwise"), RECIPES["fp8"]
    assert {(s.fmt, s.scaling, s.scale_formula, s.margin, s.power_of_2)
            for s in (plain.spec(op) for op in OPERANDS)} == {("e4m3", "tensor", "te", 0, False)}
    assert {fp8.spec(op).scale_formula for op in OPERANDS} == {"primus_turbo"}


def test_plain_recipes_are_not_in_the_training_table_and_get_no_sr_variant():
    from mxcheck.recipes import DERIVED_RECIPES, PLAIN_RECIPES

    assert set(PLAIN_RECIPES) == {"nvfp4-1x16", "fp8-tensorwise"}
    assert not set(PLAIN_RECIPES) & set(RECIPES)
    assert "nvfp4-1x16+sr" not in DERIVED_RECIPES
