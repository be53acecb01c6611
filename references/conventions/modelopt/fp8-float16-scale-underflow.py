"""ModelOpt FP8 per-tensor: FP8QTensor computes the scale in the input's dtype; in float16 it underflows.

effect: FP8QTensor.quantize without a calibrated scale (TensorQuantizer's real quantization when no amax is set) computes amax / 448 in the tensor's dtype: for a float16 tensor with amax at or below 1.3e-5 the scale is 0 and every value dequantizes to 0 (a bfloat16 tensor's scale is rounded to bfloat16)
cause: qtensor/fp8_tensor.py:74 scales = amax / 448.0 with amax in the input's dtype (0 in float16 below 448 x 2^-25); :107 divides by it (nn/modules/tensor_quantizer.py:829 passes scales=None without an amax)
recipe: fp8-tensorwise (FP8_DEFAULT_CFG)
"""

import sys
import warnings

import torch

warnings.simplefilter("ignore")  # torch.jit deprecation notices at modelopt's import
from modelopt.torch.quantization.qtensor import FP8QTensor  # noqa: E402

x = torch.linspace(-1e-5, 1e-5, 32, dtype=torch.float16).reshape(1, 32)  # amax 1e-5
q, scale = FP8QTensor.quantize(x)
values = q.dequantize(torch.float32, scale=scale)
if scale.item() == 0:
    print(f"defect: float16 amax 1e-5: scale {scale.item()}, {values.count_nonzero().item()} of 32 values nonzero")
    sys.exit(1)
print(f"fixed: scale {scale.item():.4g}, {values.count_nonzero().item()} of 32 values nonzero")
