"""Every known-bad backend fails the conformance suite, at the check its bug breaks."""

from __future__ import annotations

import re

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.backends.known_bad import KNOWN_BAD
from mxcheck.conformance import CHECKS, run_checks
from mxcheck.diagnose import CATALOGUE
from mxcheck.diagnose.catalogue import combined
from mxcheck.recipes import RECIPES

pytestmark = pytest.mark.emulated

K_MOD_256 = "fails at every shape with K % 256 != 0 and at no shape with K % 256 == 0"

# bug -> (recipe that exposes it, the check that must fail, what the failure must name as its
# cause: a key of mxcheck.diagnose.CATALOGUE, or the edge-shape pattern)
EXPECTED = {
    "bad-nibble-swap": ("mxfp4", "gemm", "gemm-fp4-nibble-swap"),
    "bad-scale-rule": ("mxfp4", "quantize", "mx.scale_rule=floor"),
    "bad-stale-weight": ("mxfp8", "weight_change", "linear-stale-weight"),
    "bad-bf16-fallback": ("mxfp4", "linear", "linear-bf16-unquantized"),
    "bad-nan-to-zero": ("fp8", "nan", "linear-nan-flushed"),
    "bad-drops-bias": ("mxfp8", "linear", "linear-bias-dropped"),
    "bad-k-mod-256": ("mxfp4", "edge_shapes", K_MOD_256),
    "bad-half-away": ("mxfp4", "quantize", "mx.rounding=half_away"),
    "bad-trunc": ("mxfp4", "quantize", "mx.rounding=trunc"),
    "bad-log2-scale": ("mxfp4", "quantize", "mx.exponent_source=log2_fp32"),
    "bad-even-mantissa": ("mxfp8", "quantize", "mx.scale_mbits=1+mx.scale_rule=even"),
    "bad-nvfp4-eps-scale": ("nvfp4", "quantize", "nvfp4.underflow_block_scale=2^-3"),
    "bad-nvfp4-nonfinite-scale-1": ("nvfp4", "quantize", "nvfp4.nonfinite_tensor_scale=2^0"),
    "bad-three-conventions": ("mxfp8", "quantize", "mx.scale_rule=even & mx.inf_amax_byte=254 & mx.zero_sign=never"),
    "bad-inf-block-127": ("mxfp8", "quantize", "inf_block_byte_127"),
    "bad-cuda-nan-code": ("fp8", "quantize", "canonical_nan_code"),
    "bad-fast-accumulation": ("fp8", "gemm", "gemm-reduced-accumulation"),
}


def test_every_known_bad_backend_has_an_expectation():
    assert set(EXPECTED) == set(KNOWN_BAD)


def _failure(backend, recipe: str, check: str) -> str:
    with pytest.raises(NumericsError) as info:
        CHECKS[check](backend, RECIPES[recipe], torch.Generator().manual_seed(0))
    return str(info.value)


def fully_reproduced(message: str, key: str) -> list[tuple[int, int]]:
    """(reproduced, differing) of each line naming CATALOGUE[key] that changes nothing the
    kernel gets right."""
    behaviour = CATALOGUE.get(key) or combined(*(CATALOGUE[k] for k in key.split(" & ")))
    title = re.escape(behaviour.describe())
    return [(int(a.replace(",", "")), int(b.replace(",", ""))) for a, b in re.findall(
        rf"([\d,]+) of ([\d,]+) differing (?:blocks|rows|outputs|forward outputs) are reproduced by: {title}$",
        message, flags=re.M)]


@pytest.mark.parametrize("name", sorted(KNOWN_BAD))
def test_known_bad_backend_fails_the_check_its_bug_breaks_and_is_named_by_its_cause(name):
    """Each seeded bug fails its check (only that check runs: the linear check's 4 draws were
    90% of this test's time when all ran), and the failure names the catalogue behaviour that
    is the bug, reproducing every differing unit, and no other behaviour of its level."""
    recipe, check, cause = EXPECTED[name]
    message = _failure(KNOWN_BAD[name](), recipe, check)
    if cause not in CATALOGUE and " & " not in cause:  # a shape pattern
        assert cause in message, message
        return
    found = fully_reproduced(message, cause)
    assert found and all(r == d for r, d in found), message[:4000]
    assert "reproduced by no known behaviour" not in message, message[:4000]
    if " & " not in cause and CATALOGUE[cause].level != "quantize":  # outputs: no other behaviour fits by chance
        others = [b.title for b in CATALOGUE.values() if b.level != "quantize" and b.key != cause
                  and b.title in message]
        assert not others, (others, message)


@pytest.mark.parametrize("recipe", sorted({r for r, _, _ in EXPECTED.values()}))
def test_the_emulated_backend_passes_the_same_checks(recipe):
    """The premise of each known-bad test: on the same inputs (run_checks' seed) the oracle
    passes the check the bug fails. Every other check on these recipes runs on the oracle in
    test_conformance.py (at the plugin's seed)."""
    names = sorted({c for r, c, _ in EXPECTED.values() if r == recipe})
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
