"""compressed-tensors MX: a float16 block whose amax is below 4.58e-5 is quantized to 0.

effect: every float16 block with amax below 4.58e-5 (0.75 x 2^-14: a subnormal that does not round up to 2^-14) is quantized to 0 and its scale byte is 127
cause: quantization/utils/mxfp_utils.py:125 round_to_power_2 masks a float16 subnormal to 0, :152 takes log2(0) = -Inf (byte 0 after helpers.py:108), :68-69 turn 2^-127 into float16 0 and helpers.py:124 replaces 0 by uint8's eps, 1 (byte 127)
recipe: mxfp4-1x32 (preset MXFP4), mx:e4m3:even (preset MXFP8A16)
"""

import sys

import torch
from _ct import compress_mx_scale, fake_quant, qparams

x = torch.linspace(-4e-5, 4e-5, 32, dtype=torch.float16).reshape(1, 32)  # one block, amax 4e-5
values, (_, scale, _, _) = fake_quant(x, "MXFP4"), qparams(x, "MXFP4")
byte = compress_mx_scale(scale, torch.uint8).item()
if not values.any() and byte == 127:
    print("defect: float16 block with amax 4e-5 quantized to 0, scale byte 127 (OCP MX: 2^-17, byte 110)")
    sys.exit(1)
print(f"fixed: {values.count_nonzero().item()} of 32 values nonzero, scale byte {byte}")
