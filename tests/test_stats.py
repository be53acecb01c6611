"""Per-block statistics (mxcheck.stats): hand-computed small cases, Gaussian anchors derived
independently from the normal CDF, the probe on a quantized Flux, the CLI and the HTML."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from mxcheck.flux import Flux, break_zero_init, init_weights, make_inputs, quantize_model
from mxcheck.recipes import GEMMS, OperandSpec, get_recipe
from mxcheck.report import Report, render_html
from mxcheck.report.html import block_stats_figure
from mxcheck.stats import BlockStats, block_stats, synthetic
from mxcheck.stats_probe import StatsProbe
from tests._helpers import run_cli

pytestmark = pytest.mark.emulated

E2M1_FLOOR = OperandSpec("e2m1", "mx", scale_rule="floor")
E2M1_RCEIL = OperandSpec("e2m1", "mx", scale_rule="rceil")
F32_0_2 = float(torch.tensor(0.2).item())  # 0.2 as float32 reads it


def two_blocks() -> torch.Tensor:
    """Row 0: amax 7 among ones. Row 1: amax 6 (e2m1's max), three 0.2s (below half of e2m1's smallest
    subnormal 0.5, so they round to 0 at scale 2^0) and ones."""
    x = torch.ones(2, 32)
    x[0, 0] = 7.0
    x[1, 0] = 6.0
    x[1, 1:4] = 0.2
    return x


# ---- hand-computed cases ----------------------------------------------------------------


def test_floor_clips_the_block_whose_amax_is_7_and_rceil_does_not() -> None:
    # floor: e = floor(log2 7) - emax(e2m1)=2 = 0, scaled amax 7 > 6 (and >= 7: overflow);
    # row 1: 6 <= 6. rceil: e = ceil(log2(7/6)) = 1 (scaled 3.5); ceil(log2(6/6)) = 0.
    floor, rceil = block_stats(two_blocks(), E2M1_FLOOR), block_stats(two_blocks(), E2M1_RCEIL)
    assert (floor.saturated_blocks, floor.saturated_fraction, floor.overflow_blocks) == (1, 0.5, 1)
    assert (rceil.saturated_blocks, rceil.saturated_fraction, rceil.overflow_blocks) == (0, 0.0, 0)
    assert floor.scale_exponents == {0: 2}
    assert rceil.scale_exponents == {0: 1, 1: 1}
    assert (floor.n_blocks, floor.block, floor.zero_blocks, floor.domain) == (2, (1, 32), 0, "input")


def test_elements_below_half_the_smallest_subnormal_flush_to_zero() -> None:
    for spec in (E2M1_FLOOR, E2M1_RCEIL):
        s = block_stats(two_blocks(), spec)
        assert (s.nonzero_elements, s.flushed_elements) == (64, 3)
        assert s.flushed_fraction == 3 / 64


def test_block_error_and_snr_match_a_hand_computation() -> None:
    s = block_stats(two_blocks(), E2M1_FLOOR)
    # Row 0: 7 -> 6, 31 ones exact. Row 1: three 0.2 -> 0, 6 and ones exact.
    err = [1.0, 3 * F32_0_2**2]
    sig = [49.0 + 31, 36.0 + 3 * F32_0_2**2 + 28]
    expected_snr = [10 * math.log10(a / b) for a, b in zip(sig, err, strict=True)]
    assert s.block_snr_db.shape == (2, 1)
    assert s.block_snr_db.flatten().tolist() == pytest.approx(expected_snr, rel=1e-12)
    assert s.block_rel_error.flatten().tolist() == pytest.approx(
        [math.sqrt(a / b) for a, b in zip(err, sig, strict=True)], rel=1e-12)
    assert s.snr_db == pytest.approx(10 * math.log10(sum(sig) / sum(err)), rel=1e-9)
    assert s.snr_histogram == {math.floor(v): 1 for v in expected_snr}
    assert s.snr_db_quantiles["min"] == pytest.approx(min(expected_snr))
    assert s.snr_db_quantiles["max"] == pytest.approx(max(expected_snr))


def test_nvfp4_block_scale_exponents_and_a_scale_rounded_down_saturating() -> None:
    # Global amax 2688 = 6 * 448 makes S_enc = 1, so a block scale is ue4m3(vec_max / 6).
    # Block 1: 696 / 6 = 116, a tie between 112 and 120 that RNE takes to 112 = 1.75 * 2^6,
    # so 696 / 112 = 6.21 > 6 (but < 7: no code changes). Block 0: 448 = 1.75 * 2^8, and
    # its encode multiplier is the float32 reciprocal 1 / 448, rounded up: 2688 times it is
    # one float32 ulp above 6, a clip too (the global-amax block of NVFP4 often has one).
    assert float(torch.tensor(2688.0) * (1.0 / torch.tensor(448.0))) > 6.0
    x = torch.full((1, 32), 1.0)
    x[0, 0], x[0, 16] = 2688.0, 696.0
    s = block_stats(x, get_recipe("nvfp4").x_row)
    assert s.scale_exponents == {6: 1, 8: 1}
    assert (s.saturated_blocks, s.overflow_blocks, s.block) == (2, 0, (1, 16))
    y = x.clone()
    y[0, 16] = 768.0  # scale 768 / 6 = 2^7, an exact reciprocal: scaled amax 6, no clip
    t = block_stats(y, get_recipe("nvfp4").x_row)
    assert (t.saturated_blocks, t.scale_exponents) == (1, {7: 1, 8: 1})


def test_fp8_row_scale_exponent_is_the_binade_of_scale_inv() -> None:
    # TE formula: scale_inv = amax / 448: row 0 amax 448 -> 1 = 2^0; row 1 amax 1 -> 2^-8.8.
    x = torch.tensor([[448.0, 1.0, -3.0, 0.5], [1.0, 0.25, -1.0, 0.0]])
    s = block_stats(x, OperandSpec("e4m3", "row"))
    assert s.scale_exponents == {-9: 1, 0: 1}
    assert (s.n_blocks, s.block, s.saturated_blocks) == (2, (1, 4), 0)
    assert s.nonzero_elements == 7  # the 0.0 is not counted


def test_fp8_tensor_scaling_is_one_block() -> None:
    s = block_stats(synthetic((64, 96), seed=3), get_recipe("fp8").x_row)
    assert (s.n_blocks, s.block) == (1, (64, 96))
    assert s.overflow_blocks == 0


def test_2d_weight_tiles_count_once_and_padding_blocks_are_zero_blocks() -> None:
    # mxfp4 weights: 32x32 tiles, scale rule even, K padded to 128: a 32x64 weight is four
    # tiles, two of them all padding. amax 4 -> e = 2 - 2 = 0; amax 1 -> e = -2.
    w = torch.ones(32, 64)
    w[5, 7] = 4.0
    s = block_stats(w, get_recipe("mxfp4").w_row)
    assert (s.n_blocks, s.zero_blocks, s.block) == (4, 2, (32, 32))
    assert s.scale_exponents == {-2: 1, 0: 1}
    assert s.block_snr_db.shape == (1, 4)
    assert torch.isnan(s.block_snr_db[0, 2:]).all()


def test_hadamard_stats_are_taken_in_the_rotated_domain() -> None:
    # mxfp4 wgrad copies: H16 (+) H16 scaled by 1/4. A spike of 4 becomes sixteen +-1s:
    # sixteen non-zero elements, all exact at e = -2 (1 * 2^2 = 4 in e2m1).
    x = torch.zeros(1, 32)
    x[0, 0] = 4.0
    s = block_stats(x, get_recipe("mxfp4").x_col)
    assert s.domain == "rotated"
    assert (s.nonzero_elements, s.flushed_elements) == (16, 0)
    assert (s.n_blocks, s.zero_blocks, s.exact_blocks) == (4, 3, 1)
    assert s.scale_exponents == {-2: 1}
    assert s.snr_db == math.inf and s.snr_histogram == {}
    assert json.loads(json.dumps(s.to_json(), allow_nan=False))["snr_db_quantiles"]["p50"] == "inf"


def test_to_json_is_plain_json_without_tensors() -> None:
    s = block_stats(two_blocks(), E2M1_FLOOR)
    data = json.loads(json.dumps(s.to_json(), allow_nan=False))
    assert data["scale_exponents"] == {"0": 2}
    assert data["shape"] == [2, 32] and "block_snr_db" not in data
    assert isinstance(s, BlockStats)


@pytest.mark.parametrize(("x", "spec", "error", "match"), [
    (torch.ones(32), E2M1_FLOOR, ValueError, r"2D operand"),
    (torch.ones(2, 32), "mxfp4", TypeError, r"OperandSpec"),
    (torch.ones(2, 32), OperandSpec(), ValueError, r"scaling='none'"),
    (torch.ones(2, 32), OperandSpec("e4m3", "delayed"), ValueError, r"state"),
], ids=["1d", "not-a-spec", "unquantized", "delayed-without-state"])
def test_bad_arguments_are_named(x: torch.Tensor, spec: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        block_stats(x, spec)  # type: ignore[arg-type]


# ---- Gaussian anchors ------------------------------------------------------------------


def gaussian_clip_probability(mantissa_above: float, block: int = 32) -> float:
    """P(a block of |N(0,1)| saturates under the floor rule): its amax's float mantissa
    exceeds ``mantissa_above`` (max / 2^emax: 1.5 for e2m1, 1.75 for e4m3). From the
    normal CDF: P(amax < t) = erf(t / sqrt 2) ** block."""
    cdf = lambda t: math.erf(t / math.sqrt(2)) ** block  # noqa: E731
    return sum(cdf(2.0 ** (k + 1)) - cdf(mantissa_above * 2.0**k) for k in range(-20, 8))


GAUSSIAN = synthetic((1024, 1024), "normal", seed=0)  # 32768 blocks of 32


@pytest.mark.parametrize(("fmt", "mantissa_above"), [("e2m1", 1.5), ("e4m3", 1.75)])
def test_gaussian_floor_clip_fraction_matches_the_normal_cdf(fmt: str, mantissa_above: float) -> None:
    expected = gaussian_clip_probability(mantissa_above)  # 0.297 (e2m1), 0.169 (e4m3)
    s = block_stats(GAUSSIAN, OperandSpec(fmt, "mx", scale_rule="floor"))
    # 32768 blocks: the binomial sd is ~0.0025; 0.01 is four of them.
    assert s.saturated_fraction == pytest.approx(expected, abs=0.01)
    assert 0.28 < gaussian_clip_probability(1.5) < 0.31 and 0.16 < gaussian_clip_probability(1.75) < 0.18


@pytest.mark.parametrize("fmt", ["e2m1", "e4m3"])
def test_rceil_never_clips_gaussian_blocks(fmt: str) -> None:
    s = block_stats(GAUSSIAN, OperandSpec(fmt, "mx", scale_rule="rceil"))
    assert (s.saturated_blocks, s.overflow_blocks) == (0, 0)
    assert s.n_blocks == 32768 and s.zero_blocks == 0


def test_floor_e2m1_overflow_is_the_blocks_at_or_above_7() -> None:
    # Scaled amax >= 7 = 6 + ulp(6)/2 is a mantissa >= 1.75: the e4m3 clip probability.
    s = block_stats(GAUSSIAN, E2M1_FLOOR)
    assert s.overflow_fraction == pytest.approx(gaussian_clip_probability(1.75), abs=0.01)


# ---- the probe -------------------------------------------------------------------------


def flux(recipe: str) -> tuple[nn.Module, list[str]]:
    g = torch.Generator().manual_seed(0)
    model = Flux("flux-tiny")
    init_weights(model, generator=g)
    break_zero_init(model, generator=g)
    return model, quantize_model(model, recipe)


def step(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(123)  # nvfp4's SR bits come from the global RNG (no layer generator)
    inputs = make_inputs("flux-tiny", 2, 16, 16, generator=torch.Generator().manual_seed(1))
    out = model(**inputs)
    out.square().mean().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4"])
def test_probe_leaves_outputs_and_gradients_bit_identical(recipe: str) -> None:
    out, grads = step(flux(recipe)[0])
    model, _ = flux(recipe)
    with StatsProbe(model, seed=7) as probe:
        out_p, grads_p = step(model)
    assert probe.results
    assert torch.equal(bits(out), bits(out_p))
    assert grads.keys() == grads_p.keys() and len(grads) > 20
    for name, g in grads.items():
        assert torch.equal(bits(g), bits(grads_p[name])), name
    assert any(bool(g.abs().sum() > 0) for g in grads.values())


def test_probe_collects_six_operands_in_three_directions_per_layer() -> None:
    model, names = flux("mxfp8")
    with StatsProbe(model) as probe:
        step(model)
    pairs = {(d, op) for d, (a, b, _) in GEMMS.items() for op in (a, b)}
    assert len(pairs) == 6
    assert set(probe.results) == {(layer, d, op) for layer in names for d, op in pairs}
    layer = "double_blocks.0.img_mlp.0"  # 64 -> 256, M = 2 * 16 image tokens
    r = {op: probe.results[(layer, d, op)] for d, op in pairs}
    assert [r[op].shape for op in ("x_row", "w_row", "g_row", "w_col", "g_col", "x_col")] == [
        (32, 64), (256, 64), (32, 256), (64, 256), (256, 32), (64, 32)]
    assert r["g_row"].nonzero_elements > 0 and r["g_row"].scale_exponents  # a real gradient
    assert all(s.fmt == "e4m3" and s.saturated_blocks == 0 for s in probe.results.values())  # rceil
    assert set(probe.to_json()) == {"/".join(k) for k in probe.results}


def test_probe_leaves_delayed_scaling_histories_alone() -> None:
    def layer() -> nn.Module:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 32))
        quantize_model(model, "fp8-delayed", include=("0",))
        return model

    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(2))
    plain, probed = layer(), layer()
    for _ in range(2):
        plain(x).sum().backward()
        with StatsProbe(probed) as probe:
            probed(x).sum().backward()
    for op, state in plain[0].states.items():
        assert torch.equal(state.amax_history, probed[0].states[op].amax_history), op
        assert torch.equal(state.scale, probed[0].states[op].scale), op
    assert len(probe.results) == 6


def test_probe_measures_a_plain_linear_under_a_given_recipe() -> None:
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32))
    with StatsProbe(model, "mxfp4", layers=["2"]) as probe:
        model(torch.randn(32, 64)).sum().backward()
    assert {k[0] for k in probe.results} == {"2"} and len(probe.results) == 6
    assert probe.results[("2", "fwd", "w_row")].block == (32, 32)


def test_probe_without_a_quantized_linear_or_recipe_says_what_to_pass() -> None:
    with pytest.raises(ValueError, match="pass recipe="):
        StatsProbe(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(ValueError, match=r"not modules"):
        StatsProbe(nn.Sequential(nn.Linear(4, 4)), "mxfp8", layers=["nope"])


# ---- CLI -------------------------------------------------------------------------------


def test_cli_json_on_synthetic_activations(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "stats", "--recipe", "mxfp8", "--shape", "64x256", "--json")
    assert code == 0
    data = json.loads(out)
    (s,) = data["tensors"].values()
    assert (data["recipe"], data["operand"], s["n_blocks"], s["saturated_blocks"]) == ("mxfp8", "x_row", 512, 0)


def test_cli_text_names_the_statistics(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "stats", "--recipe", "mxfp4", "--operand", "x_col", "--shape", "32x128",
                       "--dist", "student-t3")
    assert code == 0
    assert "rotated domain" in out and "saturated" in out and "scale exp" in out


def test_cli_reads_a_dict_of_tensors_per_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "acts.pt"
    torch.save({"a": torch.randn(2, 16, 64), "b": torch.randn(8, 32).bfloat16(), "step": 3}, path)
    code, out, _ = run_cli(capsys, "stats", "--pt", path, "--recipe", "mxfp8", "--json")
    assert code == 0
    tensors = json.loads(out)["tensors"]
    assert sorted(tensors) == ["a", "b"]  # the int is not a tensor
    assert tensors["a"]["shape"] == [32, 64] and tensors["b"]["shape"] == [8, 32]
    code, out, _ = run_cli(capsys, "stats", "--pt", path, "--key", "b", "--recipe", "mxfp8", "--json")
    assert code == 0 and list(json.loads(out)["tensors"]) == ["b"]


@pytest.mark.parametrize(("argv", "match"), [
    (["--shape", "3x"], "ROWSxCOLS"),
    (["--recipe", "nope"], "invalid choice"),
    (["--key", "a"], "--pt"),
    (["--pt", "missing.pt"], "cannot read"),
    (["--pt", "{acts}", "--key", "zzz"], "'zzz' is not a tensor"),
    (["--pt", "{acts}", "--recipe", "mxfp8", "--key", "odd"], "odd: .*multiple of the block size"),
], ids=["shape", "recipe", "key-without-pt", "missing-file", "missing-key", "bad-shape"])
def test_cli_errors_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            argv: list[str], match: str) -> None:
    acts = tmp_path / "acts.pt"
    torch.save({"a": torch.randn(4, 32), "odd": torch.randn(4, 33)}, acts)
    code, out, err = run_cli(capsys, "stats", *(a.format(acts=acts) for a in argv))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert re.search(match, err), err


# ---- reports -----------------------------------------------------------------------------


def report_with_stats() -> Report:
    stats = {"fwd x_row": block_stats(two_blocks(), E2M1_FLOOR).to_json(),
             "fwd w_row": block_stats(two_blocks(), E2M1_RCEIL).to_json()}
    return Report(unknown={"block_stats": stats})


def test_block_stats_survive_the_report_round_trip() -> None:
    report = report_with_stats()
    again = Report.loads(report.dumps())
    assert again.unknown["block_stats"] == json.loads(json.dumps(report.unknown["block_stats"]))
    assert again.dumps() == report.dumps()


@pytest.mark.usefixtures("matplotlib")
def test_html_draws_block_stat_histograms_when_a_report_carries_them() -> None:
    page = render_html(report_with_stats())
    assert "<h2>Block statistics (2 operands)</h2>" in page
    assert page.count('alt="fwd x_row: block statistics"') == 1
    assert '<td class="num">50.00%</td>' in page  # floor saturates one of two blocks
    assert "Block statistics" not in render_html(Report())


@pytest.mark.usefixtures("matplotlib")
def test_block_stats_figure_draws_the_histograms() -> None:
    s = block_stats(two_blocks(), E2M1_RCEIL).to_json()
    fig = block_stats_figure("x", s)
    bars = {gid: sorted((p.get_x() + p.get_width() / 2, p.get_height()) for ax in fig.axes
                        for p in ax.patches if p.get_gid() == gid)
            for gid in ("scale_exponents", "block_snr")}
    assert bars["scale_exponents"] == [(0.0, 1.0), (1.0, 1.0)]
    assert [h for _, h in bars["block_snr"]] == [1.0, 1.0]


def test_merged_reports_keep_both_block_stats_and_render_them() -> None:
    a = report_with_stats()
    b = Report(unknown={"block_stats": {"wgrad x_col": block_stats(two_blocks(), E2M1_FLOOR).to_json()}})
    merged = Report.merge([a, b])
    assert "<h2>Block statistics (3 operands)</h2>" in render_html(merged)
