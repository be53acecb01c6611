"""brevitas MX on float16: a block whose scale is below 2^-24 (an all-zero block included) comes back NaN.

effect: a float16 block with amax below 2^-16 = 1.5e-5 (MXFP8 e4m3; 2^-22 for e2m1), or all zeros, is returned as 32 NaN
cause: the scale is computed in the input's dtype: quant/float_base.py:24 scaling_min_val = 1e-10 is 0 in float16, core/scaling/runtime.py:260-264 (RuntimeDynamicGroupStatsScaling) clamps the amax to it and takes 2^floor(log2 amax) / 2^8 in float16, which underflows to 0, and core/quant/float.py:69 divides by it (0 / 0, x / 0)
recipe: ocp-mxfp8-e4m3 (MXFloat8e4m3Act, group_dim=-1)
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _brevitas import mx_values

zero = mx_values(torch.zeros(1, 32, dtype=torch.float16))
small = mx_values(torch.full((1, 32), 1e-5, dtype=torch.float16))  # OCP: scale 2^-25, 1e-5 kept to 3 bits
if zero.isnan().any() or small.isnan().any():
    print(f"defect: float16 zero block -> {zero.isnan().sum().item()} NaN; amax 1e-5 -> {small.isnan().sum().item()} NaN")
    sys.exit(1)
print(f"fixed: zero block -> {zero[0, 0].item()}, amax 1e-5 -> {small[0, 0].item():.4g}")
