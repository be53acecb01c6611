"""The Flux model, its init and zero-init trap, linear replacement and the shape table."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mxcheck import thresholds
from mxcheck.assertions import NumericsError, assert_nonzero_grads
from mxcheck.flux import (
    CONFIGS,
    DEFAULT_INCLUDE,
    FLUX_TINY,
    Flux,
    QuantLinear,
    break_zero_init,
    flux_linear_shapes,
    flux_linears,
    init_weights,
    make_inputs,
    quantize_model,
    quantized_linears,
    shapes_csv,
    unique_gemms,
    zero_init_linears,
)
from mxcheck.flux.model import apply_rope, rope, timestep_embedding
from mxcheck.metrics import snr_db

pytestmark = pytest.mark.emulated


def _model(config="flux-tiny", seed=0, broken=True):
    gen = torch.Generator().manual_seed(seed)
    model = init_weights(Flux(config), "primus", generator=gen)
    if broken:
        break_zero_init(model, generator=gen)
    return model


def _inputs(config="flux-tiny", batch=2, img=16, txt=16, seed=1):
    return make_inputs(config, batch, img, txt, generator=torch.Generator().manual_seed(seed))


# ---- architecture ---------------------------------------------------------------------


# Parameter counts computed independently from BFL's layer list
# (shared/research/flux_and_recipes.md A.2).
@pytest.mark.parametrize(("name", "count"), [("flux-535m", 535_318_336), ("flux-12b-schnell", 11_891_178_560),
                                             ("flux-12b-dev", 11_901_408_320)])
def test_parameter_count_matches_bfl(name, count):
    with torch.device("meta"):
        model = Flux(name)
    assert sum(p.numel() for p in model.parameters()) == count


@pytest.mark.parametrize("name", ["flux-tiny", "flux-small", "flux-535m", "flux-12b-dev"])
def test_linears_match_the_shape_table(name):
    with torch.device("meta"):
        model = Flux(name)
    got = [(n, m.in_features, m.out_features, m.bias is not None)
           for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert got == [(i.name, i.in_features, i.out_features, i.bias) for i in flux_linears(name)]


def test_checkpoint_names_are_bfl():
    with torch.device("meta"):
        keys = set(Flux("flux-12b-dev").state_dict())
    for key in ("img_in.weight", "time_in.in_layer.weight", "time_in.out_layer.bias", "vector_in.in_layer.weight",
                "guidance_in.in_layer.weight", "txt_in.weight", "double_blocks.0.img_mod.lin.weight",
                "double_blocks.18.img_attn.qkv.bias", "double_blocks.0.img_attn.norm.query_norm.scale",
                "double_blocks.0.txt_attn.norm.key_norm.scale", "double_blocks.0.txt_mlp.2.weight",
                "single_blocks.37.linear1.weight", "single_blocks.0.linear2.bias",
                "single_blocks.0.norm.query_norm.scale", "single_blocks.0.modulation.lin.weight",
                "final_layer.linear.weight", "final_layer.adaLN_modulation.1.weight"):
        assert key in keys, key
    assert "double_blocks.19.img_in.weight" not in keys
    assert not any(k.startswith("double_blocks.19") or k.startswith("single_blocks.38") for k in keys)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="axes_dim"):
        FLUX_TINY.with_(axes_dim=(8, 8, 8))
    with pytest.raises(ValueError, match="num_heads"):
        FLUX_TINY.with_(num_heads=3)
    with pytest.raises(ValueError, match="flux-13b"):
        Flux("flux-13b")
    assert CONFIGS["flux-12b"].guidance_embed


def test_rope_rotates_adjacent_pairs_like_complex_multiplication():
    # Independent formulation: (x[2j] + i x[2j+1]) * exp(i * pos * theta**(-2j/d)).
    gen = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 50, (2, 5), generator=gen).float()
    d = 8
    pe = rope(pos, d, 10_000).unsqueeze(1)
    q = torch.randn(2, 3, 5, d, generator=gen)
    rq, rk = apply_rope(q, q.clone(), pe)
    omega = 10_000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.complex(q[..., 0::2].double(), q[..., 1::2].double())
    zr = z * torch.polar(torch.ones_like(omega), pos.double()[:, None, :, None] * omega)
    want = torch.stack([zr.real, zr.imag], dim=-1).reshape(q.shape)
    torch.testing.assert_close(rq.double(), want, atol=1e-5, rtol=1e-5)
    assert torch.equal(rq, rk)


def test_timestep_embedding_cos_first_times_1000():
    t = torch.tensor([0.25])
    emb = timestep_embedding(t, 8)
    freqs = torch.exp(-math.log(10_000) * torch.arange(4) / 4)
    torch.testing.assert_close(emb[0, :4], torch.cos(250 * freqs))
    torch.testing.assert_close(emb[0, 4:], torch.sin(250 * freqs))


def test_guidance_config_requires_guidance():
    model = _model(FLUX_TINY.with_(name="tiny-guided", guidance_embed=True))
    inputs = _inputs(FLUX_TINY.with_(name="tiny-guided", guidance_embed=True))
    inputs.pop("guidance")
    with pytest.raises(ValueError, match="guidance"):
        model(**inputs)


def test_image_output_depends_on_the_text_and_keeps_only_image_tokens():
    # Joint attention reaches the image tokens from the text: changing only the text changes
    # the image output; and the output has exactly the image tokens (text dropped at the end).
    model = _model()
    a = _inputs()
    b = dict(a, txt=a["txt"] + 1.0)
    out_a, out_b = model(**a), model(**b)
    assert out_a.shape == (2, 16, FLUX_TINY.out_channels)
    assert not torch.equal(out_a, out_b)


# ---- init and the zero-init trap ------------------------------------------------------


def test_primus_init_zeroes_the_adaln_zero_linears():
    model = _model(broken=False)
    modules = dict(model.named_modules())
    zero = zero_init_linears(model)
    assert set(zero) == {i.name for i in flux_linears("flux-tiny")
                         if i.name.endswith(("mod.lin", "modulation.lin", "adaLN_modulation.1", "final_layer.linear"))}
    for name in zero:
        assert not modules[name].weight.any() and not modules[name].bias.any(), name
    qkv = modules["double_blocks.0.img_attn.qkv"].weight
    bound = math.sqrt(6 / sum(qkv.shape))
    assert qkv.abs().max() <= bound and qkv.abs().max() > 0.9 * bound  # xavier-uniform
    emb = modules["time_in.in_layer"].weight
    assert 0.015 < float(emb.detach().std()) < 0.025  # N(0, 0.02)


def test_premise_fresh_model_is_inert():
    """DESIGN.md trap 1: with adaLN-Zero the output is exactly zero and every block linear's
    gradient is exactly zero, so a 'grad is not None' check passes whatever the GEMM does."""
    model = _model(broken=False)
    out = model(**_inputs())
    assert not out.any()
    (out - 1.0).square().mean().backward()
    block = [n for n, p in model.named_parameters() if "_blocks." in n and p.grad is not None]
    assert block, "the graph reached no block parameter"
    assert all(not p.grad.any() for n, p in model.named_parameters() if "_blocks." in n)
    with pytest.raises(NumericsError, match="all zeros"):
        assert_nonzero_grads(model, names=["double_blocks.0.img_attn.qkv.weight"])
    assert model.final_layer.linear.weight.grad.any()  # only the output projection learns at step 0


@pytest.mark.parametrize("recipe", ["mxfp4", "fp8", "mxfp8", "nvfp4"])
def test_after_break_every_quantized_linear_gets_a_gradient(recipe):
    model = _model()
    replaced = quantize_model(model, recipe)
    out = model(**_inputs())
    assert out.abs().sum() > 0
    (out - 1.0).square().mean().backward()
    assert_nonzero_grads(model, names=[f"{n}.weight" for n in replaced])


def test_break_zero_init_checks_its_argument():
    with pytest.raises(ValueError, match="std"):
        break_zero_init(_model(broken=False), std=0.0)
    with pytest.raises(ValueError, match="no adaLN"):
        break_zero_init(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(ValueError, match="scheme"):
        init_weights(Flux("flux-tiny"), "kaiming")


# ---- linear replacement ---------------------------------------------------------------


def test_quantize_model_swaps_the_primus_local_spec_linears_only():
    model = _model()
    params_before = {n: p for n, p in model.named_parameters()}
    replaced = quantize_model(model, "mxfp8")
    assert replaced == [i.name for i in flux_linears("flux-tiny") if i.replaced]
    assert set(quantized_linears(model)) == set(replaced)
    # the same Parameter objects under the same names: optimizers and checkpoints still fit
    assert {n: p for n, p in model.named_parameters()} == params_before
    for name, mod in model.named_modules():
        if name.endswith(("mod.lin", "modulation.lin")) or name in ("img_in", "txt_in", "final_layer.linear"):
            assert type(mod) is nn.Linear, name


def test_quantized_model_differs_from_bf16_but_tracks_it():
    model = _model()
    inputs = _inputs()
    ref = model(**inputs).detach()
    quantize_model(model, "mxfp8")
    got = model(**inputs).detach()
    assert not torch.equal(got, ref)  # the GEMMs really changed
    assert snr_db(got, ref) > thresholds.model_floor("flux-tiny/mxfp8")


def test_include_can_add_modulation_linears():
    model = _model()
    replaced = quantize_model(model, "mxfp8", include=(*DEFAULT_INCLUDE, "*mod.lin", "*modulation.lin"))
    assert "double_blocks.0.img_mod.lin" in replaced and "single_blocks.0.modulation.lin" in replaced


def test_quantize_model_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match=r"recipe mxfp6 needs .*256; layer double_blocks.0.img_attn.qkv"):
        quantize_model(_model(), "mxfp6")  # flux-tiny is 64 wide
    with pytest.raises(ValueError, match=r"matched no nn\.Linear"):
        quantize_model(_model(), "mxfp8", include=("nothing.*",))
    with pytest.raises(ValueError, match="recipe"):
        quantize_model(_model(), "mxfp5")
    with pytest.raises(TypeError, match=r"include='single_blocks\.\*': expected an iterable"):
        quantize_model(_model(), "mxfp8", include="single_blocks.*")


def test_quantized_forward_names_the_layer_on_a_bad_token_count():
    model = _model("flux-small")
    quantize_model(model, "mxfp6")
    with pytest.raises(ValueError, match=r"layer double_blocks.0.img_attn.qkv has M=32"):
        model(**_inputs("flux-small", batch=2, img=16, txt=16))


def test_quant_linear_module_is_the_reference_function():
    from mxcheck.functions import quant_linear

    model = _model()
    quantize_model(model, "mxfp4")
    layer = quantized_linears(model)["single_blocks.0.linear1"]
    assert isinstance(layer, QuantLinear)
    x = torch.randn(3, 5, layer.in_features, generator=torch.Generator().manual_seed(2))
    assert torch.equal(layer(x), quant_linear(x, layer.weight, layer.bias, "mxfp4"))


# ---- shape table ----------------------------------------------------------------------


def test_flux_12b_shapes_at_mbs_64():
    rows = flux_linear_shapes("flux-12b", 64, 256, 256)
    assert len(rows) == 19 * 8 + 38 * 2
    by_name = {r.name: r for r in rows}
    qkv = by_name["double_blocks.0.img_attn.qkv"]
    assert [g.mnk for g in qkv.gemms()] == [(16384, 9216, 3072), (16384, 3072, 9216), (9216, 3072, 16384)]
    l2 = by_name["single_blocks.5.linear2"]
    assert [g.mnk for g in l2.gemms()] == [(32768, 3072, 15360), (32768, 15360, 3072), (3072, 15360, 32768)]
    assert by_name["double_blocks.3.txt_mlp.0"].tokens == 64 * 256
    assert len(unique_gemms(rows)) == 18


def test_shape_table_matches_a_traced_model():
    # Independent check: record the (M, N, K) each replaced linear actually sees in a forward.
    batch, img, txt = 2, 16, 8
    model = _model()
    seen = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            mod.register_forward_hook(lambda m, args, out, name=name: seen.__setitem__(
                name, (args[0].numel() // m.in_features, m.out_features, m.in_features)))
    model(**_inputs(batch=batch, img=img, txt=txt))
    rows = flux_linear_shapes("flux-tiny", batch, img, txt, replaced_only=False)
    assert {r.name: r.gemm("fwd").mnk for r in rows} == seen


def test_shapes_csv_and_argument_errors():
    text = shapes_csv(flux_linear_shapes("flux-535m", 1, 256, 256))
    lines = text.splitlines()
    assert lines[0] == "layer,stream,direction,M,N,K"
    assert len(lines) == 1 + 10 * 3
    assert "single_blocks.0.linear1,joint,wgrad,21504,3072,512" in lines
    with pytest.raises(ValueError, match="batch=0"):
        flux_linear_shapes("flux-12b", 0, 256, 256)
    with pytest.raises(ValueError, match="direction"):
        flux_linear_shapes("flux-12b", 1, 1, 1)[0].gemm("bgrad")
