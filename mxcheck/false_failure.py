"""False-failure probabilities of the suite's randomized checks, as data.

A randomized check can fail a correct implementation because of its random draws. Each
one is registered here (``REGISTRY``) with where it lives, how many calls one emulated run
(``pytest -m "emulated and not slow"``, the emulated backend) makes, its probability per
run and how that number was derived. ``tests/test_false_failure.py`` holds the union over
the whole run (the sum of ``per_run``) at or under ``RUN_BUDGET``, and ties each entry's
parametrizations to the real ones, so a new recipe or a raised floor without a new
measurement fails there.

Derivations (``kind``):

- ``bound``: an analytic tail bound that holds for every seed and input (Bernstein's
  inequality for the share of stochastic roundings that went up, with a union bound over
  the elements: ``mxcheck.conformance.sr_deviation_bound``).
- ``margin``: an SNR floor on seeded random data. Pass or fail is deterministic per seed,
  so the probability is over the seed: P(SNR < floor). ``tools/flake_margins.py`` calls
  the check's own function over many seeds and records each comparison's SNR mean,
  standard deviation and minimum (``MEASURED_SNR``); under a **normal model of the SNR
  over seeds** the probability is Phi(-(mean - floor) / sd), with the floor read live
  from ``mxcheck.thresholds``. "0 failures in N seeds" alone cannot show 1e-6, so the test
  also holds every z = (mean - floor) / sd at or above ``MIN_Z`` (Phi(-5.3) = 5.8e-8): a
  margin of 5.3 standard deviations, where a moderate departure from normality still
  leaves the tail far under the budget.
- ``chi2``: an SNR or cosine threshold on a sum of many independent squares, whose
  relative standard deviation is known analytically (sqrt(2 / n) per sum); the Gaussian
  tail at the stated z.
- ``collision``: "another seed or input gives another result": it fails only if two
  independent stochastic roundings agree at every element, P = prod_i max(p_i, 1 - p_i)
  over the elements' up-probabilities; measured on the oracle as log10 of that product.

Checks with a fixed seed (not ``--mxcheck-seed``: ``tests/test_thresholds.py``,
``tests/test_stats.py``, the convergence runs, the Flux model floors) and Hypothesis tests
(the ``ci`` profile is ``derandomize=True``) see the same bits on every run: they cannot
fail falsely run to run, and are listed in README's table as deterministic, not here.
Worst-case bounds (the fp32-accumulation bound of ``check_gemm``, "within one rounding")
hold for every input and are not randomized checks at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from mxcheck import thresholds
from mxcheck.conformance.sr import SR_FALSE_FAILURE

__all__ = ["MEASURED_SNR", "MIN_Z", "REGISTRY", "RUN_BUDGET", "MeasuredSNR", "RandomizedCheck",
           "gaussian_tail", "margin_probability", "snr_floor"]

RUN_BUDGET = 1e-6  # issue 14: every randomized check together, per run
MIN_Z = 5.3  # a measured margin's least size in standard deviations (see the module docstring)


def gaussian_tail(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2))


@dataclass(frozen=True)
class MeasuredSNR:
    """SNR (dB) of one comparison over ``seeds`` seeds (tools/flake_margins.py)."""

    mean: float
    sd: float
    min: float
    seeds: int


def margin_probability(m: MeasuredSNR, floor_db: float) -> float:
    """P(SNR < floor) under a normal model of the SNR over seeds."""
    if m.sd == 0:
        return 0.0 if m.mean > floor_db else 1.0
    return gaussian_tail((m.mean - floor_db) / m.sd)


# family -> the floor of a comparison key, read live from mxcheck.thresholds
SNR_FLOORS: dict[str, Callable[[tuple[str, ...]], float]] = {
    "linear": lambda key: thresholds.linear_floor(key[0], key[1]),
    "functions": lambda key: thresholds.linear_floor(key[0], key[1]),
    "mlp": lambda key: thresholds.model_floor(f"mlp/{key[0]}"),
    "mx": lambda key: thresholds.quantize_floor(f"mx/{key[0]}"),
    "fp8": lambda key: thresholds.quantize_floor(f"fp8/{key[0]}"),
    "nvfp4": lambda key: thresholds.quantize_floor(f"nvfp4/{key[0]}"),
    # test_mxfp4_wgrad_hadamard_pair_cancels: SNR > 12 dB with and without the rotation, and
    # their difference under 2 dB (recorded as the margin 2 - |difference| over 0)
    "hpair": lambda key: 0.0 if key[0].startswith("|") else 12.0,
}


def snr_floor(family: str, key: tuple[str, ...]) -> float:
    return SNR_FLOORS[family](key)


# SNR (dB) per comparison over seeds: tools/flake_margins.py --json, then --emit.
MEASURED_SNR: dict[str, dict[tuple[str, ...], MeasuredSNR]] = {
    'fp8': {
        ('e4m3', 'block128x128'): MeasuredSNR(31.551, 0.027, 31.494, 60),
        ('e4m3', 'block1x128'): MeasuredSNR(31.795, 0.031, 31.725, 60),
        ('e4m3', 'row'): MeasuredSNR(31.666, 0.028, 31.601, 60),
        ('e4m3', 'tensor'): MeasuredSNR(31.549, 0.030, 31.470, 60),
        ('e4m3fnuz', 'block128x128'): MeasuredSNR(31.538, 0.029, 31.434, 60),
        ('e4m3fnuz', 'block1x128'): MeasuredSNR(31.864, 0.029, 31.807, 60),
        ('e4m3fnuz', 'row'): MeasuredSNR(31.711, 0.027, 31.651, 60),
        ('e4m3fnuz', 'tensor'): MeasuredSNR(31.550, 0.033, 31.489, 60),
        ('e5m2', 'block128x128'): MeasuredSNR(25.570, 0.027, 25.516, 60),
        ('e5m2', 'block1x128'): MeasuredSNR(25.795, 0.032, 25.734, 60),
        ('e5m2', 'row'): MeasuredSNR(25.672, 0.033, 25.601, 60),
        ('e5m2', 'tensor'): MeasuredSNR(25.578, 0.030, 25.514, 60),
        ('e5m2fnuz', 'block128x128'): MeasuredSNR(25.570, 0.027, 25.516, 60),
        ('e5m2fnuz', 'block1x128'): MeasuredSNR(25.795, 0.032, 25.734, 60),
        ('e5m2fnuz', 'row'): MeasuredSNR(25.672, 0.033, 25.601, 60),
        ('e5m2fnuz', 'tensor'): MeasuredSNR(25.578, 0.030, 25.514, 60),
    },
    'functions': {
        ('fp8-block', 'bgrad'): MeasuredSNR(55.673, 0.502, 54.584, 60),
        ('fp8-block', 'dgrad'): MeasuredSNR(28.493, 0.030, 28.431, 60),
        ('fp8-block', 'fwd'): MeasuredSNR(28.533, 0.037, 28.432, 60),
        ('fp8-block', 'wgrad'): MeasuredSNR(28.474, 0.030, 28.413, 60),
        ('fp8-delayed', 'bgrad'): MeasuredSNR(55.673, 0.502, 54.584, 60),
        ('fp8-delayed', 'dgrad'): MeasuredSNR(24.597, 0.038, 24.531, 60),
        ('fp8-delayed', 'fwd'): MeasuredSNR(28.581, 0.036, 28.513, 60),
        ('fp8-delayed', 'wgrad'): MeasuredSNR(24.602, 0.030, 24.519, 60),
        ('fp8-hybrid', 'bgrad'): MeasuredSNR(55.673, 0.502, 54.584, 60),
        ('fp8-hybrid', 'dgrad'): MeasuredSNR(24.597, 0.038, 24.531, 60),
        ('fp8-hybrid', 'fwd'): MeasuredSNR(28.581, 0.036, 28.513, 60),
        ('fp8-hybrid', 'wgrad'): MeasuredSNR(24.602, 0.030, 24.519, 60),
        ('fp8-rowwise', 'bgrad'): MeasuredSNR(55.673, 0.502, 54.584, 60),
        ('fp8-rowwise', 'dgrad'): MeasuredSNR(28.493, 0.030, 28.431, 60),
        ('fp8-rowwise', 'fwd'): MeasuredSNR(28.533, 0.037, 28.432, 60),
        ('fp8-rowwise', 'wgrad'): MeasuredSNR(28.474, 0.030, 28.413, 60),
        ('fp8', 'bgrad'): MeasuredSNR(55.673, 0.502, 54.584, 60),
        ('fp8', 'dgrad'): MeasuredSNR(28.542, 0.027, 28.475, 60),
        ('fp8', 'fwd'): MeasuredSNR(28.581, 0.036, 28.513, 60),
        ('fp8', 'wgrad'): MeasuredSNR(28.540, 0.031, 28.473, 60),
        ('mxfp4-1x32', 'bgrad'): MeasuredSNR(55.673, 0.502, 54.584, 60),
        ('mxfp4-1x32', 'dgrad'): MeasuredSNR(15.991, 0.025, 15.924, 60),
        ('mxfp4-1x32', 'fwd'): MeasuredSNR(16.049, 0.036, 15.936, 60),
        ('mxfp4-1x32', 'wgrad'): MeasuredSNR(16.026, 0.030, 15.953, 60),
        ('mxfp4-fp8bwd', 'bgrad'): MeasuredSNR(55.673, 0.502, 54.584, 60),
        ('mxfp4-fp8bwd', 'dgrad'): MeasuredSNR(22.575, 0.032, 22.500, 60),
        ('mxfp4-fp8bwd', 'fwd'): MeasuredSNR(15.609, 0.036, 15.519, 60),
        ('mxfp4-fp8bwd', 'wgrad'): MeasuredSNR(22.575, 0.029, 22.486, 60),
        ('mxfp4', 'bgrad'): MeasuredSNR(55.673, 0.502, 54.584, 60),
        ('mxfp4', 'dgrad'): MeasuredSNR(15.552, 0.028, 15.460, 60),
        ('mxfp4', 'fwd'): MeasuredSNR(15.609, 0.036, 15.519, 60),
        ('mxfp4', 'wgrad'): MeasuredSNR(16.034, 0.025, 15.975, 60),
        ('mxfp6', 'bgrad'): MeasuredSNR(55.673, 0.502, 54.584, 60),
        ('mxfp6', 'dgrad'): MeasuredSNR(28.016, 0.029, 27.945, 60),
        ('mxfp6', 'fwd'): MeasuredSNR(28.005, 0.039, 27.915, 60),
        ('mxfp6', 'wgrad'): MeasuredSNR(27.976, 0.029, 27.900, 60),
        ('mxfp8', 'bgrad'): MeasuredSNR(55.673, 0.502, 54.584, 60),
        ('mxfp8', 'dgrad'): MeasuredSNR(28.493, 0.030, 28.431, 60),
        ('mxfp8', 'fwd'): MeasuredSNR(28.533, 0.037, 28.432, 60),
        ('mxfp8', 'wgrad'): MeasuredSNR(28.474, 0.030, 28.413, 60),
        ('nvfp4', 'bgrad'): MeasuredSNR(55.673, 0.502, 54.584, 60),
        ('nvfp4', 'dgrad'): MeasuredSNR(15.064, 0.033, 14.979, 60),
        ('nvfp4', 'fwd'): MeasuredSNR(16.747, 0.032, 16.692, 60),
        ('nvfp4', 'wgrad'): MeasuredSNR(15.544, 0.037, 15.473, 60),
    },
    'hpair': {
        ('mxfp4-noH',): MeasuredSNR(16.026, 0.030, 15.953, 60),
        ('mxfp4',): MeasuredSNR(16.034, 0.025, 15.975, 60),
        ('|difference| under 2 dB',): MeasuredSNR(1.969, 0.021, 1.923, 60),
    },
    'linear': {
        ('ocp-mxfp4', 'bgrad'): MeasuredSNR(145.496, 0.702, 143.827, 60),
        ('ocp-mxfp4', 'dgrad'): MeasuredSNR(15.084, 0.321, 13.986, 60),
        ('ocp-mxfp4', 'fwd'): MeasuredSNR(14.961, 0.380, 14.214, 60),
        ('ocp-mxfp4', 'wgrad'): MeasuredSNR(15.146, 0.379, 14.351, 60),
        ('ocp-mxfp6-e2m3', 'bgrad'): MeasuredSNR(145.515, 0.839, 143.030, 60),
        ('ocp-mxfp6-e2m3', 'dgrad'): MeasuredSNR(28.059, 0.417, 26.704, 60),
        ('ocp-mxfp6-e2m3', 'fwd'): MeasuredSNR(27.834, 0.505, 26.677, 60),
        ('ocp-mxfp6-e2m3', 'wgrad'): MeasuredSNR(28.082, 0.467, 27.174, 60),
        ('ocp-mxfp6-e3m2', 'bgrad'): MeasuredSNR(145.517, 0.816, 143.732, 60),
        ('ocp-mxfp6-e3m2', 'dgrad'): MeasuredSNR(22.551, 0.484, 20.949, 60),
        ('ocp-mxfp6-e3m2', 'fwd'): MeasuredSNR(22.450, 0.592, 21.378, 60),
        ('ocp-mxfp6-e3m2', 'wgrad'): MeasuredSNR(22.617, 0.530, 21.613, 60),
        ('ocp-mxfp8-e4m3', 'bgrad'): MeasuredSNR(144.823, 0.678, 142.880, 60),
        ('ocp-mxfp8-e4m3', 'dgrad'): MeasuredSNR(23.466, 0.710, 21.543, 60),
        ('ocp-mxfp8-e4m3', 'fwd'): MeasuredSNR(23.553, 0.903, 21.904, 60),
        ('ocp-mxfp8-e4m3', 'wgrad'): MeasuredSNR(23.537, 0.775, 22.311, 60),
        ('ocp-mxfp8-e5m2', 'bgrad'): MeasuredSNR(144.570, 0.735, 143.139, 60),
        ('ocp-mxfp8-e5m2', 'dgrad'): MeasuredSNR(22.640, 0.505, 20.981, 60),
        ('ocp-mxfp8-e5m2', 'fwd'): MeasuredSNR(22.572, 0.620, 21.453, 60),
        ('ocp-mxfp8-e5m2', 'wgrad'): MeasuredSNR(22.708, 0.545, 21.681, 60),
        ('fp8-tensorwise', 'bgrad'): MeasuredSNR(147.512, 0.565, 145.917, 60),
        ('fp8-tensorwise', 'dgrad'): MeasuredSNR(30.311, 0.063, 30.189, 60),
        ('fp8-tensorwise', 'fwd'): MeasuredSNR(55.402, 0.112, 55.096, 60),
        ('fp8-tensorwise', 'wgrad'): MeasuredSNR(30.316, 0.054, 30.180, 60),
        ('nvfp4-1x16', 'bgrad'): MeasuredSNR(145.444, 0.805, 142.972, 60),
        ('nvfp4-1x16', 'dgrad'): MeasuredSNR(17.741, 0.466, 16.862, 60),
        ('nvfp4-1x16', 'fwd'): MeasuredSNR(17.310, 0.313, 16.606, 60),
        ('nvfp4-1x16', 'wgrad'): MeasuredSNR(17.651, 0.506, 16.748, 60),
        ('fp8-block', 'bgrad'): MeasuredSNR(147.508, 0.593, 145.917, 100),
        ('fp8-block', 'dgrad'): MeasuredSNR(30.314, 0.060, 30.189, 100),
        ('fp8-block', 'fwd'): MeasuredSNR(55.395, 0.113, 55.096, 100),
        ('fp8-block', 'wgrad'): MeasuredSNR(30.316, 0.053, 30.180, 100),
        ('fp8-delayed', 'bgrad'): MeasuredSNR(145.463, 0.476, 144.138, 100),
        ('fp8-delayed', 'dgrad'): MeasuredSNR(26.636, 0.065, 26.407, 100),
        ('fp8-delayed', 'fwd'): MeasuredSNR(55.395, 0.113, 55.096, 100),
        ('fp8-delayed', 'wgrad'): MeasuredSNR(26.632, 0.058, 26.480, 100),
        ('fp8-hybrid', 'bgrad'): MeasuredSNR(145.463, 0.476, 144.138, 100),
        ('fp8-hybrid', 'dgrad'): MeasuredSNR(26.636, 0.065, 26.407, 100),
        ('fp8-hybrid', 'fwd'): MeasuredSNR(55.395, 0.113, 55.096, 100),
        ('fp8-hybrid', 'wgrad'): MeasuredSNR(26.643, 0.058, 26.491, 100),
        ('fp8-rowwise', 'bgrad'): MeasuredSNR(147.508, 0.593, 145.917, 100),
        ('fp8-rowwise', 'dgrad'): MeasuredSNR(30.314, 0.060, 30.189, 100),
        ('fp8-rowwise', 'fwd'): MeasuredSNR(55.395, 0.113, 55.096, 100),
        ('fp8-rowwise', 'wgrad'): MeasuredSNR(30.316, 0.053, 30.180, 100),
        ('fp8', 'bgrad'): MeasuredSNR(147.508, 0.593, 145.917, 100),
        ('fp8', 'dgrad'): MeasuredSNR(30.314, 0.060, 30.189, 100),
        ('fp8', 'fwd'): MeasuredSNR(55.395, 0.113, 55.096, 100),
        ('fp8', 'wgrad'): MeasuredSNR(30.316, 0.053, 30.180, 100),
        ('mxfp4+sr', 'bgrad'): MeasuredSNR(145.474, 0.683, 143.827, 100),
        ('mxfp4+sr', 'dgrad'): MeasuredSNR(13.859, 0.488, 12.545, 100),
        ('mxfp4+sr', 'fwd'): MeasuredSNR(14.744, 0.599, 13.203, 100),
        ('mxfp4+sr', 'wgrad'): MeasuredSNR(14.429, 0.067, 14.257, 100),
        ('mxfp4-1x32+sr', 'bgrad'): MeasuredSNR(145.474, 0.683, 143.827, 100),
        ('mxfp4-1x32+sr', 'dgrad'): MeasuredSNR(14.943, 0.198, 14.408, 100),
        ('mxfp4-1x32+sr', 'fwd'): MeasuredSNR(16.113, 0.309, 15.530, 100),
        ('mxfp4-1x32+sr', 'wgrad'): MeasuredSNR(14.884, 0.235, 14.268, 100),
        ('mxfp4-1x32', 'bgrad'): MeasuredSNR(145.474, 0.683, 143.827, 100),
        ('mxfp4-1x32', 'dgrad'): MeasuredSNR(16.340, 0.245, 15.593, 100),
        ('mxfp4-1x32', 'fwd'): MeasuredSNR(16.113, 0.309, 15.530, 100),
        ('mxfp4-1x32', 'wgrad'): MeasuredSNR(16.318, 0.294, 15.653, 100),
        ('mxfp4-fp8bwd', 'bgrad'): MeasuredSNR(145.441, 0.442, 143.903, 100),
        ('mxfp4-fp8bwd', 'dgrad'): MeasuredSNR(23.458, 0.378, 22.675, 100),
        ('mxfp4-fp8bwd', 'fwd'): MeasuredSNR(14.804, 0.675, 13.147, 100),
        ('mxfp4-fp8bwd', 'wgrad'): MeasuredSNR(23.511, 0.406, 22.641, 100),
        ('mxfp4', 'bgrad'): MeasuredSNR(145.474, 0.683, 143.827, 100),
        ('mxfp4', 'dgrad'): MeasuredSNR(14.916, 0.606, 13.396, 100),
        ('mxfp4', 'fwd'): MeasuredSNR(14.744, 0.599, 13.203, 100),
        ('mxfp4', 'wgrad'): MeasuredSNR(16.215, 0.067, 16.084, 100),
        ('mxfp6+sr', 'bgrad'): MeasuredSNR(145.398, 0.890, 143.030, 100),
        ('mxfp6+sr', 'dgrad'): MeasuredSNR(26.341, 0.084, 26.117, 100),
        ('mxfp6+sr', 'fwd'): MeasuredSNR(28.056, 0.086, 27.898, 100),
        ('mxfp6+sr', 'wgrad'): MeasuredSNR(26.356, 0.090, 26.164, 100),
        ('mxfp6', 'bgrad'): MeasuredSNR(145.398, 0.890, 143.030, 100),
        ('mxfp6', 'dgrad'): MeasuredSNR(28.074, 0.082, 27.924, 100),
        ('mxfp6', 'fwd'): MeasuredSNR(28.056, 0.086, 27.898, 100),
        ('mxfp6', 'wgrad'): MeasuredSNR(28.097, 0.088, 27.910, 100),
        ('mxfp8+sr', 'bgrad'): MeasuredSNR(144.791, 0.684, 142.880, 100),
        ('mxfp8+sr', 'dgrad'): MeasuredSNR(28.987, 0.163, 28.420, 100),
        ('mxfp8+sr', 'fwd'): MeasuredSNR(30.749, 0.267, 30.064, 100),
        ('mxfp8+sr', 'wgrad'): MeasuredSNR(29.009, 0.187, 28.585, 100),
        ('mxfp8', 'bgrad'): MeasuredSNR(144.791, 0.684, 142.880, 100),
        ('mxfp8', 'dgrad'): MeasuredSNR(30.888, 0.201, 30.098, 100),
        ('mxfp8', 'fwd'): MeasuredSNR(30.749, 0.267, 30.064, 100),
        ('mxfp8', 'wgrad'): MeasuredSNR(30.881, 0.239, 30.196, 100),
        ('nvfp4', 'bgrad'): MeasuredSNR(145.447, 0.790, 142.972, 100),
        ('nvfp4', 'dgrad'): MeasuredSNR(15.479, 0.471, 14.367, 100),
        ('nvfp4', 'fwd'): MeasuredSNR(15.962, 0.360, 15.213, 100),
        ('nvfp4', 'wgrad'): MeasuredSNR(16.983, 0.446, 16.207, 100),
    },
    'mlp': {
        ('mxfp6',): MeasuredSNR(24.838, 0.090, 24.620, 60),
    },
    'mx': {
        ('e2m1', 'ceil'): MeasuredSNR(16.821, 0.008, 16.802, 60),
        ('e2m1', 'even'): MeasuredSNR(19.027, 0.007, 19.013, 60),
        ('e2m1', 'floor'): MeasuredSNR(18.787, 0.008, 18.770, 60),
        ('e2m1', 'rceil'): MeasuredSNR(18.757, 0.007, 18.744, 60),
        ('e2m3', 'ceil'): MeasuredSNR(28.766, 0.009, 28.746, 60),
        ('e2m3', 'even'): MeasuredSNR(30.988, 0.008, 30.966, 60),
        ('e2m3', 'floor'): MeasuredSNR(30.941, 0.008, 30.921, 60),
        ('e2m3', 'rceil'): MeasuredSNR(30.958, 0.008, 30.937, 60),
        ('e3m2', 'ceil'): MeasuredSNR(25.543, 0.008, 25.518, 60),
        ('e3m2', 'even'): MeasuredSNR(25.544, 0.008, 25.519, 60),
        ('e3m2', 'floor'): MeasuredSNR(25.361, 0.007, 25.345, 60),
        ('e3m2', 'rceil'): MeasuredSNR(25.544, 0.008, 25.519, 60),
        ('e4m3', 'ceil'): MeasuredSNR(31.522, 0.009, 31.499, 60),
        ('e4m3', 'even'): MeasuredSNR(31.179, 0.010, 31.158, 60),
        ('e4m3', 'floor'): MeasuredSNR(30.645, 0.015, 30.616, 60),
        ('e4m3', 'rceil'): MeasuredSNR(31.522, 0.009, 31.499, 60),
        ('e5m2', 'ceil'): MeasuredSNR(25.544, 0.008, 25.520, 60),
        ('e5m2', 'even'): MeasuredSNR(25.544, 0.008, 25.520, 60),
        ('e5m2', 'floor'): MeasuredSNR(25.361, 0.007, 25.345, 60),
        ('e5m2', 'rceil'): MeasuredSNR(25.544, 0.008, 25.520, 60),
    },
    'nvfp4': {
        ('16x16',): MeasuredSNR(19.068, 0.026, 19.007, 60),
        ('1x16+h16_te',): MeasuredSNR(20.432, 0.025, 20.370, 60),
        ('1x16',): MeasuredSNR(20.433, 0.026, 20.368, 60),
    },
}


@dataclass(frozen=True)
class RandomizedCheck:
    where: str  # test file::function or mxcheck function
    what: str
    kind: str  # bound, margin, chi2, collision
    calls: int  # per emulated run, every parametrization and comparison
    per_run: float  # false-failure probability over the whole run's calls
    derivation: str
    slow: bool = False  # runs only with the slow marker


def _margin_run(family: str) -> float:
    return sum(margin_probability(m, snr_floor(family, key)) for key, m in MEASURED_SNR[family].items())


def _margin(where: str, what: str, family: str) -> RandomizedCheck:
    seeds = min(m.seeds for m in MEASURED_SNR[family].values())
    return RandomizedCheck(
        where, what, "margin", len(MEASURED_SNR[family]), _margin_run(family),
        f"SNR over {seeds} seeds per comparison (tools/flake_margins.py), normal model: sum over the "
        f"comparisons of Phi(-(mean - floor) / sd); MEASURED_SNR[{family!r}]")


def _registry() -> tuple[RandomizedCheck, ...]:
    bernstein = ("Bernstein's inequality per element (variance at its largest over the up-probability's "
                 "resolution interval), union over the call's elements: sr_deviation_bound at "
                 f"SR_FALSE_FAILURE = {SR_FALSE_FAILURE:g} per call, for every seed and input")
    return (
        RandomizedCheck("mxcheck/conformance/sr.py::check_sr_unbiased", "SR up-share within the bound of frac, "
                        "2048 draws x 1024 elements", "bound", SR_CALLS, SR_CALLS * SR_FALSE_FAILURE, bernstein),
        RandomizedCheck("mxcheck/conformance/sr_linear.py::check_sr_linear", "a backend's own-bit SR GEMMs in "
                        "check_linear and edge shapes: two bias statistics per SR GEMM (the envelope is exact)",
                        "bound", SR_LINEAR_CALLS, SR_LINEAR_CALLS * SR_FALSE_FAILURE,
                        "Bernstein's inequality for a weighted sum of independent two-valued terms (both sides' "
                        "up-probabilities within SR_RESOLUTION of frac), union over the call's statistics: "
                        f"SR_FALSE_FAILURE = {SR_FALSE_FAILURE:g} per call, for every seed and input"),
        RandomizedCheck("tests/conformance/test_sr_stats_slow.py::test_sr_checks_pass_the_oracle_for_100_seeds",
                        "check_sr_unbiased on the oracle, 100 seeds x 3 recipes", "bound", 300,
                        300 * SR_FALSE_FAILURE, bernstein, slow=True),
        RandomizedCheck("tests/test_formats.py::test_sr_mean_is_within_the_bernstein_bound_of_the_exact_value",
                        "float32-uniform SR mean, 10,000 draws x 16 values per format", "bound", 11,
                        11 * SR_FALSE_FAILURE, bernstein + " (resolution 2**-24)"),
        RandomizedCheck("tests/test_mx.py::test_sr_is_unbiased_within_the_bernstein_bound",
                        "MXFP4 SR mean, 8000 draws x 32 elements", "bound", 1, SR_FALSE_FAILURE,
                        bernstein + " (resolution 2**-24)"),
        RandomizedCheck("tests/test_nvfp4.py::test_sr_is_unbiased_within_the_8_bit_bound",
                        "NVFP4 SR mean, 4096 draws x 512 elements (and below 0.3x RNE's error, implied)", "bound",
                        1, SR_FALSE_FAILURE, bernstein),
        _margin("mxcheck/conformance/basic.py::check_linear", "fwd/dgrad/wgrad/bgrad SNR vs float64 truth on "
                "training_like inputs, pooled over LINEAR_DRAWS draws", "linear"),
        _margin("tests/test_functions.py::test_each_recipe_reaches_its_snr_floor_against_float64_truth",
                "quant_linear SNR vs float64 truth, randn 256x256x512", "functions"),
        _margin("tests/test_functions.py::test_fused_mlp_is_close_to_float64_truth", "mxfp6 MLP SNR", "mlp"),
        _margin("tests/test_functions.py::test_mxfp4_wgrad_hadamard_pair_cancels", "mxfp4 wgrad SNR with and "
                "without the H16 pair, and their difference", "hpair"),
        _margin("tests/test_mx.py::test_snr_of_gaussian_data_clears_its_floor", "MX quantize SNR, randn 256x4096",
                "mx"),
        _margin("tests/test_fp8.py::test_dequantize_is_value_times_scale_inv_and_beats_snr_floor",
                "FP8 quantize SNR, randn 256x256", "fp8"),
        _margin("tests/test_nvfp4.py::test_snr_against_float64_input_is_above_the_measured_floor",
                "NVFP4 quantize SNR, randn 256x256", "nvfp4"),
        RandomizedCheck("tests/test_assertions.py::test_assert_snr_passes_above_threshold_and_returns_what_it_measured",
                        "cosine > 0.99 at noise 0.1 (4096 samples); also the 'cosine 0.99' text of "
                        "test_assert_snr_fails_half_a_db_below_threshold", "chi2", 2, 2 * gaussian_tail(NOISY_Z),
                        f"noise/signal energy ratio 0.01 with relative sd sqrt(2/4096 + 2/4096) = 3.1%; "
                        f"cosine 0.99 needs it above 0.0203: z = {NOISY_Z}"),
        RandomizedCheck("tests/test_assertions.py::test_numerics_records_a_passing_snr_with_the_context",
                        "SNR 40 dB (noise 0.01) against a 30 dB threshold", "chi2", 1, gaussian_tail(73.0),
                        "SNR sd = 4.343 x 3.1% = 0.136 dB; a 10 dB margin: z = 73"),
        RandomizedCheck("mxcheck/conformance/sr.py::check_sr_seeded",
                        "seeds 7 and 8 give different SR gradients", "collision", SR_CALLS,
                        SR_CALLS * 10.0**COLLISION_LOG10,
                        f"prod max(p, 1 - p) over dY's 1024 elements, p from the oracle's 256 u values: "
                        f"log10 at most {COLLISION_LOG10} over 40 seeds x 5 recipes (measured -122.3)"),
        RandomizedCheck("tests/test_mx.py, tests/test_nvfp4.py::test_sr_is_deterministic_for_fixed_rand_and_"
                        "varies_with_it", "two rand tensors give different codes", "collision", 2,
                        2 * 10.0**COLLISION_LOG10, "as check_sr_seeded, 16x64 elements: log10 at most -122.6 "
                        "over 40 seeds"),
        RandomizedCheck("tests/test_functions.py::test_stochastic_rounding_follows_the_generator_seed, "
                        "tests/test_formats.py::test_sr_is_deterministic_and_stays_between_the_two_neighbours",
                        "generator seeds 1 and 2 give different gradients; both rounding directions occur", "collision",
                        13, 13 * 10.0**COLLISION_LOG10, "the same product over 65,536 (4000) SR elements: not "
                        "measured, each factor <= 1 and the per-element mean of log10 max(p, 1-p) is about -0.13 "
                        "(measured above), so far under the stated ceiling"),
    )


SR_CALLS = 7  # per run: 4 conformance recipes with unrotated SR on g_row + test_sr_stats' 3 (test_false_failure checks)
# per run: the calls of tests/conformance/test_sr_judgement.py on a correct own-bit SR (2 check_linear,
# the hand-rolled unbiased SR, one edge shape, one direct call); the emulated backend has the oracle's bits
SR_LINEAR_CALLS = 5
NOISY_Z = 33.0
COLLISION_LOG10 = -100  # a stated ceiling, 22 decades above the measured worst
REGISTRY: tuple[RandomizedCheck, ...] = _registry()
