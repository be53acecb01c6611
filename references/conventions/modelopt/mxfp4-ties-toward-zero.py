"""ModelOpt MXFP4: element ties are rounded toward zero, and a zero is stored as -0.

effect: an MXFP4 element exactly between two e2m1 values is rounded toward zero (0.75 to 0.5, 1.75 to 1.5, 3.5 to 3 times the block scale) where OCP MX rounds to nearest even, and every zero is stored with the sign bit set (code 8)
cause: qtensor/mxfp4_tensor.py:49 the code is the count of bounds strictly below |x| (a tie counts its lower neighbour); :48 sign_bit = (2 - sign(x)) // 2 is 1 for sign(0) = 0
recipe: mx:e2m1:rceil (MXFP4_DEFAULT_CFG; its export, export/quant_utils.py:951)
"""

import sys
import warnings

import torch

warnings.simplefilter("ignore")  # torch.jit deprecation notices at modelopt's import
from modelopt.torch.quantization.qtensor import MXFP4QTensor  # noqa: E402

x = torch.zeros(1, 32)  # one block, scale 2^0 (amax 6)
x[0, :4] = torch.tensor([6.0, 0.75, 1.75, 3.5])
q, scale = MXFP4QTensor.quantize(x, 32)
values = q.dequantize(torch.float32, scale=scale, block_sizes={-1: 32})
codes = torch.stack([q._quantized_data & 0xF, q._quantized_data >> 4], -1).flatten()
if values[0, 1:4].tolist() == [0.5, 1.5, 3.0] or codes[4].item() == 8:
    print(f"defect: 0.75, 1.75, 3.5 -> {values[0, 1:4].tolist()} (nearest even: 1.0, 2.0, 4.0); 0 -> code "
          f"{codes[4].item()}")
    sys.exit(1)
print(f"fixed: 0.75, 1.75, 3.5 -> {values[0, 1:4].tolist()}; 0 -> code {codes[4].item()}")
