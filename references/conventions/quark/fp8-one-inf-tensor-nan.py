"""Quark FP8 per tensor: one Inf in the tensor makes every value NaN.

effect: a tensor with a single Inf (an overflowed activation) is returned as all NaN by the dynamic FP8 e4m3 per-tensor quantizer, instead of its finite values quantized and the Inf saturated
cause: quark/torch/quantization/observer/observer.py:302 amax is the tensor's absmax (Inf), :179 scale = amax / 448 = Inf, and the fake-quantize op computes x / Inf * Inf = 0 * Inf = NaN for every element
recipe: fp8-tensorwise (FP8E4M3PerTensorSpec(observer_method="min_max", is_dynamic=True))
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _quark import values

x = torch.full((1, 32), 1.0)
x[0, 0] = float("inf")
v = values("FP8E4M3PerTensorSpec", x, observer_method="min_max", is_dynamic=True)
if v.isnan().all():
    print(f"defect: one Inf -> {v.isnan().sum().item()} of 32 values NaN")
    sys.exit(1)
print(f"fixed: one Inf -> 1.0 becomes {v[0, 1].item()}")
