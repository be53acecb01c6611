"""Quark MX with scale_calculation_mode="floor": the block scale 2^e is a float in the input's dtype, never an E8M0 byte.

effect: a block below 2^-127 keeps a scale no E8M0 byte holds (a float32 MXFP4 block of amax 8.6e-39 is scaled by 2^-129: 4.4e-39 where OCP's clamp to 2^-127 gives 5.9e-39), and where 2^e underflows the input's dtype it becomes float32 eps, 2^-23: a bfloat16 MXFP8 block of amax 1e-38 (2^-135, below bf16's 2^-133) comes back as zeros where OCP keeps it
cause: quark/torch/quantization/observer/observer.py:126-127 scale = torch.pow(2, torch.floor(torch.log2(amax)) - emax) in amax's dtype with no clamp to [-127, 127], then masked_fill(scale == 0.0, eps); kernel/hw_emulation/hw_emulation_interface.py fake_quantize_fp8_per_group_with_scale / fake_quantize_fp4_fp6_per_group_with_scale divide by that float (the default "even" mode clamps: quantization/utils.py even_round)
recipe: ocp-mxfp4, ocp-mxfp8-e4m3 (OCP_MXFP4Spec / OCP_MXFP8E4M3Spec(ch_axis=-1, scale_calculation_mode="floor"))
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _quark import values

x = torch.full((1, 32), 1e-38, dtype=torch.bfloat16)  # a bf16 subnormal: floor(log2) - 8 = -135; OCP clamps to byte 0 (2^-127)
v = values("OCP_MXFP8E4M3Spec", x, ch_axis=-1, scale_calculation_mode="floor")
if v[0, 0].item() == 0.0:  # OCP MX: 1e-38 / 2^-127 = 1.70 -> e4m3 1.75 -> 1.03e-38
    print(f"defect: bfloat16 block of {x[0, 0].item():.3g} -> {v[0, 0].item()} (OCP floor: about 1.03e-38)")
    sys.exit(1)
print(f"fixed: {x[0, 0].item():.3g} -> {v[0, 0].item():.3g}")
