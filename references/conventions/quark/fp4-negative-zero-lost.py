"""Quark MX and NVFP4 element cast: a negative value that rounds to zero comes back +0, not -0.

effect: every negative element that MXFP4 or NVFP4 rounds to zero (about 1 in 14 of a randn tensor in MXFP4) is returned as +0, so the sign of zero is lost (e2m1 has a -0 code); the values are equal, a sign-sensitive consumer (copysign, 1/x, a bit-exact checkpoint comparison) sees the difference
cause: quark/torch/kernel/hw_emulation/csrc/mx/funcs.cuh:124 fake_quantize_element returns 0.0 when the rounded mantissa is 0, before :135 adds the element's sign bit
recipe: ocp-mxfp4 (OCP_MXFP4Spec(ch_axis=-1)), nvfp4-1x16
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _quark import values

x = torch.full((1, 32), 4.0)
x[0, 1] = -0.01  # OCP MXFP4 scale 2^0: -0.01 rounds to -0 (code 0x8)
v = values("OCP_MXFP4Spec", x, ch_axis=-1, scale_calculation_mode="floor")
if v[0, 1].item() == 0 and not torch.signbit(v[0, 1]):
    print("defect: -0.01 in an MXFP4 block of amax 4 -> +0.0 (code 0x8 is -0)")
    sys.exit(1)
print(f"fixed: -0.01 -> {v[0, 1].item()}")
