"""Metrics against numpy float64 arithmetic, hand-derived values and ml_dtypes stepping."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mxcheck.metrics import (
    ULP_NAN,
    BitDiff,
    bit_diff,
    cosine,
    max_abs_error,
    relative_error,
    snr_db,
    ulp_distance,
)
from mxcheck.plugin import needs

with needs("ml_dtypes"):
    import ml_dtypes

pytestmark = pytest.mark.emulated

METRICS = [snr_db, cosine, relative_error, max_abs_error]
ML_DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def pair(seed: int, shape: tuple[int, ...], noise: float) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(shape, generator=g, dtype=torch.float64)
    return ref + noise * torch.randn(shape, generator=g, dtype=torch.float64), ref


shapes = st.lists(st.integers(1, 9), min_size=0, max_size=3).map(tuple)
seeds = st.integers(0, 2**32 - 1)
noises = st.sampled_from([1e-6, 1e-3, 0.1, 1.0, 10.0])


# ------------------------------------------------------------------ snr_db


@given(shape=shapes, seed=seeds, noise=noises)
def test_snr_db_matches_numpy_float64(shape, seed, noise):
    test, ref = pair(seed, shape, noise)
    t, r = test.numpy(), ref.numpy()
    expected = 10 * np.log10(np.sum(r**2) / np.sum((t - r) ** 2))
    # Only the summation order differs: a few float64 ulps on each sum.
    assert math.isclose(snr_db(test, ref), expected, rel_tol=1e-12, abs_tol=1e-10)


@pytest.mark.parametrize("k", [1, 3, 10, 20])
@pytest.mark.parametrize("sign", [1, -1])
def test_snr_db_of_relative_perturbation_eps_is_20_log10_one_over_eps(gen, k, sign):
    # float32 values times (1 + sign * 2**-k) need <= 24 + k + 1 bits: exact in float64, so
    # test - ref is exactly eps * ref and the ratio is exactly 1 / eps**2.
    eps = 2.0**-k
    ref = torch.randn(1000, generator=gen).double()
    test = ref * (1 + sign * eps)
    assert math.isclose(snr_db(test, ref), 20 * math.log10(1 / eps), rel_tol=1e-14)


def test_snr_db_computes_in_float64_not_in_the_input_dtype():
    # ref = 2**-100 and test = ref * (1 + 2**-20), both exact in float32: (test - ref)**2 =
    # 2**-240 underflows float32 to 0 (SNR Inf); in float64 the ratio is exactly 2**40.
    ref = torch.full((64,), 2.0**-100, dtype=torch.float32)
    test = ref * (1 + 2**-20)
    assert math.isclose(snr_db(test, ref), 20 * math.log10(2**20), rel_tol=1e-12)


def test_snr_db_takes_bf16_and_fp16_inputs():
    ref = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.bfloat16)
    test = torch.tensor([1.0, 2.0, 4.0, 8.5], dtype=torch.float16)
    # sum(ref^2) = 85, noise = 0.25
    assert math.isclose(snr_db(test, ref), 10 * math.log10(85 / 0.25), rel_tol=1e-14)


def test_snr_db_of_identical_nonzero_tensors_is_inf(gen):
    x = torch.randn(7, 5, generator=gen)
    assert snr_db(x, x.clone()) == math.inf


def test_snr_db_of_all_zero_ref_is_nan_when_test_is_zero_and_minus_inf_otherwise():
    zeros = torch.zeros(4)
    assert math.isnan(snr_db(zeros, zeros))
    assert snr_db(torch.tensor([0.0, 0.0, 1e-3, 0.0]), zeros) == -math.inf


def test_snr_db_with_nan_or_inf_inputs():
    ref = torch.tensor([1.0, 2.0, 3.0])
    assert math.isnan(snr_db(torch.tensor([1.0, math.nan, 3.0]), ref))
    assert math.isnan(snr_db(ref, torch.tensor([1.0, math.nan, 3.0])))
    assert snr_db(torch.tensor([1.0, math.inf, 3.0]), ref) == -math.inf
    assert math.isnan(snr_db(ref, torch.tensor([1.0, math.inf, 3.0])))


# ------------------------------------------------------------------ cosine, errors


@given(shape=shapes, seed=seeds, noise=noises)
def test_cosine_relative_and_max_error_match_numpy(shape, seed, noise):
    test, ref = pair(seed, shape, noise)
    t, r = test.numpy().ravel(), ref.numpy().ravel()
    assert math.isclose(cosine(test, ref), np.dot(t, r) / (np.linalg.norm(t) * np.linalg.norm(r)),
                        rel_tol=1e-12, abs_tol=1e-15)
    assert math.isclose(relative_error(test, ref), np.linalg.norm(t - r) / np.linalg.norm(r), rel_tol=1e-12)
    assert max_abs_error(test, ref) == np.max(np.abs(t - r))


def test_cosine_of_parallel_antiparallel_and_orthogonal_vectors():
    x = torch.tensor([3.0, -4.0, 0.0])
    assert cosine(2 * x, x) == 1.0
    assert cosine(-x, x) == -1.0
    assert cosine(torch.tensor([4.0, 3.0, 7.0]), x) == 0.0


def test_cosine_is_clamped_where_rounding_would_push_it_past_one():
    # Unclamped, this float64 dot / (norm * norm) evaluates to 1.0000000000000002.
    x = torch.tensor([0.54, 0.21, 0.36], dtype=torch.float64)
    assert cosine(3 * x, x) == 1.0
    assert cosine(-3 * x, x) == -1.0


def test_cosine_with_an_all_zero_side_is_nan():
    assert math.isnan(cosine(torch.zeros(3), torch.ones(3)))
    assert math.isnan(cosine(torch.ones(3), torch.zeros(3)))


def test_relative_error_known_values_and_zero_ref():
    ref = torch.tensor([3.0, 4.0])  # norm 5
    assert relative_error(torch.tensor([3.0, 5.0]), ref) == 0.2
    assert relative_error(ref, ref) == 0.0
    assert math.isnan(relative_error(torch.zeros(2), torch.zeros(2)))
    assert relative_error(torch.ones(2), torch.zeros(2)) == math.inf


def test_max_abs_error_known_value_and_nan():
    ref = torch.tensor([1.0, -2.0, 3.0])
    assert max_abs_error(torch.tensor([1.5, -4.0, 3.0]), ref) == 2.0
    assert math.isnan(max_abs_error(torch.tensor([1.0, math.nan, 3.0]), ref))


@pytest.mark.parametrize("metric", METRICS, ids=lambda f: f.__name__)
def test_metrics_reject_mismatched_shapes_naming_both(metric):
    with pytest.raises(ValueError, match=r"test.shape=\(2, 3\) and ref.shape=\(3, 2\) differ"):
        metric(torch.zeros(2, 3), torch.ones(3, 2))


@pytest.mark.parametrize("metric", METRICS, ids=lambda f: f.__name__)
def test_metrics_reject_empty_tensors(metric):
    with pytest.raises(ValueError, match=r"empty \(shape \(0, 4\)\): nothing to compare"):
        metric(torch.zeros(0, 4), torch.zeros(0, 4))


@pytest.mark.parametrize("metric", METRICS, ids=lambda f: f.__name__)
def test_metrics_reject_non_tensors_and_complex(metric):
    with pytest.raises(TypeError, match=r"test must be a torch.Tensor, got list"):
        metric([1.0], torch.ones(1))
    with pytest.raises(TypeError, match=r"ref.dtype=torch.complex64"):
        metric(torch.ones(1), torch.ones(1, dtype=torch.complex64))


# ------------------------------------------------------------------ ulp_distance


@functools.cache
def ml_dtypes_ladder(name: str) -> np.ndarray:
    """Every value of the format in order, walked with np.nextafter on ml_dtypes arrays from
    the lowest value to the highest (-Inf..Inf for e5m2, -max..max for e4m3fn); +-0 is one rung."""
    dt = ML_DTYPES[name]
    top = np.inf if name == "e5m2" else float(ml_dtypes.finfo(dt).max)
    v, end = np.array([-top], dtype=dt), np.array([top], dtype=dt)
    rungs = [v]
    while v[0] != end[0]:
        v = np.nextafter(v, end)
        rungs.append(v)
    return np.concatenate(rungs).astype(np.float64)


def ladder_distance(a: np.ndarray, b: np.ndarray, name: str) -> np.ndarray:
    ladder = ml_dtypes_ladder(name)
    ra = a.astype(np.float32).astype(ML_DTYPES[name]).astype(np.float64)  # RNE, no saturation
    rb = b.astype(np.float32).astype(ML_DTYPES[name]).astype(np.float64)
    return np.abs(np.searchsorted(ladder, ra) - np.searchsorted(ladder, rb))


def test_ml_dtypes_ladders_have_every_value_once():
    # e4m3fn: 126 positive finite + 126 negative + zero; e5m2: 123 + 123 + zero + two Inf.
    assert len(ml_dtypes_ladder("e4m3")) == 253
    assert len(ml_dtypes_ladder("e5m2")) == 249


@pytest.mark.parametrize("name", sorted(ML_DTYPES))
@given(data=st.data())
def test_ulp_distance_counts_ml_dtypes_nextafter_steps(name, data):
    # Up to the largest value that rounds to max (RNE): beyond, e4m3fn has NaN (tested below).
    top = {"e4m3": 463.0, "e5m2": 1e6}[name]
    values = st.floats(-top, top, width=32) | st.sampled_from([0.0, -0.0, 2.0**-9, -(2.0**-16)])
    n = data.draw(st.integers(1, 32))
    a = np.array(data.draw(st.lists(values, min_size=n, max_size=n)), dtype=np.float32)
    b = np.array(data.draw(st.lists(values, min_size=n, max_size=n)), dtype=np.float32)
    got = ulp_distance(torch.from_numpy(a), torch.from_numpy(b), name)
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), ladder_distance(a, b, name))


@pytest.mark.parametrize(
    ("fmt", "a", "b", "expected"),
    [
        ("e4m3", 1.0, 1.125, 1),  # 0x38 -> 0x39 (OCP MX spec e4m3 table)
        ("e4m3", 0.0, -0.0, 0),  # +0 and -0 are one value
        ("e4m3", 2.0**-9, -(2.0**-9), 2),  # smallest subnormals straddle zero
        ("e4m3", 1.0625, 1.0, 0),  # the tie rounds to even, 1.0
        ("e4m3", 1.07, 1.0, 1),  # above the tie, 1.125
        ("e4m3", 448.0, -448.0, 252),  # 0x7E and 0xFE: 126 + 126
        ("e5m2", 57344.0, math.inf, 1),  # max to Inf
        ("e5m2", 1e9, math.inf, 0),  # no saturation: overflow is Inf
        ("e2m1", 0.5, 6.0, 6),  # e2m1 values 0, .5, 1, 1.5, 2, 3, 4, 6
        ("e2m1", 100.0, 6.0, 0),  # fp4 has no Inf or NaN: overflow is +-max
        ("e8m0", 1.0, 2.0**10, 10),  # one code per binade
    ],
)
def test_ulp_distance_known_values(fmt, a, b, expected):
    got = ulp_distance(torch.tensor([a]), torch.tensor([b]), fmt)
    assert got.tolist() == [expected]


def test_ulp_distance_nan_pairs_are_zero_and_nan_against_a_number_is_the_sentinel():
    a = torch.tensor([math.nan, math.nan, 1.0, 500.0])
    b = torch.tensor([-math.nan, 1.0, math.nan, 448.0])
    # 500 rounds past 448 without saturation, to e4m3fn's NaN.
    assert ulp_distance(a, b, "e4m3").tolist() == [0, ULP_NAN, ULP_NAN, ULP_NAN]
    assert ULP_NAN > 2**16


@pytest.mark.parametrize("fmt", ["e2m1", "e2m3", "e3m2"])
def test_ulp_distance_rejects_nan_for_formats_without_nan(fmt):
    with pytest.raises(ValueError, match=rf"b holds NaN but fmt={fmt} has no NaN code"):
        ulp_distance(torch.zeros(2), torch.tensor([0.0, math.nan]), fmt)


def test_ulp_distance_rejects_mismatched_shapes_and_unknown_formats():
    with pytest.raises(ValueError, match=r"a.shape=\(2,\) and b.shape=\(3,\) differ"):
        ulp_distance(torch.zeros(2), torch.zeros(3), "e4m3")
    with pytest.raises(ValueError, match=r"fmt='e9m9' is not a known format"):
        ulp_distance(torch.zeros(2), torch.zeros(2), "e9m9")
    with pytest.raises(TypeError, match=r"b must be a torch.Tensor, got float"):
        ulp_distance(torch.zeros(2), 0.0, "e4m3")


# ------------------------------------------------------------------ bit_diff

# e4m3fn codes (OCP MX spec): 0x38 = 1.0, 0x39 = 1.125, 0x3A = 1.25, 0x7F / 0xFF = NaN,
# 0x00 = +0, 0x80 = -0, 0x40 = 2.0, 0xC0 = -2.0.
TEST_CODES = [[0x38, 0x7F, 0x00], [0x7F, 0x40, 0x3A]]
REF_CODES = [[0x39, 0xFF, 0x80], [0x7F, 0x40, 0x38]]


def codes(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.uint8)


def test_bit_diff_counts_and_locates_differences_with_values_and_ulps():
    d = bit_diff(codes(TEST_CODES), codes(REF_CODES), "e4m3")
    # Equal NaN bits (0x7F, 0x7F) match; NaN bits 0x7F vs 0xFF and +0 vs -0 differ as bits.
    assert (d.n_diff, d.total, d.shape) == (4, 6, (2, 3))
    assert d.indices == ((0, 0), (0, 1), (0, 2), (1, 2))
    assert d.test_codes == (0x38, 0x7F, 0x00, 0x3A)
    assert d.ref_codes == (0x39, 0xFF, 0x80, 0x38)
    assert d.test_values[0] == 1.0 and d.ref_values[0] == 1.125
    assert math.isnan(d.test_values[1]) and math.isnan(d.ref_values[1])
    assert d.test_values[2] == 0.0 and math.copysign(1, d.ref_values[2]) == -1
    assert d.max_ulp == 2  # 1.25 vs 1.0; the NaN pair and the zeros are 0 apart
    assert d.fmt == "e4m3" and not d.equal


def test_bit_diff_str_reads_as_an_assertion_message():
    text = str(bit_diff(codes(TEST_CODES), codes(REF_CODES), "e4m3", limit=2))
    assert text.startswith("4 of 6 codes (e4m3) differ (66.7%), shape [2, 3]; max 2 ulp")
    assert "first 2:" in text
    assert "[0, 0]: test 0x38 ref 0x39 (1.0 vs 1.125)" in text
    assert "[0, 1]: test 0x7f ref 0xff (nan vs nan)" in text
    assert "[0, 2]" not in text


def test_bit_diff_without_a_format_reports_codes_only():
    d = bit_diff(codes(TEST_CODES), codes(REF_CODES))
    assert d.n_diff == 4 and d.max_ulp is None and d.test_values is None and d.fmt is None
    assert str(d).splitlines()[0] == "4 of 6 codes differ (66.7%), shape [2, 3]"


def test_bit_diff_of_equal_codes():
    d = bit_diff(codes(TEST_CODES), codes(TEST_CODES), "e4m3")
    assert d.equal and d.n_diff == 0 and d.indices == () and d.max_ulp == 0
    assert str(d) == "all 6 codes (e4m3) equal, shape [2, 3]"


def test_bit_diff_nan_against_a_number_reports_the_sentinel():
    d = bit_diff(codes([[0x7F, 0x38]]), codes([[0x38, 0x38]]), "e4m3")
    assert d.max_ulp == ULP_NAN
    assert "max ulp: NaN vs number" in str(d)


def test_bit_diff_limit_keeps_the_first_differences_in_row_major_order():
    t = torch.zeros(4, 5, dtype=torch.uint8)
    r = t.clone()
    r[3, 4] = r[1, 2] = r[0, 3] = 1
    d = bit_diff(t, r, limit=2)
    assert d.n_diff == 3 and d.indices == ((0, 3), (1, 2))


def test_bit_diff_compares_float_tensors_through_their_bits():
    t = torch.tensor([0.0, math.nan, 1.0, 2.0], dtype=torch.bfloat16)
    r = torch.tensor([-0.0, math.nan, 1.0, 2.015625], dtype=torch.bfloat16)
    d = bit_diff(t, r, "bf16")
    # bf16 bits: +0 0x0000, -0 0x8000; 2.0 0x4000, 2.015625 0x4001; NaN bits equal.
    assert d.indices == ((0,), (3,))
    assert d.test_codes == (0x0000, 0x4000) and d.ref_codes == (0x8000, 0x4001)
    assert d.max_ulp == 1


def test_bit_diff_takes_e2m1_codes_in_int32():
    d = bit_diff(torch.tensor([1, 7, 15], dtype=torch.int32), torch.tensor([2, 7, 9], dtype=torch.int32), "e2m1")
    # e2m1: 1 = 0.5, 2 = 1.0, 15 = -6, 9 = -0.5: distances 1 and 6 (-6 -4 -3 -2 -1.5 -1 -0.5).
    assert d.test_values == (0.5, -6.0) and d.ref_values == (1.0, -0.5)
    assert d.max_ulp == 6


def test_bit_diff_returns_a_frozen_dataclass():
    d = bit_diff(codes(TEST_CODES), codes(REF_CODES))
    assert isinstance(d, BitDiff)
    with pytest.raises(AttributeError):
        d.n_diff = 0


def test_bit_diff_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"test_codes.shape=\(2, 3\) and ref_codes.shape=\(3, 2\) differ"):
        bit_diff(torch.zeros(2, 3, dtype=torch.uint8), torch.zeros(3, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"ref_codes holds 1 values outside \[0, 15\] for fmt=e2m1 \(first 0x10\)"):
        bit_diff(torch.zeros(2, dtype=torch.uint8), torch.tensor([0, 16], dtype=torch.uint8), "e2m1")
    with pytest.raises(TypeError, match=r"test_codes.dtype=torch.bool"):
        bit_diff(torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.uint8))
    with pytest.raises(TypeError, match=r"ref_codes must be a torch.Tensor, got list"):
        bit_diff(torch.zeros(2, dtype=torch.uint8), [0, 0])
    with pytest.raises(ValueError, match=r"limit=-1; expected an int >= 0"):
        bit_diff(torch.zeros(2, dtype=torch.uint8), torch.zeros(2, dtype=torch.uint8), limit=-1)


@pytest.mark.parametrize(("test", "ref"), [
    ([0.5, -1.0, 2.0, 3.0], [0.4, -1.0, 2.5, 2.0]),
    ([1.0, float("nan")], [1.0, 2.0]),
    ([float("inf"), 1.0], [1.0, 1.0]),
    ([0.0, 0.0], [0.0, 0.0]),
    ([1.0, 2.0], [1.0, 2.0]),
    ([3.0, 0.0], [0.0, 0.0]),
])
def test_compare_equals_the_three_metrics(test, ref):
    from mxcheck.metrics import compare

    t, r = torch.tensor(test), torch.tensor(ref)
    c = compare(t, r)
    for got, want in ((c.snr_db, snr_db(t, r)), (c.cosine, cosine(t, r)), (c.max_abs_error, max_abs_error(t, r))):
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-12, abs=0)


@pytest.mark.parametrize("special", [None, float("nan"), float("inf")])
def test_compare_over_chunks_equals_the_three_metrics(special, gen, monkeypatch):
    # On a CPU compare reads float64 copies of one chunk at a time; here 7 chunks, the last
    # one short, a NaN or Inf (if any) in the 5th: the sums, the max and NaN carry across.
    import mxcheck.metrics as metrics

    monkeypatch.setattr(metrics, "CPU_CHUNK_ELEMENTS", 100)
    t = torch.randn(13, 50, generator=gen)
    r = t + torch.randn(13, 50, generator=gen) * 1e-3
    if special is not None:
        t[9, 3] = special
    c = metrics.compare(t.bfloat16(), r)
    for got, want in ((c.snr_db, snr_db(t.bfloat16(), r)), (c.cosine, cosine(t.bfloat16(), r)),
                      (c.max_abs_error, max_abs_error(t.bfloat16(), r))):
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-12, abs=0)
    assert math.isnan(c.max_abs_error) == (special is not None and math.isnan(special))  # the premise


def test_cosine_of_a_nan_or_inf_is_nan_not_a_clamp_bound():
    assert math.isnan(cosine(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0])))
    assert math.isnan(cosine(torch.tensor([float("inf"), 1.0]), torch.tensor([1.0, 1.0])))
