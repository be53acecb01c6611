"""ModelOpt NVFP4: one Inf makes every value of the tensor NaN.

effect: one Inf anywhere in a tensor makes every value of the tensor NaN, the finite blocks too
cause: qtensor/nvfp4_tensor.py:208 weights_scaling_factor_2 = Inf / 2688 = Inf; :195 every finite block's scale is amax / Inf = 0, set to 1.0 by :199; :326 divides each element by 1.0 * Inf, and dequantize multiplies the code by 1.0 * Inf: 0 * Inf
recipe: nvfp4-1x16 (NVFP4_DEFAULT_CFG)
"""

import sys
import warnings

import torch

warnings.simplefilter("ignore")  # torch.jit deprecation notices at modelopt's import
from modelopt.torch.quantization.qtensor import NVFP4QTensor  # noqa: E402

x = torch.linspace(-1.0, 1.0, 32).reshape(1, 32)  # one row, two blocks
x[0, 0] = float("inf")
q, scale, scale_2 = NVFP4QTensor.quantize(x, 16)
values = q.dequantize(torch.float32, scale=scale, double_scale=scale_2, block_sizes={-1: 16})
if values[0, 16:].isnan().all():
    print(f"defect: {values.isnan().sum().item()} of 32 values NaN, the finite block's 16 among them")
    sys.exit(1)
print(f"fixed: the finite block holds {values[0, 16:].isnan().sum().item()} NaN")
