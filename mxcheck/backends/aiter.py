"""AITER (ROCm/aiter) MXFP4 and MXFP6 GEMMs on MI355X (gfx950) behind the Backend protocol.

Call sequences, as AITER's own callers make them (sources: module docstring of
:mod:`mxcheck.layouts`, plus ``op_tests/test_gemm_a4w4.py`` @ 00eae9d25e302533facc6edaff64517f3ee340a7
and ``aiter/ops/gemm_op_a4w4.py`` @ 010bca68ac23d49772e475bc3c3f23d82f1924e7 (legacy,
``out`` argument) and its current form (code-index file 60624025900, commit not reported;
the research snapshot is aiter e4048607): ``dtype`` keyword, output allocated inside
with M padded to 32, result cropped to [:M]):

* a4w4: ``A = pack(a) [M, K/2] fp4x2``; ``B = shuffle_weight(pack(b), layout=(16, 16))``;
  ``As, Bs = e8m0_shuffle(scales)`` (rows pad to 256, K/32 to 8);
  ``aiter.gemm_a4w4(A, B, As, Bs, dtype=bf16, bpreshuffle=True)`` (note: data, data,
  scale, scale). A is not padded in M: AITER pads the output rows itself.
* a6w6 (branch ``mxfp6-gemms-clean``, ``aiter/ops/gemm_op_a6w6.py`` @
  08481f1b22e7ea28b59223ee2e7f857f6a4677bb): operands are opaque blobs from
  ``quant_mxfp6_gemm`` (32-point Hadamard folded in); ``aiter.gemm_a6w6(A, B, A_scale,
  B_scale, M, N, K)`` pads to 256/256/128 inside and crops to [M, N]; bf16 only.

A bias is added after the kernel, in ``out_dtype``: the current ``gemm_a4w4`` hands
``bias`` only to its ASM branch and drops it on the tuned-CK branch, so passing it
through would make the result depend on the tuned-config CSV.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from mxcheck import hardware
from mxcheck.backends import import_vendor
from mxcheck.formats import get_format
from mxcheck.hadamard import get_hadamard
from mxcheck.layouts import SHUFFLE_LAYOUT, pack_mxfp6_blob, unpack_mxfp6_blob
from mxcheck.packing import pack_fp4, unpack_fp4
from mxcheck.recipes import OPERANDS, OperandSpec, Recipe, get_recipe
from mxcheck.scaling.mx import MXTensor

__all__ = ["AiterBackend", "gfx950_missing", "mx_operand", "mx_tensor", "vendor_available"]

# fmt -> what AITER's quantizer for it produces; a spec must ask for exactly this.
# e2m1: fp4_utils.dynamic_mxfp4_quant (_dynamic_mxfp4_quant_kernel_asm_layout: EVEN scale,
#   (amax + 0x200000) & 0xFF800000, floor(log2) - 2; RNE cast with saturation; no 2D, no RHT).
# e2m3: gemm_op_a6w6.quant_mxfp6_gemm (_quant_pack_kernel: bf16 H32 rotation, floor(log2)-2,
#   zero block -> scale 127, floor(a*q + 0.5) = ties away). The HIP packer uses the gfx950
#   cvt instruction, which AITER's test allows to differ from Triton by one code at midpoints.
AITER_QUANT_SPECS: dict[str, dict[str, Any]] = {
    "e2m1": {"scale_rule": "even", "rounding": "rne", "hadamard": None, "zero_scale": 0},
    "e2m3": {"scale_rule": "floor", "rounding": "half_away", "hadamard": "h32", "zero_scale": 127},
}
_GEMM_OF = {"e2m1": "gemm_a4w4", "e2m3": "gemm_a6w6"}
# Primus-Turbo GEMMFP4AITERBackend.can_handle: M % 16, N % 16, K % 32 for AITER's FP4 GEMM;
# shuffle_weight's assert adds (K/2 bytes) % 32, i.e. K % 64 values.
_A4W4_MULTIPLES = {"M": 16, "N": 16, "K": 64}
_A4W4_OUT_DTYPES = (torch.bfloat16, torch.float16)


def gfx950_missing(what: str) -> str | None:
    """Why this machine cannot run a gfx950 kernel (from mxcheck.hardware), or None."""
    hw = hardware.detect()
    if hw.vendor == "amd" and hw.arch == "gfx950":
        return None
    return f"{what} needs an AMD MI355X (gfx950); this machine has {hw.describe()}"


def vendor_available(module: str, what: str) -> tuple[bool, str]:
    """(True, "") when ``module`` imports and the device is gfx950, else every reason why not."""
    reasons = [why] if (why := import_vendor(module)) is not None else []
    if (why := gfx950_missing(what)) is not None:
        reasons.append(why)
    return (not reasons), "; ".join(reasons)


def mx_operand(q: MXTensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [rows, K], E8M0 bytes [rows, K/32]) of a 2D MXTensor, blocked axis last (NT)."""
    if not isinstance(q, MXTensor):
        raise TypeError(f"{name} must be an MXTensor (from quantize or mxcheck.mx_quantize), got {type(q).__name__}")
    if q.codes.dim() != 2 or q.block_size != 32:
        raise ValueError(f"{name}: expected a 2D MXTensor in 32-blocks, got codes {tuple(q.codes.shape)} "
                         f"block_size={q.block_size}")
    return q.codes.movedim(q.axis, -1).contiguous(), q.scales.movedim(q.axis, -1).contiguous()


def mx_tensor(codes: torch.Tensor, scales: torch.Tensor, spec: OperandSpec,
              shape: tuple[int, ...]) -> MXTensor:
    """An MXTensor along the last axis from a vendor's codes, padded to ``spec.pad_to`` with
    code 0 and ``spec.zero_scale`` (what the vendor quantizers give an all-zero block)."""
    if spec.pad_to is not None and codes.shape[-1] % spec.pad_to:
        extra = -codes.shape[-1] % spec.pad_to
        codes = torch.nn.functional.pad(codes, (0, extra))
        scales = torch.nn.functional.pad(scales, (0, extra // 32), value=spec.zero_scale)
    return MXTensor(codes=codes, scales=scales, fmt=get_format(spec.fmt), block_size=32, axis=codes.dim() - 1,
                    shape=tuple(shape), scale_rule=spec.scale_rule, rounding=spec.rounding,
                    block_2d=spec.block_2d, hadamard=get_hadamard(spec.hadamard), zero_scale=spec.zero_scale)


def check_nt_pair(a: MXTensor, b: MXTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both operands' (codes, scales), checked to share format, K and rotation."""
    ac, asc = mx_operand(a, "a")
    bc, bsc = mx_operand(b, "b")
    if a.fmt.name != b.fmt.name:
        raise ValueError(f"a is {a.fmt.name} and b is {b.fmt.name}; this GEMM takes one format for both")
    if ac.shape[1] != bc.shape[1]:
        raise ValueError(f"K mismatch: a has K={ac.shape[1]} and b has K={bc.shape[1]} (padded codes); "
                         "quantize both with the same pad_to")
    if a.hadamard != b.hadamard:
        raise ValueError(f"a and b carry different rotations along K ({a.hadamard} vs {b.hadamard}); "
                         "(A R)(B R)^T = A B^T only when both are rotated alike")
    return ac, asc, bc, bsc


def check_spec(spec: OperandSpec, want: dict[str, Any], who: str, *, allow_2d: bool = False) -> None:
    """ValueError naming the first spec field a vendor quantizer cannot honour."""
    if spec.scaling != "mx" or spec.block_size != 32 or (spec.block_2d and not allow_2d):
        raise ValueError(f"{who} quantizes 1x32 MX blocks; spec has scaling={spec.scaling!r} "
                         f"block_size={spec.block_size} block_2d={spec.block_2d}")
    for field, value in want.items():
        got = getattr(spec, field)
        if field == "hadamard":
            got, value = get_hadamard(got), get_hadamard(value)
        if got != value:
            raise ValueError(f"{who} produces {field}={value!r} for {spec.fmt}; the spec asks for {got!r}. "
                             "Quantize with mxcheck.mx_quantize and pass the MXTensor to gemm instead")


def _check_input(x: torch.Tensor, who: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{who} quantizes a 2D [rows, K] operand (K = the contraction axis), "
                         f"got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"x.dtype={x.dtype}; {who} takes float32, bfloat16 or float16")
    if x.shape[1] % 32:
        raise ValueError(f"x dim 1 (K) = {x.shape[1]} is not a multiple of 32; {who} needs whole 32-blocks")


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a C extension without a signature: assume not
        return False


class AiterBackend:
    """AITER's gemm_a4w4 (MXFP4) and gemm_a6w6 (MXFP6) with AITER's own quantizers."""

    name = "aiter"

    def available(self) -> tuple[bool, str]:
        return vendor_available("aiter", "aiter gemm_a4w4 / gemm_a6w6")

    def supports(self, recipe: Recipe | str) -> tuple[bool, str]:
        """Every operand e2m1 (even scale rule) or every operand e2m3 (floor), 1x32 MX: all
        gemm_a4w4 / gemm_a6w6 read. Features AITER's quantizers lack (2D blocks, SR, H16)
        are for mxcheck.mx_quantize to produce; quantize() refuses them by name."""
        r = get_recipe(recipe)
        fmts = set()
        for op in OPERANDS:
            s = r.spec(op)
            if s.scaling != "mx" or s.fmt not in AITER_QUANT_SPECS or s.block_size != 32:
                return False, (f"aiter: recipe {r.name} {op} is {s.fmt} scaling={s.scaling!r} "
                               f"block_size={s.block_size}; aiter runs 1x32 MX e2m1 (gemm_a4w4) or e2m3 (gemm_a6w6)")
            rule = AITER_QUANT_SPECS[s.fmt]["scale_rule"]
            if s.scale_rule != rule:
                return False, f"aiter: recipe {r.name} {op} uses scale_rule={s.scale_rule!r}; AITER's {s.fmt} uses {rule!r}"
            fmts.add(s.fmt)
        if len(fmts) > 1:
            return False, f"aiter: recipe {r.name} mixes {sorted(fmts)}; A6W4/A4W6 are not wired here"
        return True, ""

    def quantize(self, x: torch.Tensor, spec: OperandSpec) -> MXTensor:
        """Quantize the NT operand x [rows, K] along K with AITER's quantizer for spec.fmt."""
        if spec.fmt not in AITER_QUANT_SPECS:
            raise ValueError(f"aiter quantizes e2m1 and e2m3, not fmt={spec.fmt!r}")
        who = f"aiter {spec.fmt} quantizer"
        check_spec(spec, AITER_QUANT_SPECS[spec.fmt], who)
        _check_input(x, who)
        rows, k = x.shape
        if spec.fmt == "e2m1":
            from aiter.utility.fp4_utils import dynamic_mxfp4_quant  # noqa: PLC0415

            # shuffle=False: plain [rows, K/2] fp4x2 and [rows, K/32] E8M0, as op_tests' reference
            data, scales = dynamic_mxfp4_quant(x.contiguous(), shuffle=False)
            codes = unpack_fp4(data.view(torch.uint8))  # low nibble = even index (pack_uint4)
            scales = scales.view(torch.uint8)[:rows, : k // 32]
        else:
            import aiter  # noqa: PLC0415

            blob, scale_blob = aiter.quant_mxfp6_gemm(x.contiguous())
            codes, scales = unpack_mxfp6_blob(blob, scale_blob, rows, k)
        return mx_tensor(codes.contiguous(), scales.contiguous(), spec, (rows, k))

    def gemm(self, a: MXTensor, b: MXTensor, *, out_dtype: torch.dtype = torch.bfloat16,
             bias: torch.Tensor | None = None) -> torch.Tensor:
        """a[M, K] @ b[N, K]^T (+ bias) on gemm_a4w4 (e2m1) or gemm_a6w6 (e2m3)."""
        ac, asc, bc, bsc = check_nt_pair(a, b)
        if a.fmt.name not in _GEMM_OF:
            raise ValueError(f"aiter has no MX GEMM for {a.fmt.name}; expected e2m1 or e2m3")
        m, n, k = ac.shape[0], bc.shape[0], ac.shape[1]
        if a.fmt.name == "e2m1":
            out = self._a4w4(ac, asc, bc, bsc, out_dtype)
        else:
            out = self._a6w6(ac, asc, bc, bsc, out_dtype)
        out = out[:m, :n]
        assert out.shape == (m, n), f"aiter returned {tuple(out.shape)} for M={m} N={n} K={k}"
        return out if bias is None else out + bias.to(out.dtype)

    @staticmethod
    def _a4w4(ac: torch.Tensor, asc: torch.Tensor, bc: torch.Tensor, bsc: torch.Tensor,
              out_dtype: torch.dtype) -> torch.Tensor:
        m, n, k = ac.shape[0], bc.shape[0], ac.shape[1]
        bad = [f"{d}={v} (needs a multiple of {q})" for (d, q), v in zip(_A4W4_MULTIPLES.items(), (m, n, k), strict=True)
               if v % q]
        if bad:
            raise ValueError(f"aiter gemm_a4w4: {', '.join(bad)} for M={m} N={n} K={k}")
        if out_dtype not in _A4W4_OUT_DTYPES:
            raise ValueError(f"aiter gemm_a4w4: out_dtype={out_dtype}; expected one of {_A4W4_OUT_DTYPES}")
        import aiter  # noqa: PLC0415
        from aiter.ops.shuffle import shuffle_weight  # noqa: PLC0415
        from aiter.utility.fp4_utils import e8m0_shuffle  # noqa: PLC0415

        fp4x2, e8m0 = aiter.dtypes.fp4x2, aiter.dtypes.fp8_e8m0
        a_data = pack_fp4(ac).view(fp4x2)
        b_data = shuffle_weight(pack_fp4(bc).view(fp4x2), layout=SHUFFLE_LAYOUT)
        a_scale = e8m0_shuffle(asc.view(e8m0)).view(e8m0)
        b_scale = e8m0_shuffle(bsc.view(e8m0)).view(e8m0)
        if _accepts(aiter.gemm_a4w4, "out"):
            # Older AITER: the caller allocates the output; op_tests pad its rows to 256
            # (the ASM path asserts a multiple of 32).
            out = torch.empty((-(-m // 256) * 256, n), dtype=out_dtype, device=ac.device)
            kw = {"bpreshuffle": True} if _accepts(aiter.gemm_a4w4, "bpreshuffle") else {}
            res = aiter.gemm_a4w4(a_data, b_data, a_scale, b_scale, out, **kw)
            return (res if isinstance(res, torch.Tensor) else out)[:m]
        return aiter.gemm_a4w4(a_data, b_data, a_scale, b_scale, dtype=out_dtype, bpreshuffle=True)

    @staticmethod
    def _a6w6(ac: torch.Tensor, asc: torch.Tensor, bc: torch.Tensor, bsc: torch.Tensor,
              out_dtype: torch.dtype) -> torch.Tensor:
        if out_dtype != torch.bfloat16:
            raise ValueError(f"aiter gemm_a6w6 writes bfloat16 only, got out_dtype={out_dtype}")
        import aiter  # noqa: PLC0415

        m, n, k = ac.shape[0], bc.shape[0], ac.shape[1]
        a_blob, a_sblob = pack_mxfp6_blob(ac, asc)
        b_blob, b_sblob = pack_mxfp6_blob(bc, bsc)
        return aiter.gemm_a6w6(a_blob, b_blob, a_sblob, b_sblob, m, n, k)
