"""The search's long runs (the slow job: ``pytest -m slow``): every other seeded bug found and
shrunk to one block, a large input written beside the reproducer, nothing found on the oracle
for every recipe at 200 examples each."""

from __future__ import annotations

import pytest

from mxcheck.conformance.search import search
from mxcheck.conformance.search_repro import write_reproducer
from tests._helpers import run_cli
from tests.conformance.test_search import (
    INF_CAUSES,
    LONG,
    SLOW,
    TWO_BUGS,
    _assert_found_and_shrunk,
    _find,
    _finds_nothing,
    _Log2Values,
    _run_alone,
    _two_bug_search,
    _ZeroBlock127AndInfBlock127,
)

pytest.importorskip("hypothesis")
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", sorted(SLOW))
def test_the_search_finds_every_other_seeded_bug_too(name):
    _assert_found_and_shrunk(name)


def test_a_large_input_goes_to_a_pt_file_beside_the_script(tmp_path, monkeypatch):
    monkeypatch.setattr("mxcheck.conformance.search_repro.LITERAL_LIMIT", 8)
    finding = _find("bad-nibble-swap", "mxfp4", "gemm")
    where = write_reproducer(finding, "mxcheck.backends.known_bad:NibbleSwap", "mxfp4", tmp_path)
    assert (where / "input.pt").exists()
    run = _run_alone(where / "repro.py")
    assert run.returncode == 1 and "fp32-accumulation bound" in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize("recipe", ["nvfp4", "fp8", "mxfp8", "mxfp6", "fp8-delayed", "fp8-block", "ocp-mxfp4"])
def test_the_search_finds_nothing_on_the_oracle_itself_on_other_recipes(recipe):
    _finds_nothing(recipe, 200)


def test_the_search_finds_a_float32_log2_scale_in_a_fake_quant_backends_values(tmp_path):
    """Issue 41: the quantize property on values; shrunk to one block, a reproducer that fails alone."""
    result = search(_Log2Values, "ocp-mxfp4", seconds=LONG, properties=["quantize"], max_examples=400, stop_after=1)
    (finding,) = result.findings
    assert finding.size["blocks"] == 1, finding.size
    assert finding.cause is not None and finding.cause.key == "mx.exponent_source=log2_fp32", finding.cause
    where = write_reproducer(finding, "tests.conformance.test_search:_Log2Values", "ocp-mxfp4", tmp_path)
    run = _run_alone(where / "repro.py")
    assert run.returncode == 1 and "values differ" in run.stdout, run.stdout + run.stderr


def test_one_search_reports_both_bugs_each_with_a_reproducer_that_fails_alone(tmp_path):
    result = _two_bug_search()
    causes = [f.cause.key if f.cause else None for f in result.findings]
    assert len(causes) == 2 and causes[0] == "mx.zero_scale=127" and causes[1] in INF_CAUSES, causes
    assert all(f.size["blocks"] == 1 for f in result.findings), [f.size for f in result.findings]
    assert result.findings[1].known == ("mx.zero_scale=127",)
    for i, f in enumerate(result.findings):
        where = write_reproducer(f, TWO_BUGS, "mxfp8", tmp_path, index=i)
        run = _run_alone(where / "repro.py")
        assert run.returncode == 1 and "scales" in run.stdout, run.stdout + run.stderr


def test_with_the_fitted_recipe_file_the_search_reports_the_other_bug_only(tmp_path, capsys):
    from mxcheck.cli.fit import write_recipe
    from mxcheck.conformance.fitting import fit_backend
    from mxcheck.recipes import RECIPES

    fitted = tmp_path / "fitted.yaml"
    fits = fit_backend(_ZeroBlock127AndInfBlock127(), RECIPES["mxfp8"], rows=32, cols=64, inputs=("zeros",))
    assert [f.fit.fields for f in fits] == [{"zero_scale": 127}], [f.fit.text() for f in fits]  # the premise
    write_recipe(fitted, RECIPES["mxfp8"], fits)
    result = _two_bug_search(str(fitted))
    assert [f.cause.key in INF_CAUSES for f in result.findings] == [True], [f.cause for f in result.findings]
    code, out, _ = run_cli(capsys, "search", "--backend", TWO_BUGS, "--recipe", fitted, "--seconds", "3",
                           "--properties", "quantize", "--out", tmp_path)
    assert code == 1 and out.count("reproducer: python") == 1, out
    assert "input amax 0x7f800000 (inf)" in out, out  # a block holding +Inf: its amax is Inf, not 3.4e38
