"""A pure-PyTorch Flux transformer (BFL parameter names), its configs and linear shapes."""

from mxcheck.flux.config import (
    CONFIGS,
    FLUX_12B_DEV,
    FLUX_12B_SCHNELL,
    FLUX_535M,
    FLUX_SMALL,
    FLUX_TINY,
    FluxConfig,
    get_config,
)
from mxcheck.flux.diffusers_map import (
    DIFFUSERS_FIXED,
    diffusers_config,
    from_diffusers,
    to_diffusers,
)
from mxcheck.flux.init import SCHEMES, break_zero_init, init_weights, zero_init_linears
from mxcheck.flux.inputs import image_grid, make_inputs
from mxcheck.flux.model import Flux
from mxcheck.flux.quantize import DEFAULT_INCLUDE, QuantLinear, quantize_model, quantized_linears
from mxcheck.flux.shapes import (
    GemmShape,
    LinearInfo,
    LinearShape,
    flux_linear_shapes,
    flux_linears,
    shapes_csv,
    unique_gemms,
)

__all__ = [
    "CONFIGS",
    "DEFAULT_INCLUDE",
    "DIFFUSERS_FIXED",
    "FLUX_12B_DEV",
    "FLUX_12B_SCHNELL",
    "FLUX_535M",
    "FLUX_SMALL",
    "FLUX_TINY",
    "SCHEMES",
    "Flux",
    "FluxConfig",
    "GemmShape",
    "LinearInfo",
    "LinearShape",
    "QuantLinear",
    "break_zero_init",
    "diffusers_config",
    "flux_linear_shapes",
    "flux_linears",
    "from_diffusers",
    "get_config",
    "image_grid",
    "init_weights",
    "make_inputs",
    "quantize_model",
    "quantized_linears",
    "shapes_csv",
    "to_diffusers",
    "unique_gemms",
    "zero_init_linears",
]
