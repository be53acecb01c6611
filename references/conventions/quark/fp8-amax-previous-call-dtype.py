"""Quark FP8 per tensor: the tensor's amax is rounded to the dtype of the tensor the quantizer saw before.

effect: one dynamic quantizer fed a float16 tensor and then a float32 tensor quantizes the float32 tensor with its amax rounded to float16 (4.6 becomes 4.6015625, so every value moves: 4.6 -> 4.6015625, 1.0 -> 0.98605 where a fresh quantizer gives 0.98571); a float32 tensor of amax 8.8e-39 after a float16 one comes back as zeros
cause: quark/torch/quantization/observer/observer.py:361-365 PerTensorMinMaxObserver.forward copies the new min/max into its buffers (self.min_val.copy_(min_val)), which hold the previous call's dtype, and only then converts them to this input's dtype
recipe: fp8-tensorwise (FP8E4M3PerTensorSpec(observer_method="min_max", is_dynamic=True), one module reused as a layer reuses its quantizer)
"""

import os
import sys

os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")
import torch
from quark.torch.quantization.config import config
from quark.torch.quantization.tensor_quantize import FakeQuantizeBase

spec = config.FP8E4M3PerTensorSpec(observer_method="min_max", is_dynamic=True).to_quantization_spec()
x = torch.tensor([[4.6, 1.0, -2.3, 0.1]])
with torch.no_grad():
    fresh = FakeQuantizeBase.get_fake_quantize(spec)(x.clone())
    reused = FakeQuantizeBase.get_fake_quantize(spec)
    reused(torch.ones(1, 4, dtype=torch.float16))
    after = reused(x.clone())
if not torch.equal(fresh, after):
    print(f"defect: after a float16 call, 4.6 -> {after[0, 0].item()} (a fresh quantizer: {fresh[0, 0].item()})")
    sys.exit(1)
print("fixed: the same float32 tensor gives the same values after a float16 call")
