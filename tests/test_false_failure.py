"""Every randomized check states its false-failure probability, and a run's union stays
under mxcheck.false_failure.RUN_BUDGET (issue 14)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mxcheck import false_failure as ff
from mxcheck.conformance.sr import SR_FALSE_FAILURE
from mxcheck.recipes import LINEAR_DIRECTIONS, RECIPES, get_recipe
from tests import test_fp8, test_mx, test_nvfp4
from tests.conformance import test_conformance, test_sr_stats

pytestmark = pytest.mark.emulated

TESTS = Path(__file__).parent


def test_a_run_stays_under_the_budget_fast_and_with_the_slow_tests():
    fast = sum(c.per_run for c in ff.REGISTRY if not c.slow)
    assert fast <= ff.RUN_BUDGET, {c.where: c.per_run for c in ff.REGISTRY}
    assert fast + sum(c.per_run for c in ff.REGISTRY if c.slow) <= ff.RUN_BUDGET


@pytest.mark.parametrize("family", sorted(ff.SNR_FLOORS))
def test_every_measured_floor_sits_min_z_standard_deviations_under_the_snr(family):
    """The normal model is an assumption; a margin of MIN_Z sd keeps it from mattering, and
    no measured seed may have failed."""
    for key, m in ff.MEASURED_SNR[family].items():
        floor = ff.snr_floor(family, key)
        assert m.min > floor, (family, key, m, floor)
        assert (m.mean - floor) / m.sd >= ff.MIN_Z, (family, key, m, floor)


# family -> the comparisons one run makes, from the tests' own parametrizations
PARAMETRIZATIONS = {
    "linear": {(r, d) for r in test_conformance.RECIPE_NAMES for d in LINEAR_DIRECTIONS},
    "functions": {(r, d) for r in RECIPES for d in LINEAR_DIRECTIONS},
    "mlp": {("mxfp6",)},
    "mx": {(f, r) for f in ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2") for r in test_mx.RULES},
    "fp8": {(f, g) for f in test_fp8.FP8_FORMATS for g in ("tensor", "row", "block1x128", "block128x128")},
    "nvfp4": {(m,) for m in test_nvfp4.SNR_FLOORS},
    "hpair": {("mxfp4",), ("mxfp4-noH",), ("|difference| under 2 dB",)},
}


@pytest.mark.parametrize("family", sorted(PARAMETRIZATIONS))
def test_every_parametrization_has_a_measurement(family):
    assert set(ff.MEASURED_SNR[family]) == PARAMETRIZATIONS[family]


def test_sr_calls_per_run_are_the_recipes_that_round_g_row_stochastically():
    def sr_on_g_row(r):
        return r.g_row.rounding == "sr" and r.g_row.hadamard is None

    calls = sum(sr_on_g_row(get_recipe(n)) for n in test_conformance.RECIPE_NAMES)
    calls += sum(sr_on_g_row(r) for r in test_sr_stats.SR_RECIPES.values())
    assert ff.SR_CALLS == calls
    entry = next(c for c in ff.REGISTRY if c.where.endswith("check_sr_unbiased"))
    assert entry.per_run == calls * SR_FALSE_FAILURE


# Test functions that take the seeded generator and hold a statistic to a threshold: an
# SNR floor or a deviation bound. Those below are not randomized (a NaN or a threshold set
# from the measured value itself) and say why.
_STATISTICAL = ("snr(", "sr_deviation_bound", "sigma", "cosine")
_NOT_RANDOMIZED = {
    "test_assert_snr_fails_a_nan_snr": "a NaN SNR fails at any draw",
    "test_assert_snr_fails_half_a_db_below_threshold": "threshold = measured + 0.5 dB; its 'cosine 0.99' text "
                                                       "is registered with the passing twin",
    "test_numerics_records_a_failure_before_raising_it": "expects a failure: 40 dB against ~20 dB (noise 0.1), "
                                                         "z ~ 147 the other way",
    "test_dot_scaled_gemm_within_fp32_accumulation_of_the_exact_product": "cuda only, not in the emulated run "
                                                                           "(its floor is the randn GEMM floor)",
    "test_compare_over_chunks_equals_the_three_metrics": "compares two computations of the same metrics on one "
                                                         "draw (float64 summation order, 1e-12): any draw",
}


def _seeded_statistical_tests() -> set[str]:
    found = set()
    for path in TESTS.rglob("test_*.py"):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                args = {a.arg for a in node.args.args}
                body = ast.get_source_segment(source, node) or ""
                if args & {"gen", "mxcheck_generator"} and any(s in body for s in _STATISTICAL):
                    found.add(node.name)
    return found


def test_every_seeded_statistical_test_is_registered():
    registered = " ".join(c.where for c in ff.REGISTRY)
    missing = sorted(n for n in _seeded_statistical_tests() - set(_NOT_RANDOMIZED) if n not in registered)
    assert not missing, f"register these in mxcheck.false_failure (or say why they are not randomized): {missing}"
