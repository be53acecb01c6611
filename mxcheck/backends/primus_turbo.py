"""Primus-Turbo (AMD-AGI/Primus-Turbo) MXFP4 / MXFP6 / FP8 GEMMs and linears on MI355X.

Entry points used (AMD-AGI/Primus-Turbo, stored file versions read from the code index):

* quantize: ``primus_turbo/pytorch/ops/quantization.py`` @ 01732667e0d858989d8bc21aa00ac683a70d1e42
  ``quantize_fp4(x, float4_e2m1fn_x2, MX_BLOCKWISE, block_size=32, axis=1,
  scaling_recipe=ScalingRecipe(use_2d_block, use_sr, use_rht))`` -> ([M, K_pad/2] fp4x2,
  [M, K_pad/32] E8M0), K padded to 128 (MXFP4_PADDING_ALIGN_SIZE);
  ``quantize_fp4_with_trans(...)`` -> (row, row_scale, col [K, M_pad/2], col_scale), the
  dual kernel (``quantize_mxfp4_dual``); ``quantize_fp8(x, dtype, TENSORWISE)`` -> (q,
  0-d float32 scale_inv), the ``quantize_fp8_tensorwise`` op. MXFP6 has no public
  quantizer: ``kernels/quantization/mxfp6_pack.py`` @ 0c98a60451897188a1317c5501e9371f96bd6670
  ``quantize_mxfp6_row`` / ``quantize_mxfp6_dual`` return AITER ``mxfp6_c0c1_256_padk2`` blobs.
* gemm: ``kernels/gemm/gemm_fp4_impl.py`` @ 003e237bb2b13942d3ee029daaed2b06188e15c7
  ``gemm_fp4_impl(a, a_scale_inv, False, b, b_scale_inv, True, out_dtype, False,
  granularity=MX_BLOCKWISE.value, default_backend=HIPBLASLT.value)`` (unshuffled operands:
  its AITER backend shuffles with ``shuffle_weight(b, [16, 16])`` / ``shuffle_scale``);
  ``gemm_fp6_impl.py`` @ 0307ccde662457cd73e0ea4a2a3fceda8f968d34 ``gemm_fp6_impl(a,
  a_scale, b, b_scale, m, n, k, out_dtype, granularity)`` (blobs carry no shape);
  ``gemm_fp8_impl(a, a_scale_inv, False, b, b_scale_inv, True, out_dtype, False,
  TENSORWISE.value, HIPBLASLT.value)``.
* linear: the public ``gemm_fp4`` / ``gemm_fp6`` / ``gemm_fp8`` (``ops/gemm_fp4.py`` @
  02c53a4db49dec5fe50fee46191e085f4daea52c and a later index version with the fused dual
  quantizer, ``ops/gemm_fp6.py`` @ 0c98a60451897188a1317c5501e9371f96bd6670), which apply
  ``FP4GemmMXFunction`` / ``FP6GemmMXFunction`` / the FP8 tensorwise Function with
  ``Float4QuantConfig(use_gradient_sr=...)``, ``Float6QuantConfig()`` and
  ``Float8QuantConfig(format=E4M3|E5M2|HYBRID, granularity=TENSORWISE)``. The wrappers are
  used rather than ``Function.apply`` because ``FP4GemmMXFunction.apply``'s arity changed
  across versions (with and without the ``a_t``/``b_t`` transpose caches).

Checked against main a6a16cdc and tags v0.3.0-v0.4.0 (``research/vendor_audit.md``): every MX
quantizer takes bf16 or fp16 only (``csrc/pytorch/quantization/quantization.cpp``: "Input
must be BFloat16 or Half"; ``mxfp6_pack.py`` raises TypeError), so ``quantize`` refuses
other dtypes and ``linear`` hands Primus-Turbo bf16 activations and weights, as a bf16
training step does. ``gemm_fp6_impl``'s ``can_handle`` needs M % 256, N % 256, K % 128.
MXFP6 (``ops/gemm_fp6.py``, ``Float6QuantConfig``, ``gemm_fp6_impl``, ``mxfp6_pack``) is in
no release and not on main: ``supports`` offers it only where the installed package has
those entry points.

Bias is added after the GEMM in ``out_dtype`` (two roundings, as Primus-Turbo's own
fallback when the installed AITER has no bias epilogue).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from mxcheck.backends.amd_mx import check_nt_pair, check_spec, mx_tensor, vendor_available
from mxcheck.backends.contract import Refusal
from mxcheck.formats import get_format
from mxcheck.hadamard import get_hadamard
from mxcheck.layouts import pack_mxfp6_blob, unpack_mxfp6_blob
from mxcheck.packing import pack_fp4, unpack_fp4
from mxcheck.recipes import OPERANDS, OperandSpec, Recipe, get_recipe
from mxcheck.scaling.fp8 import FP8Tensor
from mxcheck.scaling.mx import MXTensor

__all__ = ["PrimusTurboBackend"]

_FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}  # OCP on gfx950 (low_precision.py)
_FP8_FORMATS = {("e4m3", "e4m3"): "E4M3", ("e5m2", "e5m2"): "E5M2", ("e4m3", "e5m2"): "HYBRID"}
# What Primus-Turbo's MX quantizers produce (quantization_mxfp4.cu compute_tile_scale is the
# EVEN rule; the MXFP6 packer is AITER's, bit-exact in the row direction).
_MXFP4 = {"scale_rule": "even", "zero_scale": 0}
_MXFP6 = {"scale_rule": "floor", "rounding": "half_away", "hadamard": "h32", "zero_scale": 127}
_MX_FORMATS = {"e2m1": ("mxfp4", _MXFP4), "e2m3": ("mxfp6", _MXFP6)}  # Primus-Turbo's MX element formats
_MX_INPUT_DTYPES = (torch.bfloat16, torch.float16)
_FP6_MULTIPLES = {"M": 256, "N": 256, "K": 128}  # gemm_fp6_impl.py @ 0307ccde can_handle
# (module under primus_turbo.pytorch, attribute) that MXFP6 needs; none is in a release.
_MXFP6_ENTRY_POINTS = (("ops.gemm_fp6", "gemm_fp6"), ("core.low_precision", "Float6QuantConfig"),
                       ("kernels.gemm.gemm_fp6_impl", "gemm_fp6_impl"),
                       ("kernels.quantization.mxfp6_pack", "quantize_mxfp6_row"))


def mxfp6_missing() -> str | None:
    """Which MXFP6 entry points the installed primus_turbo lacks, or None when all exist."""
    lacks = []
    for module, attr in _MXFP6_ENTRY_POINTS:
        try:
            ok = hasattr(_pt(module), attr)
        except Exception:  # absent module, or a vendor import failing on a CPU host
            ok = False
        if not ok:
            lacks.append(f"primus_turbo.pytorch.{module}.{attr}")
    if not lacks:
        return None
    return f"the installed primus_turbo has no {', '.join(lacks)} (MXFP6 is in no release up to v0.4.0 nor on main)"


def _mx_input(x: torch.Tensor, who: str) -> torch.Tensor:
    if x.dtype not in _MX_INPUT_DTYPES:
        raise Refusal(f"x.dtype={x.dtype}; {who} takes bfloat16 or float16 only (quantization.cpp: "
                        "'Input must be BFloat16 or Half'); cast x first")
    return x.contiguous()


def _pt(module: str) -> Any:
    """A primus_turbo.pytorch submodule, imported only when a call needs it."""
    return importlib.import_module(f"primus_turbo.pytorch.{module}")


def _family(spec: OperandSpec) -> str | None:
    if spec.scaling == "tensor":
        return "fp8" if spec.scale_formula == "primus_turbo" and spec.fmt in _FP8_DTYPES else None
    want = _MX_FORMATS.get(spec.fmt)
    if want is None:
        return None
    try:
        check_spec(spec, want[1], "primus_turbo", allow_2d=spec.fmt == "e2m1")
    except ValueError:
        return None
    return want[0]


def classify(recipe: Recipe | str) -> tuple[str, Any]:
    """(kind, option) of the Primus-Turbo linear that runs this recipe, or ValueError why not.

    mxfp4 -> use_gradient_sr; mxfp6 -> None; fp8 -> Format name (E4M3, E5M2, HYBRID).
    """
    r = get_recipe(recipe)
    kinds = {op: _family(r.spec(op)) for op in OPERANDS}
    if None in kinds.values() or len(set(kinds.values())) > 1:
        raise Refusal(f"primus_turbo: recipe {r.name} has operands {kinds}; Primus-Turbo runs all-MXFP4 "
                         "(e2m1, even), all-MXFP6 (e2m3, floor, h32) or tensorwise FP8 (primus_turbo scale)")
    kind = kinds["x_row"]
    if kind == "mxfp4":
        # FP4GemmMXFunction: 2D 32x32 weight blocks both ways, 1D activations and grads; SR
        # only on gradients. Where H16 x 2 goes is the installed version's choice: the research
        # snapshot (main a6a16cdc) rotates the wgrad pair only, index versions read here also
        # set use_rht on w_col and g_row (the dgrad pair). The report's numbers show which.
        for op in OPERANDS:
            s = r.spec(op)
            if s.block_2d != op.startswith("w"):
                raise Refusal(f"primus_turbo: {op} block_2d={s.block_2d}; FP4GemmMXFunction uses 2D "
                                 "blocks exactly for the weight copies")
            if get_hadamard(s.hadamard) not in (None, get_hadamard("h16x2")):
                raise Refusal(f"primus_turbo: {op} hadamard={s.hadamard!r}; Primus-Turbo's RHT is h16x2")
        sr = {r.g_row.rounding, r.g_col.rounding}
        if sr not in ({"rne"}, {"sr"}) or {r.x_row.rounding, r.w_row.rounding} != {"rne"}:
            raise Refusal("primus_turbo: use_gradient_sr rounds both gradient copies stochastically "
                             "and nothing else")
        return kind, sr == {"sr"}
    if kind == "fp8":
        fwd = {r.x_row.fmt, r.w_row.fmt, r.w_col.fmt, r.x_col.fmt}
        bwd = {r.g_row.fmt, r.g_col.fmt}
        fmt = _FP8_FORMATS.get((fwd.pop(), bwd.pop())) if len(fwd) == 1 == len(bwd) else None
        if fmt is None:
            raise Refusal(f"primus_turbo: recipe {r.name} FP8 formats are not E4M3, E5M2 or HYBRID")
        return kind, fmt
    return kind, None


class PrimusTurboBackend:
    """Primus-Turbo's MX and FP8 quantizers, GEMMs and autograd linears."""

    name = "primus_turbo"
    input_dtypes = (torch.bfloat16, torch.float16)  # quantization.cpp takes no float32 input

    def available(self) -> tuple[bool, str]:
        return vendor_available("primus_turbo", "primus_turbo MXFP4/MXFP6 kernels")

    def supports(self, recipe: Recipe | str) -> tuple[bool, str]:
        try:
            kind, _ = classify(recipe)
        except ValueError as e:
            return False, str(e)
        if kind == "mxfp6" and (why := mxfp6_missing()) is not None:
            return False, f"primus_turbo: {why}"
        return True, ""

    # -- quantize ---------------------------------------------------------------------

    @staticmethod
    def _fp4_recipe(spec: OperandSpec) -> Any:
        check_spec(spec, _MXFP4, "primus_turbo quantize_fp4", allow_2d=True)
        if spec.rounding not in ("rne", "sr") or get_hadamard(spec.hadamard) not in (None, get_hadamard("h16x2")):
            raise Refusal(f"primus_turbo quantize_fp4 rounds rne or sr and rotates by h16x2 or not at all; "
                             f"spec has rounding={spec.rounding!r} hadamard={spec.hadamard!r}")
        lp = _pt("core.low_precision")
        return lp.ScalingRecipe(use_2d_block=spec.block_2d, use_sr=spec.rounding == "sr",
                                use_rht=spec.hadamard is not None)

    def quantize(self, x: torch.Tensor, spec: OperandSpec) -> MXTensor | FP8Tensor:
        """Quantize the NT operand x [rows, K] along K (the last axis)."""
        if x.dim() != 2:
            raise ValueError(f"primus_turbo quantizes a 2D [rows, K] operand, got shape {tuple(x.shape)}")
        if spec.scaling == "tensor":
            return self._fp8(x, spec)
        if spec.fmt not in _MX_FORMATS:
            raise Refusal(f"primus_turbo quantizes MX e2m1/e2m3 and tensorwise e4m3/e5m2, not {spec.fmt}/{spec.scaling}")
        if get_format(spec.fmt).bits == 4:
            lp, q = _pt("core.low_precision"), _pt("ops.quantization")
            data, scale = q.quantize_fp4(_mx_input(x, "primus_turbo quantize_fp4"), torch.float4_e2m1fn_x2, lp.ScalingGranularity.MX_BLOCKWISE,
                                         block_size=32, axis=1, scaling_recipe=self._fp4_recipe(spec))
            return mx_tensor(unpack_fp4(data.view(torch.uint8)), scale.view(torch.uint8), spec, tuple(x.shape))
        check_spec(spec, _MXFP6, "primus_turbo MXFP6 packer")
        blob, sblob = _pt("kernels.quantization.mxfp6_pack").quantize_mxfp6_row(_mx_input(x, "primus_turbo MXFP6 packer"))
        return mx_tensor(*unpack_mxfp6_blob(blob, sblob, *x.shape), spec, tuple(x.shape))

    def quantize_dual(self, x: torch.Tensor, row: OperandSpec, col: OperandSpec) -> tuple[MXTensor, MXTensor]:
        """One dual-kernel pass over x [M, K]: (x along K as [M, K], x^T along M as [K, M])."""
        if x.dim() != 2 or row.fmt != col.fmt:
            raise ValueError("quantize_dual takes a 2D x and two specs of one format")
        if row.fmt not in _MX_FORMATS:
            raise Refusal(f"quantize_dual covers e2m1 and e2m3, not {row.fmt}")
        m, k = x.shape
        if get_format(row.fmt).bits == 4:
            lp, q = _pt("core.low_precision"), _pt("ops.quantization")
            r, rs, c, cs = q.quantize_fp4_with_trans(
                _mx_input(x, "primus_turbo quantize_fp4_with_trans"), torch.float4_e2m1fn_x2,
                lp.ScalingGranularity.MX_BLOCKWISE, block_size=32,
                scaling_recipe=self._fp4_recipe(row), scaling_recipe_for_trans=self._fp4_recipe(col))
            return (mx_tensor(unpack_fp4(r.view(torch.uint8)), rs.view(torch.uint8), row, (m, k)),
                    mx_tensor(unpack_fp4(c.view(torch.uint8)), cs.view(torch.uint8), col, (k, m)))
        check_spec(row, _MXFP6, "primus_turbo MXFP6 packer")
        check_spec(col, _MXFP6, "primus_turbo MXFP6 packer")
        rb, rsb, cb, csb = _pt("kernels.quantization.mxfp6_pack").quantize_mxfp6_dual(
            _mx_input(x, "primus_turbo MXFP6 packer"))
        return (mx_tensor(*unpack_mxfp6_blob(rb, rsb, m, k), row, (m, k)),
                mx_tensor(*unpack_mxfp6_blob(cb, csb, k, m), col, (k, m)))

    @staticmethod
    def _fp8(x: torch.Tensor, spec: OperandSpec) -> FP8Tensor:
        if spec.fmt not in _FP8_DTYPES or spec.scale_formula != "primus_turbo":
            raise Refusal(f"primus_turbo quantize_fp8 (tensorwise) gives fmt e4m3/e5m2 with "
                             f"scale_formula='primus_turbo'; spec has {spec.fmt!r}/{spec.scale_formula!r}")
        lp, q = _pt("core.low_precision"), _pt("ops.quantization")
        data, scale_inv = q.quantize_fp8(x.contiguous(), _FP8_DTYPES[spec.fmt], lp.ScalingGranularity.TENSORWISE)
        scale_inv = scale_inv.to(torch.float32).reshape(())
        return FP8Tensor(codes=data.view(torch.uint8), scale_inv=scale_inv, fmt=get_format(spec.fmt),
                         granularity="tensor", scale=1.0 / scale_inv,
                         amax=x.detach().abs().amax().to(torch.float32))  # amax: read by torch, not the kernel

    # -- gemm -------------------------------------------------------------------------

    def gemm(self, a: MXTensor | FP8Tensor, b: MXTensor | FP8Tensor, *,
             out_dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None) -> torch.Tensor:
        """a[M, K] @ b[N, K]^T (+ bias) on Primus-Turbo's gemm_fp4_impl / gemm_fp6_impl / gemm_fp8_impl."""
        lp, be = _pt("core.low_precision"), _pt("core.backend")
        if isinstance(a, FP8Tensor) and isinstance(b, FP8Tensor):
            out = self._gemm_fp8(a, b, out_dtype, lp, be)
        else:
            ac, asc, bc, bsc = check_nt_pair(a, b)
            if a.fmt.name not in _MX_FORMATS:
                raise Refusal(f"primus_turbo has no MX GEMM for {a.fmt.name}; expected e2m1 or e2m3")
            m, n, k = ac.shape[0], bc.shape[0], ac.shape[1]
            gran = lp.ScalingGranularity.MX_BLOCKWISE.value
            if a.fmt.bits == 4:
                impl = _pt("kernels.gemm.gemm_fp4_impl").gemm_fp4_impl
                out = impl(pack_fp4(ac).view(torch.float4_e2m1fn_x2), asc.view(torch.float8_e8m0fnu), False,
                           pack_fp4(bc).view(torch.float4_e2m1fn_x2), bsc.view(torch.float8_e8m0fnu), True,
                           out_dtype, False, granularity=gran, default_backend=be.BackendType.HIPBLASLT.value)
            else:  # e2m3, packed four codes in three bytes
                if out_dtype != torch.bfloat16:
                    raise Refusal(f"primus_turbo gemm_fp6_impl writes bfloat16 only, got out_dtype={out_dtype}")
                bad = [f"{d}={v} (needs a multiple of {q})"
                       for (d, q), v in zip(_FP6_MULTIPLES.items(), (m, n, k), strict=True) if v % q]
                if bad:
                    raise Refusal(f"primus_turbo gemm_fp6_impl: {', '.join(bad)} for M={m} N={n} K={k}")
                (ab, asb), (bb, bsb) = pack_mxfp6_blob(ac, asc), pack_mxfp6_blob(bc, bsc)
                out = _pt("kernels.gemm.gemm_fp6_impl").gemm_fp6_impl(ab, asb, bb, bsb, m, n, k, out_dtype, gran)
            out = out[:m, :n]
        return out if bias is None else out + bias.to(out.dtype)

    @staticmethod
    def _gemm_fp8(a: FP8Tensor, b: FP8Tensor, out_dtype: torch.dtype, lp: Any, be: Any) -> torch.Tensor:
        for name, t in (("a", a), ("b", b)):
            if t.granularity != "tensor" or t.codes.dim() != 2 or t.fmt.name not in _FP8_DTYPES:
                raise Refusal(f"{name}: primus_turbo gemm_fp8_impl here takes 2D tensorwise e4m3/e5m2, got "
                                 f"{t.fmt.name} {t.granularity} {tuple(t.codes.shape)}")
        if a.codes.shape[1] != b.codes.shape[1]:
            raise ValueError(f"K mismatch: a is {tuple(a.codes.shape)}, b is {tuple(b.codes.shape)} (NT: both [., K])")
        impl = _pt("kernels.gemm.gemm_fp8_impl").gemm_fp8_impl
        return impl(a.codes.view(_FP8_DTYPES[a.fmt.name]), a.scale_inv, False,
                    b.codes.view(_FP8_DTYPES[b.fmt.name]), b.scale_inv, True, out_dtype, False,
                    lp.ScalingGranularity.TENSORWISE.value, be.BackendType.HIPBLASLT.value)

    # -- linear -----------------------------------------------------------------------

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               recipe: Recipe | str) -> torch.Tensor:
        """x[..., K] @ weight[N, K]^T (+ bias), autograd through Primus-Turbo's Functions."""
        r = get_recipe(recipe)
        kind, option = classify(r)
        x2 = x.reshape(-1, x.shape[-1])
        (m, k), n = x2.shape, weight.shape[0]
        if kind == "mxfp6" and (why := mxfp6_missing()) is not None:
            raise Refusal(f"primus_turbo linear for recipe {r.name}: {why}")
        r.check_shape(m, n, k)
        if kind != "fp8":  # the MX quantizers inside gemm_fp4 / gemm_fp6 take bf16/fp16 only
            x2, weight = (t if t.dtype in _MX_INPUT_DTYPES else t.to(torch.bfloat16) for t in (x2, weight))
        lp = _pt("core.low_precision")
        if kind == "mxfp4":
            out = _pt("ops.gemm_fp4").gemm_fp4(x2, weight, trans_a=False, trans_b=True, out_dtype=r.out_dtype,
                                               config=lp.Float4QuantConfig(use_gradient_sr=option))
        elif kind == "mxfp6":
            out = _pt("ops.gemm_fp6").gemm_fp6(x2, weight, trans_a=False, trans_b=True, out_dtype=torch.bfloat16,
                                               config=lp.Float6QuantConfig())
        else:
            cfg = lp.Float8QuantConfig(format=lp.Format[option], granularity=lp.ScalingGranularity.TENSORWISE)
            out = _pt("ops.gemm_fp8").gemm_fp8(x2, weight, trans_a=False, trans_b=True, out_dtype=r.out_dtype,
                                               config=cfg)
        if bias is not None:
            out = out + bias.to(out.dtype)  # autograd carries the bias gradient through the cast
        return out.reshape(*x.shape[:-1], n)
