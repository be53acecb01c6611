"""brevitas' MX quantizer as the adapter calls it: QuantIdentity with MXFloat8e4m3Act, its widths
changed with ``let``, grouped along the last axis (brevitas/quant/mx_quant_ocp.py)."""

import warnings

import torch

warnings.simplefilter("ignore")  # brevitas' deprecation notices at import
from brevitas.nn import QuantIdentity  # noqa: E402
from brevitas.quant.mx_quant_ocp import MXFloat8e4m3Act  # noqa: E402


def mx_values(x: torch.Tensor, bits: int = 8, ebits: int = 4, mbits: int = 3) -> torch.Tensor:
    quant = MXFloat8e4m3Act.let(bit_width=bits, exponent_bit_width=ebits, mantissa_bit_width=mbits)
    q = QuantIdentity(act_quant=quant, group_dim=-1, return_quant_tensor=True).eval()
    with torch.no_grad():
        return q(x).value
