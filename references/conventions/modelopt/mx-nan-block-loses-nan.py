"""ModelOpt MXFP8 and MXFP4: a NaN in a block is not kept; the block gets scale byte 0.

effect: a block holding a NaN gets scale byte 0 instead of the NaN byte 255: in MXFP8 the block's other values become +-448 x 2^-127 (about 0), in MXFP4 the whole block reads as 0, so the NaN disappears from the checkpoint
cause: qtensor/mxfp8_tensor.py:58 torch.where(descale > 0, log2, -127) sends a NaN amax to exponent -127 (byte 0); qtensor/mxfp4_tensor.py:75 ceil(max(log2(NaN), -127)) is NaN, cast to uint8 at :80 (byte 0) and the NaN elements cast to code 0
recipe: mxfp8 (MXFP8_DEFAULT_CFG), mx:e2m1:rceil (MXFP4_DEFAULT_CFG)
"""

import sys
import warnings

import torch

warnings.simplefilter("ignore")  # torch.jit deprecation notices at modelopt's import
from modelopt.torch.quantization.qtensor import MXFP4QTensor, MXFP8QTensor  # noqa: E402

x = torch.linspace(-1.0, 1.0, 32).reshape(1, 32)  # one block with one NaN
x[0, 3] = float("nan")
q8, scale8 = MXFP8QTensor.quantize(x)
q4, scale4 = MXFP4QTensor.quantize(x, 32)
values8 = q8.dequantize(torch.float32, scale=scale8, block_sizes={-1: 32})
values4 = q4.dequantize(torch.float32, scale=scale4, block_sizes={-1: 32})
if scale8.item() != 255 or scale4.item() != 255:
    print(f"defect: MXFP8 byte {scale8.item()}, {values8.isnan().sum().item()} of 32 values NaN, max "
          f"{values8.nan_to_num().abs().max().item():.3g}; MXFP4 byte {scale4.item()}, {values4.count_nonzero().item()} "
          "nonzero")
    sys.exit(1)
print(f"fixed: bytes {scale8.item()} and {scale4.item()}")
