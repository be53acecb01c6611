"""compressed-tensors FP8 per-tensor: a float16 tensor with amax below 1.3e-5 is quantized with scale 2^-10.

effect: a float16 tensor with amax below 1.3e-5 gets the FP8 scale 2^-10 instead of amax / 448 (at amax 1e-6, 30 of 32 values become 0); up to amax 0.027 the scale is a float16 subnormal with fewer bits
cause: quantization/utils/helpers.py:88 computes amax / 448 in the tensor's dtype (0 in float16 below 448 x 2^-25) and :124 replaces 0 by the eps of float16, 2^-10
recipe: fp8-tensorwise (preset FP8)
"""

import sys

import torch
from _ct import fake_quant, qparams

x = torch.linspace(-1e-6, 1e-6, 32, dtype=torch.float16).reshape(1, 32)  # amax 1e-6
values, (_, scale, _, _) = fake_quant(x, "FP8"), qparams(x, "FP8")
if scale.item() == 2.0**-10:
    print(f"defect: scale {scale.item()} (float16 eps), {32 - values.count_nonzero().item()} of 32 values 0")
    sys.exit(1)
print(f"fixed: scale {scale.item():.4g}, {values.count_nonzero().item()} of 32 values nonzero")
