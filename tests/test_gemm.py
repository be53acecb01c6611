"""The emulated NT GEMM: float64 is the exact product of the dequantized operands, float32
stays inside the float32 accumulation bound of it, bias lands before the one cast, and the
operand checks name what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mxcheck.formats import get_format
from mxcheck.functions import make_delayed_states
from mxcheck.gemm import (
    PlainTensor,
    dequantize_operand,
    emulated_gemm,
    mx_fits_bf16,
    quantize_operand,
)
from mxcheck.plugin import needs
from mxcheck.recipes import GEMMS, RECIPES, OperandSpec
from mxcheck.scaling import MXTensor, mx_quantize
from mxcheck.scaling.fp8 import FP8Tensor
from mxcheck.scaling.mx import MX_ELEMENT_FORMATS
from mxcheck.scaling.nvfp4 import NVFP4Tensor

with needs("ml_dtypes"):
    import ml_dtypes

pytestmark = pytest.mark.emulated

# M is not a multiple of 128, so the mxfp4 wgrad pair (padded to 128 along M, then rotated
# by H16 (+) H16) carries rotated values into its padding; every dim tiles the 2D weight
# blocks (32), NVFP4's 16 and the 32-point Hadamard.
M, N, K = 96, 64, 160
# fp8-block's 128x128 weight tiles and its 1x128 blocks along M (the wgrad operands) need
# every dim a multiple of 128.
SHAPES = {"fp8-block": (128, 128, 256)}
U32 = 2.0**-24  # float32 unit roundoff
U64 = 2.0**-53


def gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): |fl(a.b) - a.b| <= gamma_K sum |a_i||b_i|."""
    return n * u / (1 - n * u)


def gemm_operands(recipe_name: str, gemm: str, gen: torch.Generator):
    """The two quantized operands of one of a recipe's GEMMs, from random X, W and dY."""
    recipe = RECIPES[recipe_name]
    m, n, k = SHAPES.get(recipe_name, (M, N, K))
    x = torch.randn(m, k, generator=gen).bfloat16()
    w = (torch.randn(n, k, generator=gen) * k**-0.5).bfloat16()
    g = (torch.randn(m, n, generator=gen) * 1e-3).bfloat16()
    tensors = {"x_row": x, "w_row": w, "g_row": g, "w_col": w.t(), "g_col": g.t(), "x_col": x.t()}
    states = make_delayed_states(recipe)
    a_name, b_name, _ = GEMMS[gemm]
    out = []
    for name in (a_name, b_name):
        t = tensors[name].contiguous()
        spec = recipe.spec(name)
        rand = torch.randint(0, 256, t.shape, dtype=torch.uint8, generator=gen) if spec.rounding == "sr" else None
        out.append(quantize_operand(t, spec, rand=rand, state=states.get(name)))
    return out


CASES = [(r, g) for r in RECIPES for g in GEMMS]
IDS = [f"{r}-{g}" for r, g in CASES]


# The witness decode: ml_dtypes reads the element and scale codes, numpy applies the scale
# rule each format's spec states; nothing below calls mxcheck's dequantize or GEMM path.
WITNESS_DTYPES = {"e2m1": "float4_e2m1fn", "e2m3": "float6_e2m3fn", "e3m2": "float6_e3m2fn",
                  "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "e4m3fnuz": "float8_e4m3fnuz",
                  "e5m2fnuz": "float8_e5m2fnuz", "ue4m3": "float8_e4m3fn", "e8m0": "float8_e8m0fnu"}
NVFP4_BLOCK = 16


def witness_codes(codes: torch.Tensor, fmt: str) -> np.ndarray:
    """float64 values of uint8 codes, decoded by ml_dtypes."""
    return codes.numpy().view(getattr(ml_dtypes, WITNESS_DTYPES[fmt])).astype(np.float64)


def blockwise(per_block: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A per-block array (a block's value at each of its block's rows and columns) spread
    over ``shape``; a partial last block keeps its block's value."""
    out = per_block
    for axis, n in enumerate(shape):
        out = np.repeat(out, -(-n // out.shape[axis]), axis=axis).take(range(n), axis=axis)
    return out


def witness_dequantize(q) -> np.ndarray:
    """The float64 operand a GEMM consumes, from the codes alone."""
    if isinstance(q, PlainTensor):
        return q.value.double().numpy()
    if isinstance(q, MXTensor):  # element * 2**(e8m0 - 127), exact in float64
        return witness_codes(q.codes, q.fmt.name) * blockwise(witness_codes(q.scales, "e8m0"), q.codes.shape)
    if isinstance(q, NVFP4Tensor):  # fl32(e2m1 * ue4m3 * amax / 2688): the product is exact in float64
        s = witness_codes(q.block_scales, "ue4m3")
        exact = witness_codes(q.codes, "e2m1") * blockwise(s * float(q.amax), q.codes.shape) / 2688.0
        return exact.astype(np.float32).astype(np.float64)
    if isinstance(q, FP8Tensor):  # fl32(fp8 * scale_inv): TE's dequantize
        inv = np.broadcast_to(q.scale_inv.numpy().astype(np.float32), (1, 1) if q.scale_inv.ndim == 0 else q.scale_inv.shape)
        return (witness_codes(q.codes, q.fmt.name).astype(np.float32) * blockwise(inv, q.codes.shape)).astype(np.float64)
    raise TypeError(f"no witness decode for {type(q).__name__}")


@pytest.mark.parametrize(("recipe", "gemm"), CASES, ids=IDS)
def test_float64_gemm_is_the_float64_product_of_the_witness_decoded_operands(recipe, gemm, gen, numerics):
    a, b = gemm_operands(recipe, gemm, gen)
    wa, wb = witness_dequantize(a), witness_dequantize(b)
    k = max(wa.shape[1], wb.shape[1])  # zero padding along K extends the product exactly
    wa, wb = (np.pad(w, ((0, 0), (0, k - w.shape[1]))) for w in (wa, wb))
    expected = wa @ wb.T
    got = emulated_gemm(a, b, out_dtype=torch.float64, accumulate=torch.float64).numpy()
    assert np.abs(expected).sum() > 0  # a non-trivial product (trap 1)
    # The codes decode alike (bitwise), so only the two float64 summation orders differ:
    # |got - expected| <= 2 gamma_K(2^-53) sum_k |a_k||b_k| (Higham 3.1, once per side).
    da = dequantize_operand(a).double()
    numerics.context(recipe=recipe, layer="gemm", direction=gemm, m=wa.shape[0], n=wb.shape[0],
                     k=k).bitwise(da, torch.from_numpy(wa[:, : da.shape[1]]))
    bound = 2 * gamma(k, U64) * (np.abs(wa) @ np.abs(wb).T)
    excess = np.abs(got - expected) - bound
    assert (excess <= 0).all(), (f"{int((excess > 0).sum())} of {excess.size} elements differ from the "
                                 f"witness product by more than the float64 bound, worst by {excess.max():.3g}")


@pytest.mark.parametrize(("recipe", "gemm"), CASES, ids=IDS)
def test_float32_gemm_is_within_the_float32_accumulation_bound(recipe, gemm, gen):
    # Bound (Higham 3.1): |fl32(a.b) - a.b| <= gamma_K(2^-24) sum_k |a_k||b_k| per element,
    # plus the float64 reference's own gamma_K(2^-53); K is the padded contraction length.
    a, b = gemm_operands(recipe, gemm, gen)
    da, db = dequantize_operand(a).double(), dequantize_operand(b).double()
    k = da.shape[1]
    ref = emulated_gemm(a, b, out_dtype=torch.float64, accumulate=torch.float64)
    got = emulated_gemm(a, b, out_dtype=torch.float32, accumulate=torch.float32).double()
    bound = (gamma(k, U32) + gamma(k, U64)) * (da.abs() @ db.abs().T)
    excess = (got - ref).abs() - bound
    assert bool((excess <= 0).all()), f"{int((excess > 0).sum())} elements exceed the bound, worst by {excess.max():.3g}"
    assert not torch.equal(got, torch.zeros_like(got))


@pytest.mark.parametrize("accumulate", [torch.float32, torch.float64], ids=str)
def test_bias_is_added_in_the_accumulation_dtype_before_the_one_cast(accumulate, gen):
    a, b = gemm_operands("mxfp6", "fwd", gen)
    bias = torch.randn(N, generator=gen).bfloat16()
    wide = emulated_gemm(a, b, out_dtype=accumulate, accumulate=accumulate)
    got = emulated_gemm(a, b, out_dtype=torch.bfloat16, accumulate=accumulate, bias=bias)
    assert torch.equal(got.view(torch.int16), (wide + bias.to(accumulate)).bfloat16().view(torch.int16))
    # ...not a bf16 add after a bf16 cast (double rounding), which differs somewhere here
    assert not torch.equal(got, wide.bfloat16() + bias)


def test_k_mismatch_names_both_shapes(gen):
    a = quantize_operand(torch.randn(8, 64, generator=gen), OperandSpec())
    b = quantize_operand(torch.randn(4, 32, generator=gen), OperandSpec())
    with pytest.raises(ValueError, match=r"K differs: a has shape \(8, 64\).*b has shape \(4, 32\)"):
        emulated_gemm(a, b)


def test_a_rotation_on_one_operand_only_is_refused(gen):
    spec = RECIPES["mxfp4"].g_col
    a = quantize_operand(torch.randn(8, 128, generator=gen), spec)
    b = quantize_operand(torch.randn(4, 128, generator=gen), OperandSpec("e2m1", "mx", scale_rule="even"))
    with pytest.raises(ValueError, match="rotated differently"):
        emulated_gemm(a, b)


def test_gemm_argument_checks(gen):
    a = quantize_operand(torch.randn(8, 32, generator=gen), OperandSpec())
    with pytest.raises(TypeError, match="quantize_operand"):
        emulated_gemm(a, torch.randn(4, 32))
    with pytest.raises(ValueError, match="accumulate"):
        emulated_gemm(a, a, accumulate=torch.bfloat16)
    with pytest.raises(TypeError, match="out_dtype"):
        emulated_gemm(a, a, out_dtype=torch.int32)
    with pytest.raises(ValueError, match=r"bias has shape \(7,\); expected \(8,\)"):
        emulated_gemm(a, a, bias=torch.zeros(7))


def test_quantize_operand_dispatches_on_scaling_and_contracts_the_last_dim(gen):
    x = torch.randn(64, 96, generator=gen)
    plain = quantize_operand(x, OperandSpec())
    assert isinstance(plain, PlainTensor) and plain.value.dtype == torch.bfloat16
    assert torch.equal(plain.dequantize(), x.bfloat16().float())
    mx = quantize_operand(x, RECIPES["mxfp8"].x_row)
    assert isinstance(mx, MXTensor) and mx.axis == 1 and mx.scales.shape == (64, 3)


def test_quantize_operand_needs_rand_for_sr_and_a_state_for_delayed(gen):
    x = torch.randn(32, 64, generator=gen)
    with pytest.raises(ValueError, match="rounds stochastically: pass rand"):
        quantize_operand(x, RECIPES["nvfp4"].g_row)
    with pytest.raises(ValueError, match="rand was given"):
        quantize_operand(x, RECIPES["nvfp4"].x_row, rand=torch.zeros(32, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="delayed scaling: pass state"):
        quantize_operand(x, RECIPES["fp8-delayed"].x_row)
    with pytest.raises(ValueError, match="2D operand"):
        quantize_operand(x.reshape(2, 16, 64), OperandSpec())


@pytest.mark.parametrize("fmt", MX_ELEMENT_FORMATS)
def test_mx_fits_bf16_only_claims_what_a_bf16_cast_keeps(fmt, gen):
    # mx_fits_bf16 picks the CUDA bf16 fast path from the scale bytes alone; whenever it
    # says yes, every dequantized value must survive a bf16 round trip. Magnitudes sweep
    # from float32's smallest normals to its largest, where the claim has to fall back.
    said_yes = said_no = 0
    for e in (-126, -120, -100, -20, 0, 20, 100, 120, 126):
        # |randn| < 4: at 2**126 a draw of 4 or more overflows float32 to Inf (seed 4060103506
        # on the H200 seed sweep), which is not what this sweep of magnitudes is about.
        x = torch.randn(32, 64, generator=gen).clamp(-3.99, 3.99) * 2.0**e
        x[0] = 0.0  # an all-zero block gets scale byte 0: it must not veto the fast path
        q = mx_quantize(x, fmt)
        d = q.dequantize()
        if mx_fits_bf16(q):
            said_yes += 1
            assert torch.equal(d.bfloat16().float(), d), e
        else:
            said_no += 1
    # Ordinary data takes the fast path. fp4/fp6 elements times any E8M0 scale are bf16s;
    # fp8 ones near float32's smallest normals fall below bf16's subnormals and must not.
    assert said_yes >= 5
    assert (said_no >= 1) if get_format(fmt).bits == 8 else (said_no == 0)


@pytest.mark.parametrize("fmt", MX_ELEMENT_FORMATS)
def test_mx_fits_bf16_at_every_scale_byte_is_what_a_bf16_cast_keeps(fmt):
    # Every byte 0..255 (255: a NaN block, NaN in bf16 too) under a block of the smallest
    # and largest magnitudes: the rule must agree exactly with the bf16 round trip of the
    # float32 values (Inf where float32 overflows is Inf in bf16 too). An all-zero block
    # (byte 0 from zero_scale) passes at every byte. fp4 and fp6 fit at every byte; fp8
    # elements do not at the smallest bytes, which must be refused.
    f = get_format(fmt)

    def block(codes, byte):
        return MXTensor(codes[None], torch.tensor([[byte]], dtype=torch.uint8), f, 32, 1, (1, 32), "floor", "rne")

    ends, zeros = torch.tensor([1, f.max_code] * 16, dtype=torch.uint8), torch.zeros(32, dtype=torch.uint8)
    refused = 0
    for byte in range(256):
        d = block(ends, byte).dequantize()
        keeps = torch.equal(d.bfloat16().float().nan_to_num(7.0), d.nan_to_num(7.0))
        assert mx_fits_bf16(block(ends, byte)) == keeps, byte
        assert mx_fits_bf16(block(zeros, byte)), byte
        refused += not keeps
    assert (refused > 0) == (f.bits == 8)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fp8_values_are_the_witness_decode_of_every_code(fmt, dtype):
    codes = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    q = FP8Tensor(codes, torch.tensor(3.0), get_format(fmt), "tensor", torch.tensor(1 / 3.0), torch.tensor(1.0))
    got = q.values(dtype).double().numpy()
    want = witness_codes(codes, fmt)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.isnan(want).any()  # the NaN codes are among them


def test_nvfp4_block_values_are_e2m1_times_ue4m3_exactly(gen):
    from mxcheck.scaling import nvfp4_quantize

    x = torch.randn(32, 64, generator=gen) * torch.logspace(-3, 3, 32).unsqueeze(1)
    for q in (nvfp4_quantize(x), nvfp4_quantize(x, block_2d=True)):
        want = witness_codes(q.codes, "e2m1") * blockwise(witness_codes(q.block_scales, "ue4m3"), q.codes.shape)
        got = q.block_values()
        assert np.array_equal(got.double().numpy(), want)
        assert torch.equal(got.bfloat16().float(), got)  # exact in bf16: the CUDA path's claim


def _one_term_operands(kind: str, gen: torch.Generator):
    """a (M, K) with one nonzero per row and a dense b: each output is one product, so the
    float32 sum is exact and only the scaling's roundings remain."""
    from mxcheck.scaling import fp8_quantize, nvfp4_quantize

    m, n, k = 24, 48, 64
    x = torch.zeros(m, k)
    x[torch.arange(m), torch.randint(0, k, (m,), generator=gen)] = torch.randn(m, generator=gen) * 3
    w = torch.randn(n, k, generator=gen)
    if kind == "nvfp4":
        return nvfp4_quantize(x), nvfp4_quantize(w, block_2d=True)
    return fp8_quantize(x, "e4m3", granularity=kind), fp8_quantize(w, "e4m3", granularity=kind)


def _witness_values_and_outer(q) -> tuple[np.ndarray, np.ndarray]:
    """(unscaled values, outer scale as a column) from the codes, via ml_dtypes."""
    if isinstance(q, NVFP4Tensor):
        s = witness_codes(q.block_scales, "ue4m3")
        return witness_codes(q.codes, "e2m1") * blockwise(s, q.codes.shape), q.tensor_scale.numpy().reshape(-1, 1)
    return witness_codes(q.codes, q.fmt.name), q.scale_inv.numpy().reshape(-1, 1)


@pytest.mark.parametrize("kind", ["tensor", "row", "nvfp4"])
def test_fp8_and_nvfp4_gemms_scale_the_exact_sum_once_as_the_hardware_does(kind, gen):
    # cuBLASLt / TE: D = (scale_a * scale_b) * sum(a_k * b_k). With one term per output the
    # float32 sum is exact, so the result is pinned bit for bit: fl32(product * fl32(sa * sb)).
    a, b = _one_term_operands(kind, gen)
    (va, oa), (vb, ob) = _witness_values_and_outer(a), _witness_values_and_outer(b)
    alpha = (oa.astype(np.float32) * ob.astype(np.float32).T).astype(np.float64)
    want = ((va @ vb.T) * alpha).astype(np.float32)
    got = emulated_gemm(a, b, out_dtype=torch.float32).numpy()
    assert np.array_equal(got, want)
    # Dequantizing first (every value * scale rounded to float32) lands elsewhere: the
    # check tells the two orders apart on these operands.
    first = (dequantize_operand(a).double() @ dequantize_operand(b).double().T).float().numpy()
    assert not np.array_equal(first, want)
