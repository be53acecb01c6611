"""What the reproducers beside this file share: compressed-tensors' preset args and its own
scale, quantize and fake-quant functions, called as its observers and export call them."""

import torch
from compressed_tensors.compressors.mx_utils import compress_mx_scale
from compressed_tensors.quantization import preset_name_to_scheme
from compressed_tensors.quantization.lifecycle.forward import fake_quantize
from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp, generate_gparam

__all__ = ["compress_mx_scale", "fake_quant", "qparams"]


def qparams(x: torch.Tensor, preset: str):
    """(args, scale, zero point, global scale) of preset ``preset`` for x."""
    args = preset_name_to_scheme(preset, ["Linear"]).weights
    global_scale = generate_gparam(x.amin(), x.amax()) if preset == "NVFP4" else None
    scale, zero_point = compute_dynamic_scales_and_zp(x, args, module=None, global_scale=global_scale)
    return args, scale, zero_point, global_scale


def fake_quant(x: torch.Tensor, preset: str) -> torch.Tensor:
    args, scale, zero_point, global_scale = qparams(x, preset)
    return fake_quantize(x, scale, zero_point, args, global_scale=global_scale)
