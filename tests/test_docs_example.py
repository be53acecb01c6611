"""The worked example of docs/backends.md run as a kernel engineer runs it: ``mxcheck conform``
from a directory outside the checkout, with docs/examples importable (.ci/run runs the same
two commands from the built wheel in a subprocess).
(What a ValueError, a Refusal, a disowned claim or an unjudged run turn into is checked
in-process, faster, in tests/test_claims.py.)"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

import mxcheck
import mxcheck.backends
from mxcheck.backends import BackendLoadError, Refusal
from mxcheck.cli import main
from mxcheck.recipes import get_recipe

pytestmark = pytest.mark.emulated

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
# The mxcheck these tests import (this checkout, or the installed package), so the subprocess
# judges the same code.
MXCHECK_ROOT = Path(mxcheck.__file__).resolve().parents[1]

def _conform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, backend: str,
             *pytest_args: str) -> tuple[int, str, dict]:
    """Exit code, output and JSON report of ``mxcheck conform`` on ocp-mxfp8-e4m3, run from
    tmp_path (outside the checkout) with docs/examples importable. In-process: the same run
    from the built wheel, in a directory outside the checkout, is a step of .ci/run."""
    assert MXCHECK_ROOT not in tmp_path.parents and EXAMPLES.parents[1] not in tmp_path.parents
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    report = tmp_path / "report.json"
    args = ["conform", "--backend", backend, "--recipe", "ocp-mxfp8-e4m3", "--report", str(report)]
    code = main([*args, "--", *pytest_args] if pytest_args else args)
    captured = capsys.readouterr()
    data = json.loads(report.read_text()) if report.is_file() else {}
    return code, captured.out + captured.err, data


OUTPUT = re.compile(r"^<!-- output: ([a-z-]+)[^>]*-->\n\n```text\n(.*?)^```$", re.MULTILINE | re.DOTALL)
DOCS = EXAMPLES.parent


def pasted(name: str) -> list[tuple[str, list[str]]]:
    """(page, lines) of every ```text block in docs/ marked ``<!-- output: NAME -->``."""
    return [(p.name, m.group(2).splitlines()) for p in sorted(DOCS.glob("*.md"))
            for m in OUTPUT.finditer(p.read_text()) if m.group(1) == name]


def assert_pasted_output_is_current(name: str, out: str) -> None:
    """Every line of each block pasted as ``name`` is in ``out``, in order: a line is split
    at ``...`` (what the page shortened) and its pieces must appear, in order, in one line of
    the output; a line of ``...`` alone is skipped."""
    blocks = pasted(name)
    assert blocks, f"no block <!-- output: {name} --> in docs/"
    for page, lines in blocks:
        at, got = 0, out.splitlines()
        for line in lines:
            pieces = [p.strip() for p in line.split("...") if p.strip()]
            if not pieces:
                continue
            while at < len(got) and not _has_in_order(got[at], pieces):
                at += 1
            assert at < len(got), f"docs/{page}, output {name!r}: {line!r} is not in the output (in order)\n{out}"
            at += 1


def _has_in_order(line: str, pieces: list[str]) -> bool:
    pos = 0
    for piece in pieces:
        pos = line.find(piece, pos)
        if pos < 0:
            return False
        pos += len(piece)
    return True


def test_every_output_block_in_the_docs_is_checked_by_a_test():
    # the tests below, and the search's CLI test (tests/conformance/test_search.py)
    checked = {"toy-mx", "toy-mx-buggy", "toy-refuses", "not-importable", "search-bad-trunc"}
    marked = {m.group(1) for p in DOCS.glob("*.md") for m in OUTPUT.finditer(p.read_text())}
    assert marked == checked
    text_blocks = sum(p.read_text().count("```text\n") for p in DOCS.glob("*.md"))
    assert text_blocks == sum(len(pasted(n)) for n in checked), "a ```text block without <!-- output: NAME -->"


def _failed(records: list[dict]) -> list[dict]:
    return [r for r in records if not r["passed"]]


def test_example_backend_passes_the_whole_suite_on_ocp_mxfp8_e4m3(tmp_path, monkeypatch, capsys):
    code, out, report = _conform(tmp_path, monkeypatch, capsys, "toy_mx:make_backend")
    assert code == 0, out
    records = report["records"]
    assert {r["backend"] for r in records} == {"toy-mx"}
    assert _failed(records) == []
    judged = {r["test_id"].rsplit("-", 1)[-1].rstrip("]") for r in records}
    assert {"quantize", "linear"} <= judged, judged  # check_gemm records nothing when it passes
    assert {s["kind"] for s in report["skipped"]} <= {"not_applicable"}, report["skipped"]
    # the input family that catches the seeded bug was compared, bit for bit, and matched
    assert any(r["layer"] == "x_row.scales (amax input)" and r["bit_equal"] for r in records)
    assert_pasted_output_is_current("toy-mx", out)


def test_buggy_example_fails_quantize_on_the_amax_inputs_with_the_scale_one_binade_high(tmp_path, monkeypatch, capsys):
    code, out, report = _conform(tmp_path, monkeypatch, capsys, "toy_mx:make_buggy_backend", "-k", "quantize")
    assert code == 1, out
    failed = _failed(report["records"])
    # every field of every comparison is judged: both operands' scales and codes, amax inputs only
    assert sorted((r["test_id"].endswith("-quantize]"), r["layer"]) for r in failed) == \
        [(True, f"{op}.{field} (amax input)") for op in ("w_row", "x_row") for field in ("codes", "scales")], failed
    # bf16 inputs never put an amax at a float32 ulp below 2**k: those pass
    assert all(r["passed"] for r in report["records"] if "(bf16 input)" in r["layer"])
    # E8M0 bytes: the buggy backend's is one more than the oracle's (0xdb vs 0xda), and the
    # failure names the behaviour that reproduces every differing block
    assert "scales: kernel 0xdb (2^92) | oracle 0xda (2^91)" in out
    assert re.search(r"([\d,]+) of \1 differing blocks are reproduced by: block exponent from a float32 log2", out)
    assert_pasted_output_is_current("toy-mx-buggy", out)


def test_a_refused_quantize_is_counted_as_refused_as_the_guide_shows(tmp_path, monkeypatch, capsys):
    (tmp_path / "toy_refuses.py").write_text(
        "from mxcheck.backends import Refusal\nfrom toy_mx import ToyMX\n\n\n"
        "class ToyRefuses(ToyMX):\n    name = 'toy-refuses'\n\n"
        "    def quantize(self, x, spec, *, state=None):\n        raise Refusal('quantize is not written yet')\n\n\n"
        "def make_backend():\n    return ToyRefuses()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = _conform(tmp_path, monkeypatch, capsys, "toy_refuses:make_backend", "-k", "quantize or shapes")
    assert code == 0, out
    assert_pasted_output_is_current("toy-refuses", out)


def test_buggy_fake_quant_example_fails_on_values_and_names_the_seeded_bug(tmp_path, monkeypatch, capsys):
    # The example's whole suite passing, and this variant failing, from the wheel: steps of .ci/run.
    code, out, report = _conform(tmp_path, monkeypatch, capsys, "toy_fq:make_buggy_backend", "-k", "quantize")
    assert code == 1, out
    failed = _failed(report["records"])
    assert sorted(r["layer"] for r in failed) == ["w_row.values (amax input)", "x_row.values (amax input)"], failed
    # every other comparison of values (bf16 inputs in each dtype, Inf/NaN) passed: only the bug differs
    values = [r for r in report["records"] if ".values (" in r["layer"]]
    assert len(values) > 2 and all(r["passed"] for r in values if r["layer"].split(".values ")[1] != "(amax input)")
    # the cause is found from the values alone: no codes, no scales
    assert re.search(r"cause:\n\S* +([\d,]+) of the \1 differing blocks examined are reproduced by: block exponent "
                     r"from a float32 log2", out), out


@pytest.fixture
def toy_mx():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import toy_mx  # docs/examples is no package: imported from its path
        yield toy_mx
    finally:
        sys.path.remove(str(EXAMPLES))


def test_example_refuses_a_contraction_dim_that_is_not_a_multiple_of_32_naming_it(toy_mx):
    spec = get_recipe("ocp-mxfp4").x_row
    with pytest.raises(Refusal, match=r"K=48 \(last dim of x, shape \(4, 48\)\)"):
        toy_mx.make_backend().quantize(torch.ones(4, 48), spec)


def test_example_supports_no_recipe_beyond_plain_ocp_mx_and_says_which_field(toy_mx):
    backend = toy_mx.make_backend()
    assert backend.supports(get_recipe("ocp-mxfp8-e4m3")) == (True, "")
    assert backend.supports(get_recipe("mxfp8")) == \
        (False, "x_row: scale_rule='rceil': only OCP MX v1.0 is implemented (scale_rule='floor')")
    assert backend.supports(get_recipe("ocp-mxfp6-e2m3")) == \
        (False, "x_row: fmt=e2m3 scaling=mx: only MX e2m1 and e4m3 are implemented")


def test_a_backend_module_that_is_not_importable_is_named_with_how_to_make_it_importable(tmp_path, monkeypatch,
                                                                                      capsys):
    with pytest.raises(BackendLoadError, match=r"cannot import 'no_such_kernels\.quant'.*put the directory that "
                                               r"holds 'no_such_kernels' on PYTHONPATH"):
        mxcheck.backends.get("no_such_kernels.quant:make_backend")
    monkeypatch.chdir(tmp_path)
    code = main(["conform", "--backend", "mymod:make_backend", "--recipe", "ocp-mxfp8-e4m3"])
    captured = capsys.readouterr()
    assert code != 0
    assert_pasted_output_is_current("not-importable", captured.out + captured.err)


def test_a_missing_dependency_inside_the_backend_module_gets_no_pythonpath_hint(tmp_path, monkeypatch):
    (tmp_path / "needs_a_dep.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BackendLoadError, match=r"No module named 'no_such_dependency_xyz'\)$"):
        mxcheck.backends.get("needs_a_dep:make_backend")


def test_every_excerpt_of_the_example_in_the_guide_is_in_the_example_file():
    guide = (EXAMPLES.parent / "backends.md").read_text()
    source = set((EXAMPLES / "toy_mx.py").read_text().splitlines())
    blocks = [b.split("```", 1)[0] for b in guide.split("```python\n")[1:]]
    excerpts = [b.splitlines()[1:] for b in blocks if b.startswith("# docs/examples/toy_mx.py\n")]
    assert len(excerpts) == 2
    missing = [line for lines in excerpts for line in lines if line.strip() not in ("", "...") and line not in source]
    assert missing == []
