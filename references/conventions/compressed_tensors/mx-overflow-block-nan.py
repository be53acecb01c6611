"""compressed-tensors MX: a block with amax at or above 1.75 * 2^emax of its dtype becomes NaN.

effect: every block with amax at or above 1.75 x 2^emax of its dtype (57344 in float16, 2.98e38 in float32 and bfloat16) is stored with scale byte 127 and its values are NaN
cause: quantization/utils/mxfp_utils.py:125 round_to_power_2 carries the amax into the all-ones exponent (Inf), :152 gives byte Inf (255 after helpers.py:108), :68 scale 2^128 = Inf; compressors/mx_utils.py:29 casts floor(log2(Inf)) to int32 (INT_MIN) and wraps to byte 127; the fake-quant multiplies 0 by Inf
recipe: mxfp4-1x32 (preset MXFP4), mx:e4m3:even (preset MXFP8A16)
"""

import sys

import torch
from _ct import compress_mx_scale, fake_quant, qparams

x = torch.linspace(-60000.0, 60000.0, 32, dtype=torch.float16).reshape(1, 32)  # one block, amax 60000
values, (_, scale, _, _) = fake_quant(x, "MXFP4"), qparams(x, "MXFP4")
byte = compress_mx_scale(scale, torch.uint8).item()
if values.isnan().all():
    print(f"defect: float16 block with amax 60000: every value NaN, scale byte {byte} (OCP MX: 2^14, byte 141)")
    sys.exit(1)
print(f"fixed: {values.isnan().sum().item()} of 32 values NaN, scale byte {byte}")
