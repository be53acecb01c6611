"""The Flux sweep: every unique linear shape through each recipe, and what it reports."""

from __future__ import annotations

import json

import pytest

from mxcheck.cli import main
from mxcheck.flux import flux_linear_shapes
from mxcheck.functions import quant_linear
from mxcheck.hardware import FAKE_HARDWARE_ENV
from mxcheck.recipes import get_recipe
from mxcheck.report import Report
from mxcheck.sweep import pick_backend, run_sweep, sweep_cases

pytestmark = pytest.mark.emulated


def test_cases_are_the_unique_linear_shapes():
    rows = flux_linear_shapes("flux-12b", 64, 256, 256)
    cases = sweep_cases(rows)
    assert [(c.in_features, c.out_features, c.tokens) for c in cases] == [
        (3072, 9216, 16384), (3072, 3072, 16384), (3072, 12288, 16384), (12288, 3072, 16384),
        (3072, 21504, 32768), (15360, 3072, 32768)]
    assert cases[0].label == "double_blocks.*.img_attn.qkv + double_blocks.*.txt_attn.qkv"
    assert len(cases[0].layers) == 38 and sum(len(c.layers) for c in cases) == len(rows)
    # image and text streams with different token counts are different cases
    assert len(sweep_cases(flux_linear_shapes("flux-12b", 1, 1024, 256))) == 10
    assert cases[0].gemms()["wgrad"] == (9216, 3072, 16384)


def test_sweep_records_every_case_recipe_and_direction():
    report = run_sweep("flux-small", ("mxfp8", "mxfp6"), "emulated", batch=1, device="cpu")
    env = report.environment["sweep"]
    assert env["tokens_scaled_down"] and env["tokens_override"] == 256 and env["device"] == "cpu"
    n_cases = len(sweep_cases(flux_linear_shapes("flux-small", 1, 256, 256), 256))
    assert len(report.records) == n_cases * 2 * 4
    assert all(r.passed for r in report.records), [r for r in report.records if not r.passed]
    by = {(r.recipe, r.direction) for r in report.records}
    assert by == {(rec, d) for rec in ("mxfp8", "mxfp6") for d in ("fwd", "dgrad", "wgrad", "bgrad")}
    mxfp6 = [r.snr_db for r in report.records if r.recipe == "mxfp6" and r.direction != "bgrad"]
    assert 25 < min(mxfp6) and max(mxfp6) < 32  # measured ~28 dB: quantized, not bf16


@pytest.mark.parametrize("recipe", ["fp8-delayed", "mxfp4+sr"])
def test_delayed_and_derived_recipes_have_sweep_records(recipe):
    """fp8-delayed runs 3 steps on fresh amax histories and records the last; a derived
    recipe resolves by name and is held to its base recipe's floor."""
    from mxcheck.thresholds import linear_floor

    report = run_sweep("flux-small", (recipe,), "emulated", batch=1, tokens=64, device="cpu")
    assert report.records and not report.skipped
    assert {r.recipe for r in report.records} == {recipe}
    assert all(r.passed for r in report.records), [r for r in report.records if not r.passed]
    fwd = [r for r in report.records if r.direction == "fwd"]
    assert all(r.threshold_db == linear_floor(recipe) for r in fwd)
    assert all(r.snr_db < 60 for r in fwd)  # quantized, not bf16 (bf16 gives ~70 dB)


def test_a_shape_a_recipe_cannot_take_is_listed_as_skipped():
    report = run_sweep("flux-small", ("mxfp6",), "emulated", batch=1, tokens=64, device="cpu")
    assert not report.records
    assert report.skipped and all("M=64" in s["reason"] and "mxfp6" in s["test_id"] for s in report.skipped)


def test_a_seeded_gemm_bug_fails_the_sweep():
    # fp4 codes read with the nibbles swapped (torchao issue #2939)
    report = run_sweep("flux-small", ("mxfp4",), "mxcheck.backends.known_bad:NibbleSwap", batch=1, device="cpu")
    failed = [r for r in report.records if not r.passed]
    assert failed and {r.direction for r in failed} >= {"fwd", "dgrad", "wgrad"}
    assert all(r.snr_db < 10 for r in failed)


def test_auto_picks_emulated_on_a_cpu_and_refuses_an_unusable_backend(monkeypatch):
    monkeypatch.setenv(FAKE_HARDWARE_ENV, "cpu")  # as on a CPU host, also on a GPU runner
    assert pick_backend("auto", get_recipe("mxfp4")).name == "emulated"
    with pytest.raises(ValueError, match="backend='triton' is not usable here"):
        pick_backend("triton", get_recipe("mxfp4"))


def test_cli_writes_the_reports(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "--model", "flux-small", "--recipes", "fp8", "--mbs", "1", "--out", str(out)]) == 0
    report = Report.load(out / "sweep.json")
    assert report.records and (out / "sweep.md").read_text().startswith("**mxcheck**")
    assert "<html" in (out / "sweep.html").read_text()
    assert "records, 0 failed" in capsys.readouterr().err
    assert main(["sweep", "--model", "flux-small", "--recipes", "mxfp4", "--mbs", "1", "-q",
                 "--backend", "mxcheck.backends.known_bad:NibbleSwap"]) == 1
    assert main(["sweep", "--model", "flux-99b"]) == 2
    assert main(["sweep", "--recipes", "mxfp5", "--model", "flux-small"]) == 2
    capsys.readouterr()
    assert main(["shapes", "--model", "flux-535m", "--mbs", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 30 and rows[0] == {"layer": "double_blocks.0.img_attn.qkv", "stream": "img",
                                           "direction": "fwd", "m": 256, "n": 9216, "k": 3072}


class CheaperRecipeLinear:
    """A whole-linear backend (no gemm, as TransformerEngine and torchao) that silently runs
    mxfp4 whatever recipe it is asked for: the sweep must fail it."""

    name = "cheaper-recipe-linear"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, recipe) -> tuple[bool, str]:
        return True, ""

    def linear(self, x, weight, bias, recipe, **kw):
        return quant_linear(x, weight, bias, "mxfp4-1x32")


def test_a_whole_linear_backend_runs_through_the_sweep():
    # torchao's MXFP8Linear (emulated kernel, any device) is a linear without a gemm.
    report = run_sweep("flux-small", ("mxfp8",), "torchao", batch=1, tokens=64, device="cpu")
    bitwise = [r for r in report.records if r.kind == "bitwise"]
    assert {r.direction for r in bitwise} == {"fwd", "dgrad", "wgrad"}
    # dgrad and wgrad are the reference Function's bits; the forward rounds its GEMM to bf16
    # before adding the bias (pinned in test_torch_backends), about 51 dB from the reference.
    grads = [r for r in bitwise if r.direction != "fwd"]
    # (a rare 1-ulp flip from float32 summation order: <= 1e-5 of outputs, seen 1 on torch 2.13, 2 on 2.11)
    assert sum(r.mismatches for r in grads) <= 1e-5 * sum(r.total for r in grads), \
        [(r.layer, r.direction, r.mismatches) for r in grads]
    assert all(r.snr_db > 45 for r in bitwise if r.direction == "fwd")
    assert all(r.passed for r in report.records)


def test_a_whole_linear_backend_that_falls_back_to_a_cheaper_recipe_fails_the_sweep():
    report = run_sweep("flux-small", ("mxfp8",), "tests.test_sweep:CheaperRecipeLinear", batch=1, tokens=64, device="cpu")
    failed = [r for r in report.records if not r.passed]
    assert {r.direction for r in failed} >= {"fwd", "dgrad", "wgrad"}
    assert not any(r.bit_equal for r in report.records if r.kind == "bitwise")
