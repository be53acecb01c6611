"""Every known-bad backend fails the conformance suite, at the check its bug breaks."""

from __future__ import annotations

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.backends.known_bad import KNOWN_BAD
from mxcheck.conformance import CHECKS, run_checks
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
    "bad-half-away": ("mxfp4", "quantize"),
    "bad-trunc": ("mxfp4", "quantize"),
    "bad-log2-scale": ("mxfp4", "quantize"),
}


def test_every_known_bad_backend_has_an_expectation():
    assert set(EXPECTED) == set(KNOWN_BAD)


@pytest.mark.parametrize("name", sorted(KNOWN_BAD))
def test_known_bad_backend_fails_the_check_its_bug_breaks(name):
    # Only that check: the assertion reads no other (the others, the linear check's 4 draws
    # above all, were 90% of this test's time).
    recipe, check = EXPECTED[name]
    results = run_checks(KNOWN_BAD[name](), RECIPES[recipe], names=[check])
    assert results[check].startswith("FAILED"), results


@pytest.mark.parametrize("recipe", sorted({r for r, _ in EXPECTED.values()}))
def test_the_emulated_backend_passes_the_same_checks(recipe):
    """The premise of each known-bad test: on the same inputs (run_checks' seed) the oracle
    passes the check the bug fails. Every other check on these recipes runs on the oracle in
    test_conformance.py (at the plugin's seed)."""
    names = sorted({c for r, c in EXPECTED.values() if r == recipe})
    results = run_checks(EmulatedBackend(), RECIPES[recipe], names=names)
    assert list(results) == names
    assert all(r == "ok" for r in results.values()), results


def test_run_checks_names_must_be_checks():
    with pytest.raises(ValueError, match=r"names=\['linear', 'nope'\] has \['nope'\]; expected names from"):
        run_checks(EmulatedBackend(), RECIPES["fp8"], names=["linear", "nope"])


# Rounding swaps show on bf16 inputs alone (float32-free evidence: the "bf16" input of
# check_quantize is bf16 midpoints, Gaussians and zeros). Not MXFP6: its bf16-normalised
# 32-point rotation (181/1024) makes an exact tie impossible after the rotation, so RNE
# and half-away agree there on every input whose rotation is exact in float32.
@pytest.mark.parametrize("recipe", ["mxfp4", "mxfp8", "nvfp4", "fp8", "fp8-hybrid", "fp8-delayed"])
@pytest.mark.parametrize("bug", ["bad-half-away", "bad-trunc"])
def test_a_rounding_swap_fails_quantize_on_bf16_inputs(bug, recipe):
    with pytest.raises(NumericsError, match=r"x_row\.(codes|block_scales) \(bf16 input\)"):
        CHECKS["quantize"](KNOWN_BAD[bug](), RECIPES[recipe], torch.Generator().manual_seed(0))


def test_truncation_fails_quantize_on_mxfp6_too():
    with pytest.raises(NumericsError, match=r"\(bf16 input\)"):
        CHECKS["quantize"](KNOWN_BAD["bad-trunc"](), RECIPES["mxfp6"], torch.Generator().manual_seed(0))


@pytest.mark.parametrize("recipe", ["mxfp4", "mxfp8"])  # scale rules even and rceil
def test_a_float32_log2_block_exponent_fails_quantize_on_the_amax_input(recipe):
    with pytest.raises(NumericsError, match=r"x_row\.scales \(amax input\)"):
        CHECKS["quantize"](KNOWN_BAD["bad-log2-scale"](), RECIPES[recipe], torch.Generator().manual_seed(0))
