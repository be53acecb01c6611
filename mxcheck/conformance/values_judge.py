"""The judge of a kernel's values: does a value agree with a quantized tensor?

One rule for the values check, its attribution, the edge shapes, the fit and the search
(docs/backends.md, "Fake-quant backends"): a value agrees where its bits are the oracle's
value's in the kernel's dtype (any NaN equal to any NaN), or, for NVFP4, where it is finite,
has that value's sign and lies within the spread of the float32 orders released libraries
dequantize in (``DEQUANT_ORDERS``). MX values are exact and FP8 values one product, so for
them the rule is bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from mxcheck.diagnose.catalogue import element_format
from mxcheck.formats import decode_table
from mxcheck.scaling.nvfp4 import NVFP4Tensor

__all__ = ["DEQUANT_ORDERS", "dequant_spread", "infer_codes", "oracle_values", "same_nans", "values_agree",
           "values_bits"]

_DECODE = 2688.0  # e4m3 max * e2m1 max: NVFP4's tensor scale is amax / 2688


def _f32(v: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32, device=like.device)


# The float32 orders in which released NVFP4 libraries and vendor references dequantize
# (e: the e2m1 value, s: the ue4m3 block scale, a: the tensor amax, all float32). Each rounds
# two or three times, so two orders differ in the last bit on some elements; a kernel whose
# codes and scales are the oracle's may return any of them (tools/measure_dequant_orders.py
# measures their spread on the check's inputs; docs/backends.md gives the numbers).
DEQUANT_ORDERS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    # the oracle (NVFP4Tensor.dequantize): the true value rounded once
    "exact product rounded once": lambda e, s, a: (e.double() * s.double() * a.double() / _DECODE).float(),
    # transformer_engine/common/cast/nvfp4/dequantize_nvfp4.cuh @05f018392e819ec3cc7a6a966645fc4a616abb3a
    "TE dequantize_nvfp4.cuh: e * ((s * a) * fl32(1/2688))": lambda e, s, a: e * ((s * a) * _f32(1 / _DECODE, a)),
    # torchao 0.18.0 prototype/mx_formats/nvfp4_tensor.py get_hp_scales + dequantize (per_tensor_scale
    # = amax / 2688); ModelOpt modelopt/torch/quantization/qtensor/nvfp4_tensor.py @0d7d92d69c3bca933a350731f4ec543a78a10e3a
    # dequantize (per_block_scale = scale * double_scale)
    "torchao, ModelOpt: e * (s * (a / 2688))": lambda e, s, a: e * (s * (a / _DECODE)),
    # compressed-tensors src/compressed_tensors/quantization/lifecycle/forward.py
    # @d55633e48d3cee519c1d28bbcbc0d5f4755599c1 _dequantize (scale / global_scale, global_scale = 2688 / amax)
    "compressed-tensors: e * (s / (2688 / a))": lambda e, s, a: e * (s / (_DECODE / a)),
    # TE's quantization keeps S_dec = 1 / S_enc (core_nvfp4.cuh); a kernel that dequantizes with it
    "through the reciprocal: e * (s * (1 / (2688 / a)))": lambda e, s, a: e * (s * (1.0 / (_DECODE / a))),
    # a GEMM's order (TE's NVFP4 GEMM alpha, mxcheck.gemm's outer-scaled path): e * s exact, then the tensor scale
    "GEMM epilogue: (e * s) * (a / 2688)": lambda e, s, a: (e * s) * (a / _DECODE),
}


def oracle_values(q: Any, dtype: torch.dtype) -> torch.Tensor:
    """The oracle's quantized operand ``q`` as values in ``dtype`` (float32 is exact; a
    narrower dtype rounds to nearest even)."""
    return q.dequantize().to(dtype)


def dequant_spread(q: Any, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(lowest, highest) value per element over the legitimate dequantization orders of q,
    each cast to ``dtype`` as the oracle's is. An order that loses a value is not legitimate
    there and is left out: Inf where the true value is finite (TE's order above amax of about
    7.6e35), 0 where it is not 0 (an order through 2688 / amax, which is Inf below amax of
    about 7.9e-36). MX and FP8 values are one product (exact for MX): their spread is the
    oracle's value alone."""
    want = oracle_values(q, dtype)
    if not isinstance(q, NVFP4Tensor):
        return want, want
    e, s, a = q.decoded_factors()
    lo = torch.full_like(want, float("inf"))
    hi = torch.full_like(want, float("-inf"))
    exact32 = q.dequantize()
    with torch.no_grad():
        for order in DEQUANT_ORDERS.values():
            v32 = order(e, s, a)
            ok = torch.isfinite(v32) & ((v32 != 0) | (exact32 == 0))
            v = v32.to(dtype)
            lo = torch.where(ok, torch.minimum(lo, v), lo)
            hi = torch.where(ok, torch.maximum(hi, v), hi)
    return lo, hi


def same_nans(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """``got`` with each NaN where ``want`` is NaN too replaced by ``want``'s bits: any NaN
    equals any NaN, so a NaN's sign and payload never count as a difference."""
    both = torch.isnan(got) & torch.isnan(want.to(got.device))
    return torch.where(both, want.to(got.device), got) if bool(both.any()) else got


def values_agree(got: torch.Tensor, q: Any, want: torch.Tensor | None = None) -> torch.Tensor:
    """The judge of a kernel's values: per element of ``got`` (shaped like q's values, any
    float dtype), whether it agrees with the quantized tensor ``q``: its bits are q's oracle
    value's in got's dtype, or both are NaN, or (NVFP4) it is finite, has that value's sign,
    and lies within ``dequant_spread``. Used by the check, the attribution, the fit and the
    search alike. ``want``: q's values in got's dtype where the caller has them already."""
    want = (oracle_values(q, got.dtype) if want is None else want).to(got.device)
    if got.shape == want.shape and torch.equal(_bits_on(got), _bits_on(want)):  # the common case, one pass
        return torch.ones(tuple(got.shape), dtype=torch.bool)
    same = (values_bits(got) == values_bits(want)) | (torch.isnan(got) & torch.isnan(want)).cpu()
    if not isinstance(q, NVFP4Tensor) or bool(same.all()):
        return same
    lo, hi = (t.to(got.device) for t in dequant_spread(q, got.dtype))
    inside = torch.isfinite(got) & (got >= lo) & (got <= hi) & (torch.signbit(got) == torch.signbit(want))
    return same | inside.cpu()


def infer_codes(got: torch.Tensor, q: Any) -> torch.Tensor:
    """The element codes a kernel's values ``got`` say it wrote, read under q's scales: per
    element the lowest code whose value agrees with got (``values_agree``), or 0xFF where
    none does (a value no code under these scales gives: another scale, or no code at all).
    uint8, shaped like got, on the CPU. Cost: one dequantization per code of q's element
    format (16 for fp4, 256 for fp8)."""
    fmt = element_format(q)
    out = torch.full(tuple(got.shape), 0xFF, dtype=torch.uint8)
    for code in range(len(decode_table(fmt))):
        each = replace(q, codes=torch.full_like(q.codes, code))
        hit = values_agree(got, each) & (out == 0xFF)
        out[hit] = code
    return out



def _bits_on(t: torch.Tensor) -> torch.Tensor:
    """t's bits as a same-width integer view, where t is (no copy)."""
    return t.detach().contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def values_bits(t: torch.Tensor) -> torch.Tensor:
    """t's bits as int64 on the CPU (a float16/bf16, float32 or float64 value's integer view)."""
    t = t.detach().cpu().contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).to(torch.int64)


