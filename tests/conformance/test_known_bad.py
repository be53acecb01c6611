"""Every known-bad backend fails the conformance suite, at the check its bug breaks."""

from __future__ import annotations

import re

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.backends.known_bad import KNOWN_BAD
from mxcheck.conformance import CHECKS, run_checks
from mxcheck.conformance import basic as conformance_basic
from mxcheck.conformance.inputs import FAMILIES
from mxcheck.conformance.verdict import tensor_verdict
from mxcheck.diagnose import CATALOGUE
from mxcheck.diagnose.catalogue import combined
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import RECIPES, get_recipe

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
    "bad-fp16-log2-overflow": ("ocp-mxfp8-e4m3", "quantize", "mx.exponent_source=log2_input"),
    # scales held in too narrow a type (issue 35): caught by the magnitude families
    "bad-nvfp4-scale-threshold": ("nvfp4", "quantize", "nvfp4_decoded_scale_threshold"),
    "bad-nvfp4-encode-input-dtype": ("nvfp4", "quantize", "nvfp4_encode_scale_input_dtype"),
    "bad-nvfp4-encode-bf16": ("nvfp4", "quantize", "nvfp4_encode_scale_bf16"),
    "bad-nvfp4-block-scale-bf16": ("nvfp4", "quantize", "nvfp4_block_scale_bf16"),
    "bad-mx-scale-float16": ("mxfp8", "quantize", "mx_scale_float16"),
    "bad-fp8-double-round": ("fp8", "quantize", "fp8_product_bf16"),
    "bad-even-mantissa": ("mxfp8", "quantize", "mx.scale_mbits=1+mx.scale_rule=even"),
    "bad-nvfp4-eps-scale": ("nvfp4", "quantize", "nvfp4.underflow_block_scale=2^-3"),
    "bad-nvfp4-nonfinite-scale-1": ("nvfp4", "quantize", "nvfp4.nonfinite_tensor_scale=2^0"),
    "bad-three-conventions": ("mxfp8", "quantize", "mx.scale_rule=even & mx.inf_amax_byte=254 & mx.zero_sign=never"),
    "bad-inf-block-127": ("mxfp8", "quantize", "inf_block_byte_127"),
    "bad-cuda-nan-code": ("fp8", "quantize", "canonical_nan_code"),
    "bad-fast-accumulation": ("fp8", "gemm", "gemm-reduced-accumulation"),
    # released libraries' defects (issue 42's vocabulary)
    "bad-below-tie": ("mxfp4", "quantize", "mx.half_away_sum=float32+mx.rounding=half_away"),
    "bad-nvfp4-reciprocal-encode": ("nvfp4", "quantize", "nvfp4_encode_factor_reciprocal"),
    "bad-nvfp4-uncapped-encode": ("nvfp4", "quantize", "nvfp4_encode_factor_uncapped"),
    "bad-nvfp4-fp16-fallback": ("nvfp4", "quantize", "nvfp4_fp16_fallback_scale_1"),
    "bad-nvfp4-special-zero-block": ("nvfp4", "quantize", "special_zeroes_block_finite_amax"),
    "bad-mx-fp16-pow2-underflow": ("mxfp8", "quantize", "mx_divide_by_underflowed_pow2_float16"),
    "bad-mx-fp16-zero-block-nan": ("mxfp8", "quantize", "mx_zero_block_nan_float16"),
    "bad-mx-fp16-subnormal-amax": ("mxfp8", "quantize", "mx_subnormal_amax_float16"),
    "bad-zero-block-byte": ("mxfp8", "quantize", "mx.zero_scale=85"),
    "bad-fp8-rowwise-zero-eps": ("fp8-rowwise", "quantize", "fp8_eps_floor"),
    # values kernels whose cause is a field relation on the block scale (stated, not a behaviour)
    "bad-mx-scale-floor-1e-10": ("mxfp8", "quantize", "at a block scale of 1e-10, not a power of two"),
    "bad-mx-scale-over-0.6": ("mxfp8", "quantize", "at a block scale of the oracle's times 5/3"),
    # AMD Quark's residuals (a fake-quant kernel: values only)
    "bad-mx-float-scale": ("mxfp4-1x32", "quantize", "mx.scale_storage=input_dtype"),
    # MX scales that are no power of two (values-level failures: fake-quant kernels)
    "bad-mx-scale-floor": ("ocp-mxfp8-e4m3", "quantize", "mx_scale_floor_after_pow2"),
    "bad-mx-scale-div-0.75": ("ocp-mxfp4", "quantize", "mx_scale_divided_by_0.75"),
    "bad-fp8-divide-amax-over-max": ("fp8-tensorwise", "quantize", "fp8_divide_by_amax_over_max"),
    # compressed-tensors' MX overflow: an Inf power-of-two scale in the input's dtype
    "bad-mx-overflow-byte-127": ("mxfp8", "quantize", "mx_overflow_scale_byte_127"),
}
# The seeded bugs that lose whole tensors, and an input of the magnitude family each loses
# as the issue measured it (a gradient magnitude; float16 under 0.041): their failure opens
# with the lost-tensor line (conformance.verdict).
LOSES_TENSORS = {
    "bad-nvfp4-scale-threshold": r"at amax 5\.0e-05 \(float32\)",
    "bad-nvfp4-encode-input-dtype": r"at amax 3\.1e-02 \(float16\)",
    "bad-mx-scale-float16": r"at amax 1\.0e-08 \(float32\)",
}
LOST_LINE = r"[xw]_row loses the tensor at amax \S+ \(\w+\): SNR -?[\d.]+ dB, oracle [\d.]+ dB, [\d,]+ of [\d,]+ values 0"


def test_every_known_bad_backend_has_an_expectation():
    assert set(EXPECTED) == set(KNOWN_BAD)


def _failure(backend, recipe: str, check: str) -> str:
    with pytest.raises(NumericsError) as info:
        CHECKS[check](backend, get_recipe(recipe), torch.Generator().manual_seed(0))
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
    if name in LOSES_TENSORS:  # the lost-tensor verdict heads the failure
        first, second = message.splitlines()[:2]
        assert re.match(LOST_LINE, first), first
        assert re.match(r"\d+ of \d+ quantize inputs lose signal", second), second
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


def test_a_float16_log2_scale_overflows_65504_to_inf_and_the_failure_says_so():
    """The magnitude sweep's float16 tensor at amax 65504 (its top) has the block that a float16
    log2 puts a binade high: the kernel's 65504 is +Inf where the oracle's is 57344 (OCP MX
    floor rule: scale 2^(15 - 8), 65504 / 2^7 saturates to e4m3's 448, times 2^7)."""
    message = _failure(KNOWN_BAD["bad-fp16-log2-overflow"](), "ocp-mxfp8-e4m3", "quantize")
    assert re.search(r"^x_row \(magnitude input at amax 6\.6e\+04, float16 tensor\): 1 value overflows float16 to "
                     r"Inf where the oracle's is finite, the first at \[\d+, \d+\]: input 65504\.0, kernel inf \| "
                     r"oracle 57344\.0$", message, flags=re.M), message[:3000]


@pytest.mark.parametrize("recipe", sorted({r for r, _, _ in EXPECTED.values()}))
def test_the_emulated_backend_passes_the_same_checks(recipe):
    """The premise of each known-bad test: on the same inputs (run_checks' seed) the oracle
    passes the check the bug fails. Every other check on these recipes runs on the oracle in
    test_conformance.py (at the plugin's seed)."""
    names = sorted({c for r, c, _ in EXPECTED.values() if r == recipe})
    results = run_checks(EmulatedBackend(), get_recipe(recipe), names=names)
    assert list(results) == names
    assert all(r == "ok" for r in results.values()), results


def test_run_checks_names_must_be_checks():
    with pytest.raises(ValueError, match=r"names=\['linear', 'nope'\] has \['nope'\]; expected names from"):
        run_checks(EmulatedBackend(), RECIPES["fp8"], names=["linear", "nope"])


# Rounding swaps show on bf16 inputs alone (float32-free evidence: the "bf16" input of
# check_quantize is bf16 midpoints, Gaussians and zeros). Not MXFP6: its bf16-normalised
# 32-point rotation (181/1024) makes an exact tie impossible after the rotation, so RNE
# and half-away agree there on every input whose rotation is exact in float32.
def _only_families(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """check_quantize feeds only these input families (the ones a test is about)."""
    monkeypatch.setattr(conformance_basic, "QUANTIZE_INPUTS", {n: conformance_basic.QUANTIZE_INPUTS[n] for n in names})


@pytest.mark.parametrize("recipe", ["mxfp4", "mxfp8", "nvfp4", "fp8", "fp8-hybrid", "fp8-delayed"])
@pytest.mark.parametrize("bug", ["bad-half-away", "bad-trunc"])
def test_a_rounding_swap_fails_quantize_on_bf16_inputs(bug, recipe, monkeypatch):
    _only_families(monkeypatch, "bf16")
    with pytest.raises(NumericsError, match=r"x_row\.(codes|block_scales) \(bf16 input\)"):
        CHECKS["quantize"](KNOWN_BAD[bug](), RECIPES[recipe], torch.Generator().manual_seed(0))


def test_truncation_fails_quantize_on_mxfp6_too(monkeypatch):
    _only_families(monkeypatch, "bf16")
    with pytest.raises(NumericsError, match=r"\(bf16 input\)"):
        CHECKS["quantize"](KNOWN_BAD["bad-trunc"](), RECIPES["mxfp6"], torch.Generator().manual_seed(0))


@pytest.mark.parametrize("recipe", ["mxfp4", "mxfp8"])  # scale rules even and rceil
def test_a_float32_log2_block_exponent_fails_quantize_on_the_amax_input(recipe, monkeypatch):
    _only_families(monkeypatch, "amax")
    with pytest.raises(NumericsError, match=r"x_row\.scales \(amax input\)"):
        CHECKS["quantize"](KNOWN_BAD["bad-log2-scale"](), RECIPES[recipe], torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", sorted(LOSES_TENSORS))
def test_a_bug_that_loses_a_tensor_loses_it_where_the_issue_measured(name):
    """The magnitude input named in LOSES_TENSORS comes back with no signal, SNR 0.0 dB
    (the error is the whole signal: most values 0, the rest no better), where the oracle
    keeps more than 10 dB."""
    recipe = RECIPES[EXPECTED[name][0]]
    lines = [v.line() for v in _verdicts(KNOWN_BAD[name](), recipe)
             if re.search(LOSES_TENSORS[name], v.line())]
    assert len(lines) == 1, lines
    found = re.match(r"x_row loses the tensor at .*: SNR 0\.0 dB, oracle (\d+\.\d) dB, [\d,]+ of 4,096 values 0$",
                     lines[0])
    assert found and float(found[1]) > 10, lines[0]


def _verdicts(backend, recipe):
    """The tensor verdict of every magnitude input of x_row where the backend's bits differ."""
    out = []
    for _, _, t in FAMILIES["magnitude"].tensors(torch.Generator().manual_seed(0), recipe.x_row, 32, 128):
        v = tensor_verdict(t, recipe.x_row, quantize_operand(t, recipe.x_row), backend.quantize(t, recipe.x_row),
                           operand="x_row")
        out += [v] if v is not None else []
    return out


@pytest.mark.parametrize("name", ["bad-nvfp4-encode-bf16", "bad-nvfp4-block-scale-bf16", "bad-fp8-double-round"])
def test_a_quiet_scale_precision_bug_fails_quantize_on_a_tensor_amax_that_is_not_a_power_of_two(name):
    """The quiet bugs pass every tiled input in bf16 (tensor amax 336 or 0.875: every
    per-tensor scale a power of two) and fail on the magnitude sweep's amax 4.6 in bf16
    (bf16 tensors only: the backend declares input_dtypes, as the suite reads it)."""
    backend = KNOWN_BAD[name]()
    backend.input_dtypes = (torch.bfloat16,)
    with pytest.raises(NumericsError) as info:
        CHECKS["quantize"](backend, RECIPES[EXPECTED[name][0]], torch.Generator().manual_seed(0))
    message = str(info.value)
    assert re.search(r"(x|w)_row\.(codes|block_scales) \(magnitude input at amax 4\.6e\+00, bfloat16 tensor\)",
                     message), message[:3000]
    assert not re.search(r"\((bf16|amax-bf16|inf-nan) input, bfloat16 tensor\)", message), message[:3000]


@pytest.mark.parametrize("recipe", ["nvfp4", "fp8", "mxfp8"])
def test_ties_away_fail_on_midpoints_at_a_gradient_magnitude(recipe, monkeypatch):
    """The midpoints stay midpoints at 2^-24 (every scale a power of two): ties rounded away
    differ there, in bf16 tensors too."""
    monkeypatch.setattr(conformance_basic, "QUANTIZE_INPUTS", {"midpoints-small": FAMILIES["midpoints-small"]})
    backend = KNOWN_BAD["bad-half-away"]()
    backend.input_dtypes = (torch.bfloat16,)
    with pytest.raises(NumericsError, match=r"x_row\.(codes|block_scales) \(midpoints-small input at amax \S+, "
                                            r"bfloat16 tensor\)"):
        CHECKS["quantize"](backend, RECIPES[recipe], torch.Generator().manual_seed(0))
