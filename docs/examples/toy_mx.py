"""A toy MX kernel in plain PyTorch, written from the OCP Microscaling Formats (MX) v1.0
spec, and the smallest complete mxcheck backend around it (docs/backends.md explains it).

    PYTHONPATH=docs/examples mxcheck conform --backend toy_mx:make_backend --recipe ocp-mxfp8-e4m3

``make_buggy_backend()`` is the same kernel with one seeded bug, the block exponent taken
from a float32 ``log2``; the conformance suite fails it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

import torch

from mxcheck.backends import Refusal
from mxcheck.formats import get_format
from mxcheck.recipes import OPERANDS, OperandSpec, Recipe
from mxcheck.scaling.mx import MXTensor

BLOCK = 32  # OCP MX: 32 elements share one E8M0 scale, along the last (contraction) axis
E8M0_NAN = 255


class Element:
    """An OCP MX element format: a sign bit, ``ebits`` exponent bits, ``mbits`` mantissa bits."""

    def __init__(self, ebits: int, mbits: int, nan_code: int | None) -> None:
        self.ebits, self.mbits, self.nan_code = ebits, mbits, nan_code  # e4m3: S.1111.111 is NaN
        bias, n = 2 ** (ebits - 1) - 1, 2 ** (ebits + mbits)
        e, m = torch.arange(n) // 2**mbits, torch.arange(n) % 2**mbits
        # value of each magnitude code: field 0 is subnormal (no implicit 1, exponent 1 - bias)
        mag = ((e > 0) + m / 2**mbits) * torch.exp2(e.clamp(min=1).double() - bias)  # 2^n: exact in float64
        if nan_code is not None:
            mag[nan_code] = float("nan")
        self.table = torch.cat([mag, -mag])  # code -> float64 value; the sign is the top bit
        self.grid = mag[: n - 1] if nan_code is not None else mag  # finite magnitudes, increasing
        self.emax = 2**ebits - 1 - bias  # exponent of the largest power of two (e4m3 8, e2m1 2)

    def encode(self, v: torch.Tensor) -> torch.Tensor:
        """uint8 codes of float64 values: round to nearest, ties to even, saturating to +-max."""
        mag = v.abs().clamp(max=self.grid[-1].item())  # Inf and anything above max -> max
        hi = torch.searchsorted(self.grid, mag).clamp(max=len(self.grid) - 1)  # first grid value >= mag
        lo = (hi - 1).clamp(min=0)
        d_lo, d_hi = mag - self.grid[lo], self.grid[hi] - mag
        # a tie goes to the even code (mantissa's last bit 0); -0.0 keeps its sign bit
        code = torch.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
        return (code | (torch.signbit(v).long() << (self.ebits + self.mbits))).to(torch.uint8)


ELEMENTS = {"e2m1": Element(2, 1, None), "e4m3": Element(4, 3, 0x7F)}


def exponent_from_bits(amax: torch.Tensor) -> torch.Tensor:
    """floor(log2 amax), read from the float32 exponent field: exact for every float32.
    A subnormal amax has field 0 and reads -127; Inf has field 255 and reads 128."""
    return ((amax.view(torch.int32) >> 23) & 0xFF) - 127


def exponent_from_log2(amax: torch.Tensor) -> torch.Tensor:
    """THE SEEDED BUG: float32 log2 rounds log2(nextbelow(2**k)) up to k, one binade high."""
    return torch.floor(torch.log2(amax)).nan_to_num(0.0).clamp(-127, 128).to(torch.int32)


def _why_not(spec: OperandSpec) -> str:
    """Why this kernel cannot quantize ``spec`` ('' when it can): OCP MX v1.0 only."""
    if spec.scaling != "mx" or spec.fmt not in ELEMENTS:
        return f"fmt={spec.fmt} scaling={spec.scaling}: only MX e2m1 and e4m3 are implemented"
    plain = OperandSpec(spec.fmt, "mx")  # OCP MX v1.0: 1x32 blocks, floor, RNE, zero block byte 0
    diff = [f.name for f in fields(spec) if getattr(spec, f.name) != getattr(plain, f.name)]
    if diff:
        return (", ".join(f"{n}={getattr(spec, n)!r}" for n in diff) + ": only OCP MX v1.0 is implemented ("
                + ", ".join(f"{n}={getattr(plain, n)!r}" for n in diff) + ")")
    return ""


class ToyMX:
    """quantize and gemm; the suite runs its reference Function around ``gemm`` for linears."""

    name = "toy-mx"
    device = "cpu"
    claims = ("ocp-mxfp8-e4m3", "ocp-mxfp4")  # what it promises bit for bit
    input_dtypes = (torch.float32, torch.bfloat16, torch.float16)
    gemm_out_dtypes = (torch.float32, torch.bfloat16, torch.float16)

    def __init__(self, block_exponent: Callable[[torch.Tensor], torch.Tensor] = exponent_from_bits) -> None:
        self.block_exponent = block_exponent

    def available(self) -> tuple[bool, str]:
        return True, ""  # plain PyTorch on the CPU runs anywhere

    def supports(self, recipe: Recipe) -> tuple[bool, str]:
        for op in OPERANDS:
            if why := _why_not(recipe.spec(op)):
                return False, f"{op}: {why}"
        return True, ""

    def quantize(self, x: torch.Tensor, spec: OperandSpec, *, state: object = None) -> MXTensor:
        if why := _why_not(spec):
            raise Refusal(why)
        if x.dtype not in self.input_dtypes:
            raise Refusal(f"x.dtype={x.dtype}; this kernel reads {list(self.input_dtypes)}")
        if x.ndim == 0 or x.shape[-1] % BLOCK:
            raise Refusal(f"K={x.shape[-1] if x.ndim else None} (last dim of x, shape {tuple(x.shape)}) "
                          f"is not a multiple of {BLOCK}")
        fmt = ELEMENTS[spec.fmt]
        blocks = x.float().unflatten(-1, (-1, BLOCK))  # bf16 and fp16 widen to float32 exactly
        amax = blocks.abs().amax(-1)  # a NaN anywhere in a block makes its amax NaN
        # OCP MX v1.0 section 6.3: X = 2^(floor(log2 amax) - emax), clamped to E8M0's range
        e = (self.block_exponent(amax) - fmt.emax).clamp(-127, 127)
        scales = torch.where(amax == 0, 0, e + 127)  # an all-zero block gets byte 0, as torchao
        scales = torch.where(amax.isnan(), E8M0_NAN, scales).to(torch.uint8)
        # x / 2^e is exact in float64; an Inf amax gives e = 128 - emax and Inf saturates to max
        codes = fmt.encode(blocks.double() * torch.exp2(-e.double()).unsqueeze(-1))
        # A NaN block reads NaN through its scale; store the format's NaN code (0 if none) in
        # every element, whatever the NaNs' signs, so the bytes are deterministic.
        codes = torch.where((scales == E8M0_NAN).unsqueeze(-1), fmt.nan_code or 0, codes)
        return MXTensor(codes=codes.flatten(-2), scales=scales, fmt=get_format(spec.fmt), block_size=BLOCK,
                        axis=x.ndim - 1, shape=tuple(x.shape), scale_rule="floor", rounding="rne")

    def gemm(self, a: MXTensor, b: MXTensor, *, out_dtype: torch.dtype,
             bias: torch.Tensor | None = None) -> torch.Tensor:
        """NT: a[M, K] @ b[N, K]^T (+ bias), accumulated in float32, cast once to out_dtype."""
        if out_dtype not in self.gemm_out_dtypes:
            raise Refusal(f"out_dtype={out_dtype}; this kernel writes {list(self.gemm_out_dtypes)}")
        for name, q in (("a", a), ("b", b)):
            if not isinstance(q, MXTensor) or q.fmt.name not in ELEMENTS or q.block_size != BLOCK or q.block_2d \
                    or q.hadamard is not None:
                raise Refusal(f"{name}: only 1x32 MX e2m1/e4m3 operands, got {type(q).__name__}")
            if len(q.shape) != 2 or q.shape[1] % BLOCK or tuple(q.codes.shape) != q.shape:
                raise Refusal(f"{name}: K={q.shape[-1]} (shape {q.shape}) is not a multiple of {BLOCK}")
        if a.shape[1] != b.shape[1]:
            raise ValueError(f"a is {a.shape} and b is {b.shape}: K differs")
        out = _dequantize(a) @ _dequantize(b).T
        return (out if bias is None else out + bias.float()).to(out_dtype)


def _dequantize(q: MXTensor) -> torch.Tensor:
    """float32 element * 2^(byte - 127); NaN where the byte is 255 (exact in float64)."""
    values = ELEMENTS[q.fmt.name].table.to(q.codes.device)[q.codes.long()].unflatten(-1, (-1, BLOCK))
    scale = torch.exp2(q.scales.double() - 127)
    scale = torch.where(q.scales == E8M0_NAN, float("nan"), scale)
    return (values * scale.unsqueeze(-1)).flatten(-2).float()


def make_backend() -> ToyMX:
    return ToyMX()


def make_buggy_backend() -> ToyMX:
    return ToyMX(block_exponent=exponent_from_log2)
