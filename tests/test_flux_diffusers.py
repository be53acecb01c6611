"""from_diffusers / to_diffusers / diffusers_config: a random diffusers FluxTransformer2DModel
loaded into mxcheck's Flux gives the same output; the mapping round-trips bit for bit; the
final layer's (scale, shift) halves must be swapped; key and config errors name the problem."""

from __future__ import annotations

import math

import pytest
import torch

from mxcheck.flux.config import FLUX_TINY, FluxConfig
from mxcheck.flux.diffusers_map import (
    DIFFUSERS_FIXED,
    diffusers_config,
    from_diffusers,
    to_diffusers,
)
from mxcheck.flux.inputs import make_inputs
from mxcheck.flux.model import Flux
from mxcheck.plugin import needs

pytestmark = pytest.mark.emulated

# 2 double + 2 single blocks, 2 heads of 32; in/out/vec/context widths all differ so a
# transposed or misplaced linear cannot load. timestep_dim 256: diffusers' only choice.
CONFIG = FLUX_TINY.with_(name="flux-diffusers-test", in_channels=32, out_channels=16,
                         vec_in_dim=24, context_in_dim=48, depth=2, depth_single_blocks=2,
                         timestep_dim=256)
CONFIGS = {"guidance": CONFIG.with_(guidance_embed=True), "no-guidance": CONFIG}

# Both sides are float32 and the same maths; only the op order differs (three q/k/v GEMMs vs
# one fused, torch.nn.RMSNorm vs BFL's rsqrt form, RoPE as cos/sin vs 2x2 matrices), so any
# difference is rounding. Measured (torch 2.13 CPU, diffusers 0.42.1): bit-identical at this
# size; max |diff| / max |ref| ~4e-7 at hidden 256 and 512, where BLAS blocks the fused and
# split GEMMs differently. 1e-5 leaves >20x margin; a mapping error (no swap, q/k or img/txt
# parts exchanged) moves the output by ~1 of its magnitude.
RTOL = 1e-5


def randomize(model: torch.nn.Module, g: torch.Generator) -> None:
    """Every parameter random, so no mapping can pass by zeros or ones lining up: weights
    N(0, 1/fan_in) (activations stay O(1)), biases N(0, 0.5²), norm weights N(1, 0.5²)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if p.ndim == 2:
                p.copy_(r / math.sqrt(p.shape[1]))
            else:
                p.copy_(0.5 * r + (1.0 if ".norm_" in name else 0.0))


def diffusers_model(config: FluxConfig, g: torch.Generator) -> torch.nn.Module:
    # imported on first use, not at collection: diffusers takes ~2.5 s to import, and every
    # xdist worker collects this module while only one runs each test
    with needs("diffusers"):
        from diffusers import FluxTransformer2DModel
    model = FluxTransformer2DModel(**diffusers_config(config)).eval()
    randomize(model, g)
    return model


def inputs(config: FluxConfig, g: torch.Generator) -> dict[str, torch.Tensor]:
    x = make_inputs(config, batch=2, img_tokens=12, txt_tokens=5, generator=g)
    # random position ids on every axis (BFL's txt ids and image axis 0 are all zero, which
    # would leave part of RoPE untested); one set shared by the batch, as diffusers takes (L, 3)
    x["img_ids"] = torch.randint(0, 32, (12, 3), generator=g).float().expand(2, -1, -1)
    x["txt_ids"] = torch.randint(0, 32, (5, 3), generator=g).float().expand(2, -1, -1)
    return x


def run_diffusers(model: torch.nn.Module, x: dict[str, torch.Tensor]) -> torch.Tensor:
    # diffusers multiplies timestep and guidance by 1000 itself (transformer_flux.py forward),
    # as BFL's timestep_embedding does, so both take t in [0, 1]; ids are 2D (L, 3).
    with torch.no_grad():
        return model(hidden_states=x["img"], encoder_hidden_states=x["txt"],
                     pooled_projections=x["y"], timestep=x["timesteps"],
                     img_ids=x["img_ids"][0], txt_ids=x["txt_ids"][0],
                     guidance=x.get("guidance"), return_dict=False)[0]


def run_flux(config: FluxConfig, state_dict: dict[str, torch.Tensor],
             x: dict[str, torch.Tensor]) -> torch.Tensor:
    flux = Flux(config).eval()
    flux.load_state_dict(state_dict, strict=True)
    with torch.no_grad():
        return flux(**x)


def rel_err(test: torch.Tensor, ref: torch.Tensor) -> float:
    """max |test - ref| over max |ref|."""
    return ((test - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_diffusers_model_loaded_into_flux_gives_the_same_output(config, mxcheck_generator):
    model = diffusers_model(config, mxcheck_generator)
    x = inputs(config, mxcheck_generator)
    ref = run_diffusers(model, x)
    out = run_flux(config, from_diffusers(model.state_dict(), config), x)
    assert out.shape == ref.shape == (2, 12, config.out_channels)
    assert rel_err(out, ref) < RTOL, f"max abs diff {(out - ref).abs().max().item():.3g}"


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_round_trips_are_bit_exact(config, mxcheck_generator):
    sd = diffusers_model(config, mxcheck_generator).state_dict()
    back = to_diffusers(from_diffusers(sd, config), config)
    assert back.keys() == sd.keys()
    for k, v in sd.items():
        assert back[k].dtype == v.dtype, k
        assert torch.equal(back[k].view(torch.int32), v.view(torch.int32)), k
    bfl = from_diffusers(sd, config)
    again = from_diffusers(to_diffusers(bfl, config), config)
    assert again.keys() == bfl.keys()
    assert all(torch.equal(again[k].view(torch.int32), v.view(torch.int32)) for k, v in bfl.items())


def test_final_layer_halves_are_swapped(mxcheck_generator):
    sd = diffusers_model(CONFIG, mxcheck_generator).state_dict()
    bfl = from_diffusers(sd, CONFIG)
    h = CONFIG.hidden_size
    for leaf in ("weight", "bias"):
        scale, shift = sd[f"norm_out.linear.{leaf}"].split(h)  # AdaLayerNormContinuous order
        assert torch.equal(bfl[f"final_layer.adaLN_modulation.1.{leaf}"], torch.cat((shift, scale)))


def test_final_layer_without_the_swap_gives_a_different_output(mxcheck_generator):
    model = diffusers_model(CONFIG, mxcheck_generator)
    x = inputs(CONFIG, mxcheck_generator)
    ref = run_diffusers(model, x)
    bfl = from_diffusers(model.state_dict(), CONFIG)
    for leaf in ("weight", "bias"):  # undo the swap: diffusers' (scale, shift) as BFL's (shift, scale)
        key = f"final_layer.adaLN_modulation.1.{leaf}"
        bfl[key] = torch.cat(bfl[key].chunk(2)[::-1])
    assert rel_err(run_flux(CONFIG, bfl, x), ref) > 100 * RTOL


@pytest.mark.parametrize("direction", ["from_diffusers", "to_diffusers"])
def test_a_missing_key_is_named(direction, mxcheck_generator):
    sd = diffusers_model(CONFIG, mxcheck_generator).state_dict()
    if direction == "to_diffusers":
        sd = from_diffusers(sd, CONFIG)
    fn = {"from_diffusers": from_diffusers, "to_diffusers": to_diffusers}[direction]
    key = sorted(sd)[3]
    del sd[key]
    with pytest.raises(ValueError, match=rf"{direction}: .* 1 missing \[{key}\], 0 unexpected"):
        fn(sd, CONFIG)


@pytest.mark.parametrize("direction", ["from_diffusers", "to_diffusers"])
def test_an_extra_key_is_named(direction, mxcheck_generator):
    sd = diffusers_model(CONFIG, mxcheck_generator).state_dict()
    if direction == "to_diffusers":
        sd = from_diffusers(sd, CONFIG)
    fn = {"from_diffusers": from_diffusers, "to_diffusers": to_diffusers}[direction]
    sd["lora_A.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=rf"{direction}: .* 0 missing \[\], 1 unexpected \[lora_A.weight\]"):
        fn(sd, CONFIG)


def test_a_guidance_model_does_not_load_into_a_config_without_guidance(mxcheck_generator):
    sd = diffusers_model(CONFIGS["guidance"], mxcheck_generator).state_dict()
    with pytest.raises(ValueError, match=r"4 unexpected \[time_text_embed\.guidance_embedder"):
        from_diffusers(sd, CONFIGS["no-guidance"])


def test_a_fused_tensor_of_the_wrong_size_is_named(mxcheck_generator):
    bfl = from_diffusers(diffusers_model(CONFIG, mxcheck_generator).state_dict(), CONFIG)
    bfl["single_blocks.1.linear1.weight"] = bfl["single_blocks.1.linear1.weight"][:-1]
    with pytest.raises(ValueError, match=r"single_blocks\.1\.linear1\.weight.*\(447, 64\).* 448 rows"):
        to_diffusers(bfl, CONFIG)


# Values diffusers cannot express, one per hard-coded field of DIFFUSERS_FIXED.
UNEXPRESSIBLE = {"timestep_dim": 64, "mlp_ratio": 2.0, "theta": 1000, "qkv_bias": False}


def test_every_hard_coded_field_has_an_unexpressible_case():
    assert UNEXPRESSIBLE.keys() == DIFFUSERS_FIXED.keys()


@pytest.mark.parametrize("fn", [diffusers_config, lambda c: from_diffusers({}, c),
                                lambda c: to_diffusers({}, c)],
                         ids=["diffusers_config", "from_diffusers", "to_diffusers"])
@pytest.mark.parametrize(("field", "value"), UNEXPRESSIBLE.items(), ids=UNEXPRESSIBLE.keys())
def test_a_config_diffusers_cannot_express_is_refused(fn, field, value):
    with pytest.raises(ValueError, match=rf"{field}={value!r}, but diffusers' .* fixes {field}="):
        fn(CONFIG.with_(**{field: value}))


def test_diffusers_config_of_flux_12b_dev_is_diffusers_default_but_for_guidance():
    # FluxTransformer2DModel's defaults are Flux 12B (transformer_flux.py __init__)
    kwargs = diffusers_config("flux-12b-dev")
    assert kwargs == {"patch_size": 1, "in_channels": 64, "out_channels": 64, "num_layers": 19,
                      "num_single_layers": 38, "attention_head_dim": 128,
                      "num_attention_heads": 24, "joint_attention_dim": 4096,
                      "pooled_projection_dim": 768, "guidance_embeds": True,
                      "axes_dims_rope": (16, 56, 56)}
