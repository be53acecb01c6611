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
}


def snr_floor(family: str, key: tuple[str, ...]) -> float:
    return SNR_FLOORS[family](key)


# MEASURED_SNR: filled below from tools/flake_margins.py output
MEASURED_SNR: dict[str, dict[tuple[str, ...], MeasuredSNR]] = {}


@dataclass(frozen=True)
class RandomizedCheck:
    where: str  # test file::function or mxcheck function
    what: str
    kind: str  # bound, margin, chi2, collision
    calls: int  # per emulated run, every parametrization and comparison
    per_run: float  # false-failure probability over the whole run's calls
    derivation: str
