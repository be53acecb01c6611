"""compressed-tensors NVFP4: a float16 tensor with amax below 0.041 loses its per-tensor scale.

effect: a float16 tensor with amax below 0.041 gets the per-tensor scale 1 (2688 / amax overflows float16), so each of its blocks with amax below 0.0059 is quantized to 0 and the others keep 1 to 3 bits of block scale
cause: quantization/utils/helpers.py:344 generate_gparam computes 448 * 6 / amax in the tensor's dtype (Inf in float16 below 2688 / 65504) and :351 replaces the Inf by 1.0; the block scales then underflow float8_e4m3fn and :124 replaces 0 by 0.125
recipe: nvfp4-1x16 (preset NVFP4)
"""

import sys

import torch
from _ct import fake_quant

x = torch.linspace(-0.004, 0.004, 16, dtype=torch.float16).reshape(1, 16)  # one block, amax 0.004
values, values32 = fake_quant(x, "NVFP4"), fake_quant(x.float(), "NVFP4")
if not values.any() and values32.any():
    print(f"defect: float16 block with amax 0.004 quantized to 0 (float32: {values32.count_nonzero().item()} of 16 "
          "nonzero)")
    sys.exit(1)
print(f"fixed: {values.count_nonzero().item()} of 16 float16 values nonzero")
