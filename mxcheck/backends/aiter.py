"""AITER (ROCm/aiter) MXFP4 and MXFP6 GEMMs on MI355X (gfx950) behind the Backend protocol.

Call sequences, as AITER's own callers make them (ROCm/aiter, tags resolved in a clone;
``op_tests/test_gemm_a4w4.py``; the audit in ``research/vendor_audit.md``):

* a4w4: ``A = pack(a) [M, Kp/2] fp4x2``; ``B = shuffle_weight(pack(b), layout=(16, 16))``;
  ``As, Bs = shuffle_scale(scales)`` (rows pad to 256, K/32 to 8);
  ``aiter.gemm_a4w4(A, B, As, Bs, dtype=bf16, bpreshuffle=True)`` (from v0.1.9, 2d714384;
  ``aiter/ops/gemm_op_a4w4.py`` @ v0.1.20.post1 de07f388 pads the output rows to 32 itself)
  or ``aiter.gemm_a4w4(A, B, As, Bs, out, bpreshuffle=True)`` with ``out`` rows padded to 32
  (v0.1.7 de14bec0 and v0.1.8 9402062e). Which form is read from the installed version
  (``importlib.metadata``): from v0.1.7 the function is ``torch_compile_guard``'s
  ``wrapper_custom(*args, **kwargs)``, so its signature says nothing.
  The f4gemm kernel reads whole 256-wide K tiles (aiter #2900, 1d5a73b1: padded scale
  columns must be 0); AITER's ``e8m0_shuffle`` pads with ``torch.empty``. So K is padded
  here to a multiple of 256 with code 0 and scale byte 0, and the scales are shuffled by
  :func:`mxcheck.layouts.shuffle_scale` with ``pad_value=0`` (as Primus-Turbo's AITER
  backend does), never by ``e8m0_shuffle``. The ASM kernel, the path of every shape without
  a tuned CSV row, writes bf16 only (``asm_gemm_a4w4.cu``: "only support BFloat16 output"),
  so bf16 is the only output dtype offered.
* a6w6 (branch ``mxfp6-gemms-clean`` 878d1dea, in no release up to v0.1.20.post1; offered
  only when the installed ``aiter`` has ``gemm_a6w6`` and ``quant_mxfp6_gemm``): operands are
  opaque blobs from ``quant_mxfp6_gemm`` (32-point Hadamard folded in); ``aiter.gemm_a6w6(A,
  B, A_scale, B_scale, M, N, K)`` pads to 256/256/128 inside and crops to [M, N]; bf16 only.
  ``quant_mxfp6_gemm`` rounds ties to even for bf16/fp16 input on gfx950 (the HIP packer) and
  away from zero for float32 input or ``AITER_MXFP6_QUANT_BACKEND=triton``.

A bias is added after the kernel, in ``out_dtype``: the current ``gemm_a4w4`` hands
``bias`` only to its ASM branch and drops it on the tuned-CK branch, so passing it
through would make the result depend on the tuned-config CSV.
"""

from __future__ import annotations

import importlib
import os
import re
from importlib import metadata
from typing import Any

import torch

from mxcheck.backends.amd_mx import check_nt_pair, check_spec, mx_tensor, vendor_available
from mxcheck.backends.contract import Refusal
from mxcheck.formats import get_format
from mxcheck.layouts import SHUFFLE_LAYOUT, pack_mxfp6_blob, shuffle_scale, unpack_mxfp6_blob
from mxcheck.packing import pack_fp4, unpack_fp4
from mxcheck.recipes import OPERANDS, OperandSpec, Recipe, get_recipe
from mxcheck.scaling.mx import MXTensor

__all__ = ["AiterBackend", "aiter_version"]

# fmt -> what AITER's quantizer for it produces; a spec must ask for exactly this.
# e2m1: fp4_utils.dynamic_mxfp4_quant (_dynamic_mxfp4_quant_kernel_asm_layout: EVEN scale,
#   (amax + 0x200000) & 0xFF800000, floor(log2) - 2; RNE cast with saturation; no 2D, no RHT).
# e2m3: gemm_op_a6w6.quant_mxfp6_gemm: H32 rotation, floor scale, zero block -> scale 127;
#   rounding by input dtype (_mxfp6_rounding).
AITER_QUANT_SPECS: dict[str, dict[str, Any]] = {
    "e2m1": {"scale_rule": "even", "rounding": "rne", "hadamard": None, "zero_scale": 0},
    "e2m3": {"scale_rule": "floor", "hadamard": "h32", "zero_scale": 127},
}
DISTRIBUTION = "amd-aiter"
# The entry points each format needs in the installed ``aiter`` package.
_ENTRY_POINTS = {"e2m1": ("gemm_a4w4",), "e2m3": ("gemm_a6w6", "quant_mxfp6_gemm")}
_A4W4_TAKES_DTYPE = (0, 1, 9)  # gemm_a4w4(..., dtype=) from v0.1.9; (..., out) in v0.1.7-0.1.8
# N: shuffle_weight's 16-row tiles; M: Primus-Turbo's GEMMFP4AITERBackend.can_handle (M % 16);
# K: whole 32-blocks here, padded to the kernel's 256-wide K tile below.
_A4W4_MULTIPLES = {"M": 16, "N": 16, "K": 32}
_A4W4_K_TILE = 256
_OUT_DTYPES = (torch.bfloat16,)  # ASM a4w4 and a6w6 write bf16 only


def aiter_version() -> tuple[int, int, int] | None:
    """(major, minor, patch) of the installed amd-aiter distribution, or None if not found."""
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(v) for v in m.groups()) if m else None


def _mxfp6_rounding(dtype: torch.dtype) -> str:
    """quant_mxfp6_gemm's rounding for this input dtype on gfx950 (gemm_op_a6w6.py @ 878d1dea:
    HIP cvt_scalef32_2xpk16_fp6 for bf16/fp16 unless AITER_MXFP6_QUANT_BACKEND=triton)."""
    hip = dtype in (torch.bfloat16, torch.float16) and os.environ.get("AITER_MXFP6_QUANT_BACKEND", "auto") in (
        "auto", "hip")
    return "rne" if hip else "half_away"


def _check_input(x: torch.Tensor, who: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{who} quantizes a 2D [rows, K] operand (K = the contraction axis), "
                         f"got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise Refusal(f"x.dtype={x.dtype}; {who} takes float32, bfloat16 or float16")
    if x.shape[1] % 32:
        raise Refusal(f"x dim 1 (K) = {x.shape[1]} is not a multiple of 32; {who} needs whole 32-blocks")


class AiterBackend:
    """AITER's gemm_a4w4 (MXFP4) and, where installed, gemm_a6w6 (MXFP6) with AITER's quantizers."""

    name = "aiter"
    gemm_out_dtypes = _OUT_DTYPES  # the conformance suite compares in these (oracle rounded alike)

    def available(self) -> tuple[bool, str]:
        return vendor_available("aiter", "aiter gemm_a4w4 / gemm_a6w6")

    @staticmethod
    def missing_entry_points(fmt: str) -> str | None:
        """Why the installed aiter cannot run ``fmt`` (entry points it lacks), or None.

        e2m1 is in every release with gemm_a4w4 and is not imported for (supports("mxfp4")
        stays import-free); e2m3 is looked up, since no release up to v0.1.20.post1 has it."""
        if fmt == "e2m1":
            return None
        try:
            aiter = importlib.import_module("aiter")
        except Exception as e:  # a vendor package may raise anything at import on a CPU host
            return f"aiter not importable ({type(e).__name__}: {e})"
        lacks = [n for n in _ENTRY_POINTS[fmt] if not hasattr(aiter, n)]
        if not lacks:
            return None
        version = metadata.version(DISTRIBUTION) if aiter_version() else "unknown version"
        return (f"the installed aiter ({version}) has no {', '.join(lacks)}: MXFP6 is on branch "
                "mxfp6-gemms-clean only, in no release up to v0.1.20.post1")

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
        if (why := self.missing_entry_points(fmts.pop())) is not None:
            return False, f"aiter: recipe {r.name}: {why}"
        return True, ""

    def quantize(self, x: torch.Tensor, spec: OperandSpec) -> MXTensor:
        """Quantize the NT operand x [rows, K] along K with AITER's quantizer for spec.fmt."""
        if spec.fmt not in AITER_QUANT_SPECS:
            raise Refusal(f"aiter quantizes e2m1 and e2m3, not fmt={spec.fmt!r}")
        who = f"aiter {spec.fmt} quantizer"
        _check_input(x, who)
        want = dict(AITER_QUANT_SPECS[spec.fmt])
        if spec.fmt == "e2m3":
            want["rounding"] = _mxfp6_rounding(x.dtype)
            who = f"aiter quant_mxfp6_gemm on {x.dtype} input"
        check_spec(spec, want, who)
        rows, k = x.shape
        if get_format(spec.fmt).bits == 4:
            from aiter.utility.fp4_utils import dynamic_mxfp4_quant  # noqa: PLC0415

            # shuffle=False: plain [rows, K/2] fp4x2 and [rows, K/32] E8M0, as op_tests' reference
            data, scales = dynamic_mxfp4_quant(x.contiguous(), shuffle=False)
            codes = unpack_fp4(data.view(torch.uint8))  # low nibble = even index (pack_uint4)
            scales = scales.view(torch.uint8)[:rows, : k // 32]
        else:
            if (why := self.missing_entry_points("e2m3")) is not None:
                raise Refusal(f"aiter MXFP6 quantize: {why}")
            import aiter  # noqa: PLC0415

            blob, scale_blob = aiter.quant_mxfp6_gemm(x.contiguous())
            codes, scales = unpack_mxfp6_blob(blob, scale_blob, rows, k)
        return mx_tensor(codes.contiguous(), scales.contiguous(), spec, (rows, k))

    def gemm(self, a: MXTensor, b: MXTensor, *, out_dtype: torch.dtype = torch.bfloat16,
             bias: torch.Tensor | None = None) -> torch.Tensor:
        """a[M, K] @ b[N, K]^T (+ bias) on gemm_a4w4 (e2m1) or gemm_a6w6 (e2m3); bf16 out."""
        ac, asc, bc, bsc = check_nt_pair(a, b)
        if a.fmt.name not in _ENTRY_POINTS:
            raise Refusal(f"aiter has no MX GEMM for {a.fmt.name}; expected e2m1 or e2m3")
        if out_dtype not in _OUT_DTYPES:
            raise Refusal(f"aiter: out_dtype={out_dtype}; AITER's MX GEMMs write {_OUT_DTYPES} only (the "
                             "gemm_a4w4 ASM kernel: 'only support BFloat16 output'; gemm_a6w6: bf16)")
        m, n, k = ac.shape[0], bc.shape[0], ac.shape[1]
        if a.fmt.bits == 4:
            out = self._a4w4(ac, asc, bc, bsc, out_dtype)
        else:
            if (why := self.missing_entry_points("e2m3")) is not None:
                raise Refusal(f"aiter gemm_a6w6: {why}")
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
            raise Refusal(f"aiter gemm_a4w4: {', '.join(bad)} for M={m} N={n} K={k}")
        import aiter  # noqa: PLC0415
        from aiter.ops.shuffle import shuffle_weight  # noqa: PLC0415

        # The kernel reads whole 256-wide K tiles: pad codes with 0 and scales with byte 0
        # ourselves, so no byte it reads is left to torch.empty or past a row's end.
        extra = -k % _A4W4_K_TILE
        ac, bc = (torch.nn.functional.pad(c, (0, extra)) for c in (ac, bc))
        asc, bsc = (torch.nn.functional.pad(s, (0, extra // 32)) for s in (asc, bsc))
        fp4x2, e8m0 = aiter.dtypes.fp4x2, aiter.dtypes.fp8_e8m0
        a_data = pack_fp4(ac).view(fp4x2)
        b_data = shuffle_weight(pack_fp4(bc).view(fp4x2), layout=SHUFFLE_LAYOUT)
        a_scale, b_scale = (shuffle_scale(s, pad_value=0).view(e8m0) for s in (asc, bsc))
        version = aiter_version()  # None (no metadata): the current form
        if version is not None and version < _A4W4_TAKES_DTYPE:
            # v0.1.7-0.1.8: the caller allocates the output, rows padded to 32 (ASM assert).
            out = torch.empty((-(-m // 32) * 32, n), dtype=out_dtype, device=ac.device)
            aiter.gemm_a4w4(a_data, b_data, a_scale, b_scale, out, bpreshuffle=True)
            return out[:m]
        return aiter.gemm_a4w4(a_data, b_data, a_scale, b_scale, dtype=out_dtype, bpreshuffle=True)

    @staticmethod
    def _a6w6(ac: torch.Tensor, asc: torch.Tensor, bc: torch.Tensor, bsc: torch.Tensor,
              out_dtype: torch.dtype) -> torch.Tensor:
        import aiter  # noqa: PLC0415

        m, n, k = ac.shape[0], bc.shape[0], ac.shape[1]
        a_blob, a_sblob = pack_mxfp6_blob(ac, asc)
        b_blob, b_sblob = pack_mxfp6_blob(bc, bsc)
        return aiter.gemm_a6w6(a_blob, b_blob, a_sblob, b_sblob, m, n, k)
