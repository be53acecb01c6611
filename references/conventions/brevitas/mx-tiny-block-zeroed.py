"""brevitas MX: a block with amax below 2^-33 gets the scale 1e-10 / 2^emax, no power of two: its values are lost.

effect: a float32 block with amax below 1.2e-10 (2^-33) is quantized with a scale no E8M0 byte holds: in MXFP8 e4m3 a block of 1e-20 becomes 0 (OCP keeps it), in e5m2 its values leave the MX grid
cause: core/scaling/runtime.py:237 builds _RestrictClampValue(min_val=scaling_min_val), and its forward (core/restrict_val.py:56-59) clamps after the power-of-two restriction: 2^floor(log2 amax) below scaling_min_val = 1e-10 (quant/float_base.py:24) becomes 1e-10
recipe: ocp-mxfp8-e4m3 (MXFloat8e4m3Act, group_dim=-1)
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _brevitas import mx_values

v = mx_values(torch.full((1, 32), 1e-20))  # OCP: scale 2^(floor(log2 1e-20) - 8) = 2^-75, 1e-20 kept to 3 bits
if v.count_nonzero().item() == 0:
    print("defect: float32 block of 1e-20 -> all 0 (OCP MXFP8: about 1e-20)")
    sys.exit(1)
print(f"fixed: 1e-20 -> {v[0, 0].item():.4g}")
