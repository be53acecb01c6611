"""ModelOpt NVFP4: an all-zero tensor is exported with NaN block scales and dequantizes to NaN.

effect: an all-zero tensor (an unused expert, a zero-initialised layer) is exported with NaN block scales and every value dequantizes to NaN
cause: qtensor/nvfp4_tensor.py:208 weights_scaling_factor_2 = 0 / 2688 = 0; :195 block scale 0 / (6 * 0) = NaN, which :199 ([== 0] = 1.0) does not catch and :46 (clamp, float8_e4m3fn cast) keeps NaN
recipe: nvfp4-1x16 (NVFP4_DEFAULT_CFG)
"""

import sys
import warnings

import torch

warnings.simplefilter("ignore")  # torch.jit deprecation notices at modelopt's import
from modelopt.torch.quantization.qtensor import NVFP4QTensor  # noqa: E402

x = torch.zeros(1, 16)  # one all-zero block
q, scale, scale_2 = NVFP4QTensor.quantize(x, 16)
values = q.dequantize(torch.float32, scale=scale, double_scale=scale_2, block_sizes={-1: 16})
if values.isnan().all():
    print(f"defect: all-zero block: block scale {scale.float().item()}, every value NaN")
    sys.exit(1)
print(f"fixed: block scale {scale.float().item()}, values {values.unique().tolist()}")
