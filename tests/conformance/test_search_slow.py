"""The search's long runs (the slow job: ``pytest -m slow``): every other seeded bug found and
shrunk to one block, a large input written beside the reproducer, nothing found on the oracle
for every recipe at 200 examples each."""

from __future__ import annotations

import pytest

from mxcheck.conformance.search_repro import write_reproducer
from tests.conformance.test_search import (
    SLOW,
    _assert_found_and_shrunk,
    _find,
    _finds_nothing,
    _run_alone,
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
