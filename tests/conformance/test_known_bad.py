"""Every known-bad backend fails the conformance suite, at the check its bug breaks."""

from __future__ import annotations

import pytest

from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.backends.known_bad import KNOWN_BAD
from mxcheck.conformance import run_checks
from mxcheck.recipes import RECIPES

pytestmark = pytest.mark.emulated

# bug -> (recipe that exposes it, the check that must fail)
EXPECTED = {
    "bad-nibble-swap": ("mxfp4", "gemm"),
    "bad-scale-rule": ("mxfp4", "quantize"),
    "bad-stale-weight": ("mxfp8", "weight_change"),
    "bad-bf16-fallback": ("mxfp4", "linear"),
    "bad-nan-to-zero": ("fp8", "nan"),
    "bad-drops-bias": ("mxfp8", "linear"),
    "bad-k-mod-256": ("mxfp4", "edge_shapes"),
}


def test_every_known_bad_backend_has_an_expectation():
    assert set(EXPECTED) == set(KNOWN_BAD)


@pytest.mark.parametrize("name", sorted(KNOWN_BAD))
def test_known_bad_backend_fails_the_check_its_bug_breaks(name):
    recipe, check = EXPECTED[name]
    results = run_checks(KNOWN_BAD[name](), RECIPES[recipe])
    assert results[check].startswith("FAILED"), results


@pytest.mark.parametrize("recipe", ["mxfp4", "mxfp8", "fp8"])
def test_the_emulated_backend_passes_the_same_checks(recipe):
    results = run_checks(EmulatedBackend(), RECIPES[recipe])
    assert all(r == "ok" or r.startswith("skipped") for r in results.values()), results
