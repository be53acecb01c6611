"""Quark MX with scale_calculation_mode="floor" (OCP's rule): the block exponent is a torch.log2 in the input's dtype.

effect: a block whose amax is just below a power of two (float32 1048575.94 = 2^20 - 2^-4; bfloat16 255) gets a scale twice OCP's: the whole block is quantized one mantissa bit coarser (MXFP8 e4m3: 1048575.94 becomes 1048576 where OCP's floor rule gives 917504)
cause: quark/torch/quantization/observer/observer.py:126 scale = torch.pow(2, torch.floor(torch.log2(amax)) - emax): log2(2^20 - 2^-4) rounds to 20.0 in float32 (and log2(255) to 8.0 in bfloat16) before the floor; the default "even" mode (quantization/utils.py even_round) reads the float32 exponent bits instead
recipe: ocp-mxfp8-e4m3 (OCP_MXFP8E4M3Spec(ch_axis=-1, scale_calculation_mode="floor"))
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _quark import values

x = torch.full((1, 32), 1.0)
x[0, 0] = 1048575.9375  # 2^20 - 2^-4, exact in float32; OCP: e = 19 - 8, 1048575.94 / 2^11 saturates to 448: 917504
v = values("OCP_MXFP8E4M3Spec", x, ch_axis=-1, scale_calculation_mode="floor")
if v[0, 0].item() == 1048576.0:
    print(f"defect: float32 amax 2^20 - 2^-4 -> {v[0, 0].item()} (OCP floor: 917504)")
    sys.exit(1)
print(f"fixed: 2^20 - 2^-4 -> {v[0, 0].item()}")
