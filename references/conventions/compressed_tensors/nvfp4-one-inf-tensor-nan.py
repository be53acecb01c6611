"""compressed-tensors NVFP4: one Inf makes every value of the tensor NaN.

effect: one Inf anywhere in a tensor makes every value of the tensor NaN, the finite blocks too
cause: quantization/utils/helpers.py:344 generate_gparam gives 2688 / Inf = 0, which :351 (nan_to_num) keeps; lifecycle/forward_helpers.py:185 divides each block scale by that 0 and :203 multiplies the codes by Inf
recipe: nvfp4-1x16 (preset NVFP4)
"""

import sys

import torch
from _ct import fake_quant

x = torch.linspace(-1.0, 1.0, 32).reshape(1, 32)  # one row, two blocks
x[0, 0] = float("inf")
values = fake_quant(x, "NVFP4")
if values[0, 16:].isnan().all():
    print(f"defect: {values.isnan().sum().item()} of 32 values NaN, the finite block's 16 among them")
    sys.exit(1)
print(f"fixed: the finite block holds {values[0, 16:].isnan().sum().item()} NaN")
