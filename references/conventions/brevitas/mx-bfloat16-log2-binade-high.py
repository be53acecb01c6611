"""brevitas MX on bfloat16: the block exponent is a torch.log2 in bfloat16, one binade high below a power of two.

effect: a bfloat16 block whose amax is just below a power of two (255, 127.5, 0.998, ...) gets a scale twice OCP's: its values are quantized one mantissa bit coarser (255 in MXFP8 e4m3 becomes 256; OCP's floor rule gives 224)
cause: core/scaling/runtime.py:262 takes restrict_init_module(), which core/restrict_val.py:200-201 (PowerOfTwoRestrictValue) makes LogTwo: torch.log2 of the bfloat16 amax (log2(255) = 7.994 rounds to 8.0 in bfloat16); FloorSte (quant/mx_quant_ocp.py:53) then floors 8.0
recipe: ocp-mxfp8-e4m3 (MXFloat8e4m3Act, group_dim=-1)
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _brevitas import mx_values

x = torch.full((1, 32), 3.0, dtype=torch.bfloat16)
x[0, 0] = 255.0  # OCP: e = floor(log2 255) - 8 = -1, 255 / 2^-1 saturates to 448: 224; 3.0 stays 3.0
v = mx_values(x)
if v[0, 0].item() == 256.0:
    print(f"defect: bfloat16 block amax 255 -> {v[0, 0].item()} (OCP floor: 224), 3.0 -> {v[0, 1].item()}")
    sys.exit(1)
print(f"fixed: 255 -> {v[0, 0].item()}, 3.0 -> {v[0, 1].item()}")
