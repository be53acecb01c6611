"""Hadamard matrices and block rotations against float64 / numpy arithmetic written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mxcheck.formats import encode
from mxcheck.hadamard import HADAMARDS, Hadamard, apply_hadamard, get_hadamard, hadamard_matrix
from mxcheck.plugin import needs

with needs("ml_dtypes"):
    import ml_dtypes

pytestmark = pytest.mark.emulated

# TransformerEngine get_wgrad_sign_vector (reference_emulators.md section 6): bit i of the
# mask is set where sign i is -1.
TE_SIGN_MASK = 0xD7E8
BF16_NORM_32 = 0.1767578125  # 181 / 1024: AITER kHadamard32Norm


def sylvester(n: int) -> np.ndarray:
    """float64 H[i, j] = (-1)**popcount(i & j), straight from the definition."""
    return np.array([[(-1.0) ** bin(i & j).count("1") for j in range(n)] for i in range(n)])


def dense_rotation(h: Hadamard, length: int) -> np.ndarray:
    """float64 block-diagonal matrix of length // size copies of diag(signs) @ H * norm."""
    norm = 1 / math.sqrt(h.size) if h.norm == "exact" else h.norm
    signs = np.ones(h.size) if h.signs is None else np.array(h.signs, dtype=np.float64)
    block = signs[:, None] * sylvester(h.size) * norm
    out = np.zeros((length, length))
    for k in range(0, length, h.size):
        out[k : k + h.size, k : k + h.size] = block
    return out


def rotate_np(x: np.ndarray, h: Hadamard, axis: int) -> np.ndarray:
    """x @ dense_rotation along axis, in float64 numpy."""
    moved = np.moveaxis(x.astype(np.float64), axis, -1)
    return np.moveaxis(moved @ dense_rotation(h, moved.shape[-1]), -1, axis)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """RNE to bfloat16 by ml_dtypes (exact from float32 sources)."""
    return x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


@st.composite
def hadamards(draw, max_log2: int = 8, dyadic_bits: int = 20) -> Hadamard:
    """A Hadamard with size <= 2**max_log2, optional signs and a norm k / 2**dyadic_bits.

    Dyadic norms keep the products the tests form exact (stated per test).
    """
    size = 2 ** draw(st.integers(0, max_log2))
    k = draw(st.integers(1, 2**dyadic_bits))
    signs = draw(st.none() | st.lists(st.sampled_from([1, -1]), min_size=size, max_size=size))
    return Hadamard(size, norm=k / 2**dyadic_bits, signs=None if signs is None else tuple(signs))


def int_tensor(seed: int, shape: tuple[int, ...], dtype: torch.dtype, bound: int = 8) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-bound, bound + 1, shape, generator=g).to(dtype)


# ------------------------------------------------------------------ hadamard_matrix


@pytest.mark.parametrize("n", [2**k for k in range(10)])
def test_hadamard_matrix_is_the_popcount_definition(n):
    h = hadamard_matrix(n, dtype=torch.float64)
    assert h.shape == (n, n)
    np.testing.assert_array_equal(h.numpy(), sylvester(n))


def test_hadamard_matrix_honours_dtype_and_device():
    h = hadamard_matrix(8, dtype=torch.bfloat16, device="cpu")
    assert h.dtype == torch.bfloat16 and h.device.type == "cpu"
    np.testing.assert_array_equal(h.float().numpy(), sylvester(8))


@pytest.mark.parametrize("n", [0, -4, 3, 12, 2.0, True, "16"])
def test_hadamard_matrix_rejects_sizes_that_are_not_powers_of_two(n):
    with pytest.raises(ValueError, match=rf"n={n!r} is not a power of two"):
        hadamard_matrix(n)


# ------------------------------------------------------------------ Hadamard


@given(hadamards())
def test_rotation_times_its_transpose_is_size_norm_squared_identity(h):
    # Entries are +-k/2**20, so each product is k**2/2**40 and every sum of <= 256 of them
    # is exact in float64: the identity holds with ==, not approximately.
    m = h.matrix(torch.float64)
    expected = h.size * h.norm**2 * np.eye(h.size)
    np.testing.assert_array_equal((m @ m.T).numpy(), expected)


@pytest.mark.parametrize("name", sorted(HADAMARDS))
def test_presets_scale_the_identity_by_size_norm_squared(name):
    h = HADAMARDS[name]
    m = h.matrix(torch.float64)
    np.testing.assert_array_equal((m @ m.T).numpy(), h.size * h.norm**2 * np.eye(h.size))


@pytest.mark.parametrize("size", [2**k for k in range(9)])
def test_exact_norm_is_orthonormal(size):
    m = Hadamard(size).matrix(torch.float64).numpy()
    # Entries are float64(1/sqrt(size)); each of the size products carries <= 2 ulp of
    # relative error, so the deviation from I stays below 4 * 2**-52 (sum of |terms| = 1).
    np.testing.assert_allclose(m @ m.T, np.eye(size), rtol=0, atol=4 * 2**-52)


@given(hadamards(max_log2=6))
def test_matrix_is_signed_sylvester_times_norm(h):
    signs = np.ones(h.size) if h.signs is None else np.array(h.signs, dtype=np.float64)
    expected = signs[:, None] * sylvester(h.size) * h.norm
    np.testing.assert_array_equal(h.matrix(torch.float64).numpy(), expected)
    assert h.scale == h.norm


def test_exact_norm_scale_is_one_over_sqrt_size():
    assert Hadamard(32).scale == 1 / math.sqrt(32)
    assert Hadamard(16).scale == 0.25


def test_signs_given_as_a_list_are_stored_as_a_hashable_tuple():
    h = Hadamard(2, signs=[1, -1])
    assert h.signs == (1, -1)
    assert hash(h) == hash(Hadamard(2, signs=(1, -1)))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"size": 0}, r"size=0 is not a power of two"),
        ({"size": 24}, r"size=24 is not a power of two"),
        ({"size": 4, "norm": 0.0}, r"norm=0.0; expected 'exact' or a positive finite"),
        ({"size": 4, "norm": -0.5}, r"norm=-0.5"),
        ({"size": 4, "norm": math.inf}, r"norm=inf"),
        ({"size": 4, "norm": math.nan}, r"norm=nan"),
        ({"size": 4, "norm": "half"}, r"norm='half'"),
        ({"size": 4, "norm": True}, r"norm=True"),
        ({"size": 4, "signs": (1, -1)}, r"signs has length 2; expected size=4"),
        ({"size": 2, "signs": (1, 0)}, r"signs must all be \+1 or -1; got \[0\]"),
        ({"size": 2, "signs": (1, 0.5)}, r"got \[0.5\]"),
        ({"size": 2, "round_input_to": torch.int8}, r"round_input_to=torch.int8 is not supported"),
        ({"size": 2, "round_output_to": torch.float64}, r"round_output_to=torch.float64"),
    ],
)
def test_hadamard_rejects_bad_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Hadamard(**kwargs)


# ------------------------------------------------------------------ presets


def test_h16x2_is_primus_fixed_h16_with_quarter_norm():
    # primus_stack.md 1.6: rht16_inplace, "* 0.25f", no sign vector on main.
    h = get_hadamard("h16x2")
    assert (h.size, h.norm, h.signs, h.round_input_to, h.round_output_to) == (16, 0.25, None, None, None)


def test_h32_norm_is_bf16_rounded_one_over_sqrt_32():
    # primus_stack.md 2.2: kHadamard32Norm = 0.1767578125f; inputs rounded to bf16 first.
    bf16_norm = float(np.float64(1 / math.sqrt(32)).astype(np.float32).astype(ml_dtypes.bfloat16))
    h = get_hadamard("h32")
    assert h.size == 32 and h.scale == bf16_norm == BF16_NORM_32
    assert h.round_input_to == torch.bfloat16 and h.signs is None and h.round_output_to is None


def test_h16_te_signs_match_transformer_engine_mask():
    h = get_hadamard("h16_te")
    from_mask = tuple(-1 if (TE_SIGN_MASK >> i) & 1 else 1 for i in range(16))
    assert h.signs == from_mask
    assert (h.size, h.norm, h.round_output_to, h.round_input_to) == (16, 0.25, torch.bfloat16, None)


def test_get_hadamard_passes_through_instances_and_none():
    h = Hadamard(8)
    assert get_hadamard(h) is h
    assert get_hadamard(None) is None


@pytest.mark.parametrize("spec", ["h64", "", 16])
def test_get_hadamard_rejects_unknown_names_listing_known_ones(spec):
    with pytest.raises(ValueError, match=r"is not known; expected one of \['h16_te', 'h16x2', 'h32'\]"):
        get_hadamard(spec)


# ------------------------------------------------------------------ apply_hadamard


def test_apply_h4_gives_primus_butterfly_outputs():
    # primus_stack.md 1.6: rht16 stage 1 emits [v0+v1+v2+v3, v0-v1+v2-v3, v0+v1-v2-v3, v0-v1-v2+v3].
    v0, v1, v2, v3 = 1.0, 2.0, 4.0, 8.0
    out = apply_hadamard(torch.tensor([v0, v1, v2, v3]), Hadamard(4, norm=1.0))
    expected = [v0 + v1 + v2 + v3, v0 - v1 + v2 - v3, v0 + v1 - v2 - v3, v0 - v1 - v2 + v3]
    assert out.tolist() == expected


@given(
    h=hadamards(max_log2=6, dyadic_bits=10),
    blocks=st.integers(1, 3),
    shape=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    where=st.integers(0, 2),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    seed=st.integers(0, 2**32 - 1),
)
def test_apply_hadamard_equals_dense_block_diagonal_product(h, blocks, shape, where, dtype, seed):
    # Integers in [-8, 8]: butterfly sums are integers <= 512 (10 bits) and norm = k/2**10,
    # so every result needs <= 20 bits and is exact in float32, bfloat16 inputs included.
    axis = min(where, len(shape))
    full = (*shape[:axis], blocks * h.size, *shape[axis:])
    x = int_tensor(seed, full, dtype)
    out = apply_hadamard(x, h, axis=axis)
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    np.testing.assert_array_equal(out.double().numpy(), rotate_np(x.double().numpy(), h, axis))


@pytest.mark.parametrize("size", [2, 8, 32, 64])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_apply_hadamard_with_exact_norm_is_within_one_rounding_of_float64(gen, size, axis):
    # Integer inputs make the butterfly exact; the float32 result is then
    # fl32(S * fl32(1/sqrt(size))): two roundings, relative error <= 2u + u**2, u = 2**-24.
    # The expected value is the exact integer sum S times float64 1/sqrt(size).
    x = torch.randint(-8, 9, (size, size, size), generator=gen).float()
    out = apply_hadamard(x, Hadamard(size), axis=axis)
    expected = rotate_np(x.numpy(), Hadamard(size, norm=1.0), axis) / math.sqrt(size)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1.01 * 2**-23, atol=0)


def test_apply_hadamard_in_float64_matches_numpy_on_random_inputs(gen):
    x = torch.randn(6, 96, generator=gen, dtype=torch.float64)
    h = Hadamard(32, signs=HADAMARDS["h16_te"].signs * 2)
    # log2(32) butterfly stages plus the norm: < 7 roundings of float64 per term.
    np.testing.assert_allclose(apply_hadamard(x, h).numpy(), rotate_np(x.numpy(), h, -1), rtol=0, atol=1e-13)


def test_apply_hadamard_rounds_input_to_bf16_first(gen):
    x = torch.randn(4, 64, generator=gen)
    assert not torch.equal(torch.from_numpy(bf16_round(x.numpy())), x)  # the rounding matters
    rounded = torch.from_numpy(bf16_round(x.numpy()))
    no_round = Hadamard(32, norm=BF16_NORM_32)
    assert torch.equal(apply_hadamard(x, "h32"), apply_hadamard(rounded, no_round))
    assert not torch.equal(apply_hadamard(x, "h32"), apply_hadamard(x, no_round))


def test_apply_hadamard_rounds_output_to_bf16_after(gen):
    x = torch.randn(4, 64, generator=gen)
    te = HADAMARDS["h16_te"]
    unrounded = apply_hadamard(x, Hadamard(16, norm=0.25, signs=te.signs))
    expected = bf16_round(unrounded.numpy())
    assert not np.array_equal(expected, unrounded.numpy())  # the rounding matters
    np.testing.assert_array_equal(apply_hadamard(x, "h16_te").numpy(), expected)


@pytest.mark.parametrize("field", ["round_input_to", "round_output_to"])
def test_float64_input_rounds_to_bf16_once_not_through_float32(field):
    # 1 + 2**-8 + 2**-30 lies above the midpoint of 1 and 1 + 2**-7, so RNE to bf16 gives
    # 1 + 2**-7; via float32 it first becomes the midpoint 1 + 2**-8 and then ties to 1.
    x = torch.tensor([1 + 2**-8 + 2**-30], dtype=torch.float64)
    out = apply_hadamard(x, Hadamard(1, norm=1.0, **{field: torch.bfloat16}))
    assert out.dtype == torch.float64
    assert out.item() == 1 + 2**-7


@st.composite
def near_midpoints(draw, low_bits: int) -> float:
    """A float64 at, or within a few float64 ulps of, a midpoint of a format whose codes are
    the top 32 - low_bits bits of float32: the cases double rounding gets wrong."""
    bits = draw(st.integers(0, 2**32 - 1)) & ~((1 << low_bits) - 1) | (1 << (low_bits - 1))
    mid = float(np.uint32(bits).view(np.float32))
    if not math.isfinite(mid):  # an all-ones exponent: keep the Inf, drop NaN payloads
        return math.copysign(math.inf, mid)
    for _ in range(draw(st.integers(0, 3))):
        mid = math.nextafter(mid, draw(st.sampled_from([math.inf, -math.inf])))
    return mid


@pytest.mark.parametrize(("dtype", "fmt"), [(torch.bfloat16, "bf16"), (torch.float16, "fp16")])
@given(data=st.data())
def test_float64_rounding_to_16_bits_is_correctly_rounded(dtype, fmt, data):
    # Witness: mxcheck.formats.encode rounds float64 on its integer bits (held against the
    # Fraction reference in the formats tests); saturate=False overflows to Inf as torch does.
    values = st.floats(allow_nan=False) | near_midpoints(16) | near_midpoints(13)
    x = torch.tensor(data.draw(st.lists(values, min_size=1, max_size=16)), dtype=torch.float64)
    out = apply_hadamard(x, Hadamard(1, norm=1.0, round_input_to=dtype))
    assert torch.equal(out.to(dtype).double().view(torch.int64), out.view(torch.int64))  # in dtype
    got = out.to(dtype).view(torch.int16).to(torch.int64) & 0xFFFF
    expected = encode(x, fmt, saturate=False).to(torch.int64)
    assert torch.equal(got, expected), (x, got, expected)


def test_apply_hadamard_does_not_modify_its_input(gen):
    x = torch.randn(3, 32, generator=gen)
    before = x.clone()
    apply_hadamard(x, "h16_te")
    assert torch.equal(x, before)


@pytest.mark.parametrize("h", [HADAMARDS["h16x2"], Hadamard(16, signs=HADAMARDS["h16_te"].signs), Hadamard(32)],
                         ids=["h16x2", "h16-te-signs", "h32-exact"])
def test_apply_hadamard_is_differentiable_and_gives_the_same_values_with_and_without_autograd(h, gen):
    # The butterflies write into place when autograd does not record them and stack when it
    # does: the same additions, so the same bits; the gradient of sum(w * y) is w times the
    # rotation's transpose (rotations without bf16 rounding, whose rounding has no gradient).
    x = torch.randn(4, 64, generator=gen, dtype=torch.float64)
    w = torch.randn(4, 64, generator=gen, dtype=torch.float64)
    xg = x.clone().requires_grad_()
    y = apply_hadamard(xg, h)
    assert torch.equal(y.detach(), apply_hadamard(x, h))
    (y * w).sum().backward()
    block = h.matrix(torch.float64)
    want = (w.reshape(4, -1, h.size) @ block.T).reshape(4, 64)
    torch.testing.assert_close(xg.grad, want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ GEMM invariance


@given(
    h=hadamards(max_log2=7).map(lambda h: Hadamard(h.size, signs=h.signs)),  # exact norm
    m=st.integers(1, 8),
    n=st.integers(1, 8),
    blocks=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_rotating_both_operands_leaves_the_product_unchanged(h, m, n, blocks, seed):
    g = torch.Generator().manual_seed(seed)
    k = blocks * h.size
    a, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    ra, rb = apply_hadamard(a, h), apply_hadamard(b, h)
    got = ra.double() @ rb.double().T
    truth = a.double() @ b.double().T
    # Each rotated element is the exact rotation plus e with |e| <= c*u*s*S, where S is the
    # sum of |x| over its block, s = 1/sqrt(size), u = 2**-24 and c = log2(size) + 2 (one
    # rounding per butterfly stage, one for fl32(s), one for the multiply). With R R^T = I,
    # (AR + E_A)(BR + E_B)^T - AB^T summed per block is <= (2c*u + (c*u)**2) * S_a * S_b
    # (size * s**2 = 1). The float64 products add ~1e-16 relative; 1.01 covers O(u**2).
    c = math.log2(h.size) + 2
    sa = a.double().abs().reshape(m, blocks, h.size).sum(-1)
    sb = b.double().abs().reshape(n, blocks, h.size).sum(-1)
    bound = 1.01 * (2 * c * 2**-24) * (sa @ sb.T)
    assert bool(((got - truth).abs() <= bound).all()), float(((got - truth).abs() / bound).max())


@given(
    m=st.integers(1, 6),
    n=st.integers(1, 6),
    blocks=st.integers(1, 8),
    seed=st.integers(0, 2**32 - 1),
)
def test_bf16_norm_scales_the_product_by_exactly_32_norm_squared(m, n, blocks, seed):
    # Integers in [-8, 8] are bf16-exact (h32's input rounding changes nothing); in float64
    # the rotated entries are integers * 181/1024 and their products sum exactly (< 2**53),
    # so (A R)(B R)^T == 32 * (181/1024)**2 * A B^T = 32761/32768 * A B^T with ==.
    a = int_tensor(seed, (m, 32 * blocks), torch.float64)
    b = int_tensor(seed + 1, (n, 32 * blocks), torch.float64)
    got = apply_hadamard(a, "h32") @ apply_hadamard(b, "h32").T
    expected = (32761 / 32768) * (a.numpy() @ b.numpy().T)
    assert 32 * BF16_NORM_32**2 == 32761 / 32768
    np.testing.assert_array_equal(got.numpy(), expected)


# ------------------------------------------------------------------ apply_hadamard errors


def test_apply_hadamard_rejects_a_length_that_is_not_a_multiple_of_size():
    with pytest.raises(ValueError, match=r"axis 1 has length 20, not a multiple of the Hadamard size 16"):
        apply_hadamard(torch.zeros(2, 20), "h16x2", axis=1)


def test_apply_hadamard_checks_the_axis_it_is_given():
    with pytest.raises(ValueError, match=r"axis 0 has length 3, not a multiple of the Hadamard size 32"):
        apply_hadamard(torch.zeros(3, 64), "h32", axis=0)


@pytest.mark.parametrize("axis", [2, -3])
def test_apply_hadamard_rejects_an_axis_out_of_range(axis):
    with pytest.raises(ValueError, match=rf"axis={axis} is out of range for a 2-d tensor of shape \(2, 16\)"):
        apply_hadamard(torch.zeros(2, 16), "h16x2", axis=axis)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.bool, torch.complex64])
def test_apply_hadamard_rejects_non_float_dtypes(dtype):
    with pytest.raises(TypeError, match=r"x.dtype=torch\.\w+ is not accepted"):
        apply_hadamard(torch.zeros(16, dtype=dtype), "h16x2")


def test_apply_hadamard_rejects_a_non_tensor():
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got list"):
        apply_hadamard([0.0] * 16, "h16x2")


def test_apply_hadamard_rejects_none_and_unknown_names():
    with pytest.raises(ValueError, match=r"hadamard=None"):
        apply_hadamard(torch.zeros(16), None)
    with pytest.raises(ValueError, match=r"hadamard='h8' is not known"):
        apply_hadamard(torch.zeros(16), "h8")
