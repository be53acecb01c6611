"""brevitas FP8 per tensor: one Inf in the tensor makes every value NaN.

effect: a tensor with a single Inf (an overflowed activation) is returned as all NaN by the OCP e4m3 per-tensor quantizer, instead of its finite values quantized and the Inf saturated
cause: quant/float_quant_ocp.py:143 Fp8e4m3OCPWeightPerTensorFloat takes the scale from the tensor's absmax (quant/float_base.py:44-48, 'stats' over 'max', FloatScaling): Inf / 448 = Inf; core/quant/float.py:69 x / Inf = 0 (Inf / Inf = NaN) and :79 0 * Inf = NaN
recipe: fp8-tensorwise (Fp8e4m3OCPWeightPerTensorFloat on QuantLinear)
"""

import sys
import warnings

import torch

warnings.simplefilter("ignore")  # brevitas' deprecation notices at import
from brevitas.nn import QuantLinear  # noqa: E402
from brevitas.quant import Fp8e4m3OCPWeightPerTensorFloat  # noqa: E402

x = torch.full((1, 32), 1.0)
x[0, 0] = float("inf")
layer = QuantLinear(32, 1, bias=False, weight_quant=Fp8e4m3OCPWeightPerTensorFloat)
with torch.no_grad():
    layer.weight.copy_(x)
    v = layer.quant_weight().value
if v.isnan().all():
    print(f"defect: one Inf -> {v.isnan().sum().item()} of 32 values NaN")
    sys.exit(1)
print(f"fixed: one Inf -> 1.0 becomes {v[0, 1].item()}")
