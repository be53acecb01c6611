"""Quark FP8 per tensor on float16: the scale amax / 448 is computed and kept in float16.

effect: a float16 tensor's FP8 scale is rounded to float16 (every value off by up to half a float16 ulp of the scale, 1e-2 -> 0.01001 where a float32 scale gives 0.010002), and below amax 2.7e-5 (448 x 2^-24) the scale underflows to 0 and is replaced by float32's eps: a tensor of 1e-6 comes back as 9.5e-7
cause: quark/torch/quantization/observer/observer.py:170 casts amax to scale_torch_dtype only when one is set (FP8E4M3PerTensorSpec's scale_type defaults to None), so :179 torch.div(amax, 448) runs in float16 and :180 replaces a 0 by eps; :301 also converts the observer's eps buffer to the input's dtype and keeps it for the next call
recipe: fp8-tensorwise (FP8E4M3PerTensorSpec(observer_method="min_max", is_dynamic=True))
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _quark import values

x = torch.full((1, 32), 1e-6, dtype=torch.float16)  # float32 scale 1e-6 / 448: 1e-6 is 0.5 * 2^-19 * 1.0485, exact in e4m3
v = values("FP8E4M3PerTensorSpec", x, observer_method="min_max", is_dynamic=True)
want = (x.float() / (x.float().amax() / 448)).to(torch.float8_e4m3fn).float() * (x.float().amax() / 448)
if v[0, 0].item() != want[0, 0].to(torch.float16).item():
    print(f"defect: float16 tensor of 1e-6 -> {v[0, 0].item():.4g} (a float32 scale gives {want[0, 0].item():.4g})")
    sys.exit(1)
print(f"fixed: 1e-6 -> {v[0, 0].item():.4g}")
