"""microxcaling (microsoft/microxcaling @7bc4195, pure-PyTorch path) behind mxcheck's Backend
contract, written from docs/backends.md as a new user would: quantize only; claims the OCP
MX v1.0 recipes. Run from a directory with a microxcaling checkout and this file importable:

    PYTHONPATH=path/to/microxcaling:tools/user_trial mxcheck conform --backend microxcaling_adapter:make_backend

Result (2026-12-02, CPU): all five claims fail check_quantize on bf16 tensors: the block
exponent is ``floor(log2(amax))`` taken in the input's dtype (mx_ops.py::_shared_exponents),
so a bf16 amax just under 2**k rounds to k and the scale byte is one higher (8-15 of 4,096
blocks per claim on the bf16 midpoint inputs).

Attribution (2026-12-03, CPU, ``-- -k quantize``): one run names every class. On
ocp-mxfp8-e4m3 every differing block is reproduced: by a log2 in the input's dtype (case 3),
by a float32 log2 on float32 inputs, and by the zero code's sign taken from x < 0 (-0.0
gives +0, case 10), alone or two together. The remainder is unexplained: 369 of 3,234
differing blocks (ocp-mxfp4), 100 of 4,004 (e2m3), 9 of 3,604 (e3m2). Its examples are
elements just below a rounding midpoint that round up. For instance, bf16 0x3dff at scale
2^-1 is 0.498 quanta and gives code 0x01, not 0x00. A ``floor(|x| + 0.5)`` computed in bf16
would do that (case 2, in the input's dtype). That behaviour is not in the catalogue.

The element codes come from mxcheck.encode of the library's own dequantized values divided by
its own scale: exact, since those values lie on the element grid (a layout conversion, not a
second quantization)."""

import torch
from mx.formats import ElemFormat, _get_format_params
from mx.mx_ops import _quantize_mx, _shared_exponents

import mxcheck
from mxcheck.backends import Refusal

FMTS = {"e2m1": "fp4_e2m1", "e2m3": "fp6_e2m3", "e3m2": "fp6_e3m2", "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}


class Microxcaling:
    name = "microxcaling"
    claims = ("ocp-mxfp4", "ocp-mxfp6-e2m3", "ocp-mxfp6-e3m2", "ocp-mxfp8-e4m3", "ocp-mxfp8-e5m2")
    input_dtypes = (torch.float32, torch.bfloat16)

    def available(self):
        return True, ""

    def supports(self, recipe):
        for op in ("x_row", "w_row", "g_row", "w_col", "g_col", "x_col"):
            s = recipe.spec(op)
            if (s.scaling, s.block_size, s.block_2d, s.hadamard, s.zero_scale) != ("mx", 32, False, None, 0) \
                    or s.fmt not in FMTS or s.scale_rule != "floor" or s.rounding != "rne":
                return False, f"{op}: only OCP MX 1x32 floor/RNE"
        return True, ""

    def quantize(self, x, spec, *, state=None):
        ok, why = self.supports_spec(spec)
        if not ok:
            raise Refusal(why)
        if x.shape[-1] % 32:
            raise Refusal(f"K={x.shape[-1]} is not a multiple of 32")
        rows, k = x.shape
        fmt = FMTS[spec.fmt]
        _, _, emax, _, _ = _get_format_params(ElemFormat.from_str(fmt))
        # the library's own output (fake-quantized values), round="even" is its RNE
        deq = _quantize_mx(x, 8, fmt, axes=[-1], block_size=32, round="even").reshape(rows, k // 32, 32)
        # its shared exponent, as _quantize_mx computes it
        e = _shared_exponents(x.reshape(rows, k // 32, 32), method="max", axes=[2]) - emax
        e[e > 127] = float("nan")
        e[e < -127] = -127
        scales = torch.where(torch.isnan(e), 255.0, e + 127).to(torch.uint8).squeeze(-1)
        elems = (deq.float() / torch.exp2(torch.nan_to_num(e.float(), nan=0.0))).reshape(rows, k)
        codes = mxcheck.encode(torch.nan_to_num(elems), spec.fmt)  # exact: the values are on the grid
        return mxcheck.MXTensor(codes=codes, scales=scales, fmt=mxcheck.get_format(spec.fmt), block_size=32,
                                axis=1, shape=(rows, k), scale_rule="floor", rounding="rne")

    def supports_spec(self, spec):
        if spec.scaling != "mx" or spec.fmt not in FMTS or spec.block_2d or spec.hadamard:
            return False, f"spec {spec} is not OCP MX"
        return True, ""


def make_backend():
    return Microxcaling()
