"""The search finds the seeded bugs, shrinks each to one block, and writes a reproducer that
runs alone; it finds nothing on the oracle itself, and a seed repeats it."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mxcheck.backends.contract import Refusal
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.backends.known_bad import KNOWN_BAD
from mxcheck.conformance.search import judge, search
from mxcheck.conformance.search_repro import write_reproducer
from mxcheck.diagnose import CATALOGUE
from tests._helpers import run_cli
from tests.conformance.test_known_bad import EXPECTED
from tests.test_docs_example import assert_pasted_output_is_current

pytest.importorskip("hypothesis")
pytestmark = pytest.mark.emulated

ROOT = Path(__file__).resolve().parents[2]
LONG = 600.0  # seconds: the examples cap ends these searches, never the clock

# bug -> (recipe, the property that reaches it, the catalogue behaviour the failure names, or None
# where the catalogue has no behaviour for it)
FAST = {
    "bad-trunc": ("mxfp4", "quantize", "mx.rounding=trunc"),
    "bad-scale-rule": ("mxfp4", "quantize", "mx.scale_rule=floor"),
    "bad-nibble-swap": ("mxfp4", "gemm", "gemm-fp4-nibble-swap"),
    "bad-stale-weight": ("mxfp8", "linear", "linear-stale-weight"),
}
SLOW = {
    "bad-half-away": ("mxfp4", "quantize", "mx.rounding=half_away"),
    "bad-log2-scale": ("ocp-mxfp4", "quantize", "mx.exponent_source=log2_fp32"),
    "bad-k-mod-256": ("mxfp4", "gemm", None),
    "bad-bf16-fallback": ("mxfp4", "linear", None),
    "bad-nan-to-zero": ("fp8", "linear", None),
    "bad-drops-bias": ("mxfp8", "linear", None),
}

# Every other seeded bug, from the table of the checks that catch it: the search reaches it
# through the property of that check, and names the same cause where one block shows it.
SLOW.update({name: (recipe, check, cause if cause in CATALOGUE else None)
             for name, (recipe, check, cause) in EXPECTED.items()
             if name not in FAST and name not in SLOW and check in ("quantize", "gemm")})

# NVFP4 block scales computed in bf16: in one block the block amax is the tensor amax and its
# scale is 448 exactly in any precision; a second block, under the first, is what bf16 rounds.
TWO_BLOCKS = {"bad-nvfp4-block-scale-bf16"}


def _find(name: str, recipe: str, prop: str, seed: int = 0, max_examples: int = 400):
    result = search(KNOWN_BAD[name], recipe, seconds=LONG, seed=seed, properties=[prop], max_examples=max_examples,
                    stop_after=1)
    assert [f.prop for f in result.findings] == [prop], (name, result.examples)
    return result.findings[0]


def _assert_found_and_shrunk(name: str) -> None:
    recipe, prop, cause = {**FAST, **SLOW}[name]
    finding = _find(name, recipe, prop)
    if name in TWO_BLOCKS:  # no one-block input shows it: two values, one per block, at the least
        assert finding.size["nonzeros"] == 2, finding.size
    else:
        assert finding.size["blocks"] == 1, finding.size
        assert finding.size["nonzeros"] <= 4, finding.size
    if cause is not None:
        assert CATALOGUE[cause].describe() in finding.message, finding.message


@pytest.mark.parametrize("name", sorted(FAST))
def test_the_search_finds_a_seeded_bug_and_shrinks_it_to_one_block(name):
    _assert_found_and_shrunk(name)


def test_every_known_bad_backend_is_searched_for_in_the_tests():
    assert set(FAST) | set(SLOW) == set(KNOWN_BAD)


def _run_alone(script: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(script)], cwd=script.parent, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_reproducer_runs_alone_and_fails_with_the_difference(tmp_path, capsys):
    finding = _find("bad-trunc", "mxfp4", "quantize")
    where = write_reproducer(finding, "mxcheck.backends.known_bad:TruncForRne", "mxfp4", tmp_path)
    run = _run_alone(where / "repro.py")
    assert run.returncode == 1, run.stderr
    assert "x_row.codes" in run.stdout and "differ" in run.stdout
    assert CATALOGUE["mx.rounding=trunc"].describe() in run.stdout
    # the same script on the oracle itself agrees: it fails because of the backend, not the input
    # (run in this process: the subprocess above already showed it runs alone)
    script = (where / "repro.py").read_text().replace("mxcheck.backends.known_bad:TruncForRne", "emulated")
    (where / "repro.py").write_text(script)
    runpy.run_path(str(where / "repro.py"), run_name="__main__")
    assert "agrees with the oracle" in capsys.readouterr().out


def _finds_nothing(recipe: str, examples: int) -> None:
    result = search(EmulatedBackend, recipe, seconds=LONG, seed=0, max_examples=examples)
    assert not result.findings, [f.message for f in result.findings]
    assert set(result.examples) == {"quantize", "gemm", "linear"}
    assert all(n >= examples for n in result.examples.values()), result.examples


def test_the_search_finds_nothing_on_the_oracle_itself():
    _finds_nothing("mxfp4", 30)


def test_a_seed_repeats_the_search():
    first, second = (_find("bad-scale-rule", "mxfp4", "quantize", seed=3) for _ in range(2))
    assert first.examples == second.examples
    assert first.case.tensors.keys() == second.case.tensors.keys()
    for name, t in first.case.tensors.items():
        assert torch.equal(t.view(torch.int32), second.case.tensors[name].view(torch.int32))


def test_judge_holds_the_backend_to_the_oracle_on_one_input():
    x = torch.zeros(1, 32)
    x[0, 0] = 5.0  # e2m1 at scale 1: 5 is the midpoint of 4 and 6; RNE gives 4, half-away 6
    assert judge("quantize", EmulatedBackend(), "ocp-mxfp4", {"x": x}) is None
    message = judge("quantize", KNOWN_BAD["bad-half-away"](), "ocp-mxfp4", {"x": x})
    assert message is not None and "code kernel 0x07 (6.0) | oracle 0x06 (4.0)" in message


def test_a_missing_hypothesis_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "hypothesis", None)
    with pytest.raises(ImportError, match=r"pip install hypothesis .*mxcheck\[search\]"):
        search(EmulatedBackend, "mxfp4", seconds=1)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match=r"properties=.*'quantise'"):
        search(EmulatedBackend, "mxfp4", seconds=1, properties=["quantise"])
    with pytest.raises(ValueError, match="seconds=0"):
        search(EmulatedBackend, "mxfp4", seconds=0)


def test_the_cli_writes_the_reproducer_and_exits_1(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "search", "--backend", "bad-trunc", "--recipe", "mxfp4", "--seconds", "5",
                           "--properties", "quantize", "--out", tmp_path)
    assert code == 1
    assert "reproducer: python" in out and "1 nonzero values" in out
    assert (tmp_path / "repro" / "TruncForRne-mxfp4-quantize" / "repro.py").exists()
    assert_pasted_output_is_current("search-bad-trunc", out)  # the run docs/backends.md shows


def test_the_cli_exits_1_when_nothing_was_searched(tmp_path, capsys, monkeypatch):
    (tmp_path / "absent_kernel.py").write_text(
        "from mxcheck.backends.emulated import EmulatedBackend\n\n\n"
        "class Absent(EmulatedBackend):\n    name = 'absent'\n\n"
        "    def available(self):\n        return False, 'no device here'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = run_cli(capsys, "search", "--backend", "absent_kernel:Absent", "--recipe", "fp8", "--seconds", "1",
                           "--out", tmp_path)
    assert code == 1, out
    assert "quantize: not run (no device here)" in out and "nothing was searched" in out, out


def test_the_cli_on_the_oracle_exits_0(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "search", "--backend", "emulated", "--recipe", "fp8", "--seconds", "1",
                           "--out", tmp_path)
    assert code == 0, out
    assert "FOUND" not in out and "quantize: " in out
    assert not (tmp_path / "repro").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--seconds", "0"], "seconds must be a number > 0"),
    (["--properties", "quantise"], "expected a comma-separated list of quantize, gemm, linear"),
])
def test_the_cli_names_a_bad_value(capsys, argv, needle):
    code, _, err = run_cli(capsys, "search", "--backend", "emulated", "--recipe", "fp8", *argv)
    assert code == 2 and needle in err


class _SuitePassed:
    """pytest.main for ``mxcheck conform``: one test passed, exit 0 (the suite is not what
    these tests are about)."""

    def __init__(self):
        self.argv = None

    def __call__(self, argv, plugins=()):
        self.argv = argv
        for plugin in plugins:
            plugin.pytest_runtest_logreport(type("Report", (), {"when": "call", "passed": True})())
        return 0


@pytest.mark.parametrize("spec, code", [("mxcheck.backends.known_bad:TruncForRne", 1), ("emulated", 0)])
def test_conform_search_runs_after_the_suite_and_a_finding_is_exit_1(tmp_path, capsys, monkeypatch, spec, code):
    suite = _SuitePassed()
    monkeypatch.setattr(pytest, "main", suite)
    got, out, _ = run_cli(capsys, "conform", "--backend", spec, "--recipe", "mxfp4", "--search", "0.5",
                          "--properties", "quantize", "--out", tmp_path)
    assert suite.argv is not None and "--search" not in suite.argv  # the search options stay out of pytest's
    assert got == code, out
    assert ("reproducer: python" in out) == bool(code)
    assert "mxcheck search: backend" in out


class _Fp8Only(EmulatedBackend):
    name = "fp8-only"

    def supports(self, recipe):
        return (recipe.name == "fp8", "only the fp8 recipe")

    def quantize(self, x, spec, **kw):
        raise AssertionError("a recipe it does not support was searched")


def test_a_recipe_the_backend_does_not_support_is_not_searched():
    result = search(_Fp8Only, "mxfp4", seconds=1)
    assert not result.examples and not result.findings
    assert result.skipped == dict.fromkeys(("quantize", "gemm", "linear"),
                                           "does not support recipe mxfp4: only the fp8 recipe")


def test_conform_search_without_a_recipe_or_claims_is_a_usage_error_before_the_suite_runs(capsys, monkeypatch):
    suite = _SuitePassed()
    monkeypatch.setattr(pytest, "main", suite)
    code, _, err = run_cli(capsys, "conform", "--backend", "emulated", "--search", "1")
    assert code == 2 and "--search needs a recipe" in err
    assert suite.argv is None


# ---- values, devices, refusals --------------------------------------------------------------------


class _Values:
    """A fake-quant kernel: ``inner``'s quantization, returned as float32 values only."""

    inner: type = EmulatedBackend

    def __init__(self):
        self.backend = self.inner()
        self.name = f"values-{self.backend.name}"

    def available(self):
        return True, ""

    def supports(self, recipe):
        return True, ""

    def fake_quantize(self, x, spec, **kw):
        return self.backend.quantize(x, spec, **kw).dequantize()


class _TruncValues(_Values):
    inner = KNOWN_BAD["bad-trunc"]


class _Log2Values(_Values):
    inner = KNOWN_BAD["bad-log2-scale"]


def test_the_search_searches_the_values_of_a_fake_quant_backend(tmp_path, capsys):
    result = search(_TruncValues, "mxfp4", seconds=LONG, properties=["quantize"], max_examples=400, stop_after=1)
    (finding,) = result.findings
    assert finding.size["blocks"] == 1 and finding.size["nonzeros"] <= 4, finding.size
    assert finding.cause is not None and finding.cause.key in ("mx.rounding=trunc", "mx.rounding=half_zero"), \
        finding.cause
    assert "fake_quantize of recipe mxfp4" in finding.message and "values differ" in finding.message, finding.message
    where = write_reproducer(finding, "tests.conformance.test_search:_TruncValues", "mxfp4", tmp_path)
    with pytest.raises(SystemExit) as exit_:  # in this process: a subprocess run is the slow job's (values-log2)
        runpy.run_path(str(where / "repro.py"), run_name="__main__")
    assert exit_.value.code == 1 and "values differ" in capsys.readouterr().out


class _OnMetaOnly(EmulatedBackend):
    """Reads only tensors on its device, as a Triton kernel reads no CPU pointer ("meta"
    stands for "cuda" on a CPU runner); knowing no data, it returns the oracle's results on
    zeros (so it agrees with the oracle on all-zero inputs)."""

    name = "on-meta-only"
    device = "meta"

    @staticmethod
    def _insist(*tensors):
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                raise RuntimeError(f"Pointer argument (at 0) cannot be accessed from Triton ({t.device.type} tensor?)")

    def quantize(self, x, spec, **kw):
        self._insist(x)
        return super().quantize(torch.zeros(x.shape, dtype=x.dtype), spec, **kw)

    def gemm(self, a, b, *, out_dtype=torch.float32, bias=None):
        self._insist(a.codes, b.codes)
        return torch.zeros(a.codes.shape[0], b.codes.shape[0], dtype=out_dtype)

    def linear(self, x, w, b, recipe, **kw):
        self._insist(x, w, b)
        return torch.zeros(x.shape[0], w.shape[0], dtype=x.dtype)


@pytest.mark.parametrize("prop, names", [("quantize", ("x",)), ("gemm", ("a", "b")), ("linear", ("x", "w"))])
def test_the_search_runs_the_backend_on_its_device(prop, names):
    tensors = {n: torch.zeros(32, 32) for n in names}
    if prop == "linear":
        tensors["b"] = torch.zeros(32)
    assert judge(prop, _OnMetaOnly(), "mxfp8", tensors) is None
    assert judge(prop, EmulatedBackend(), "mxfp8", tensors) is None  # the premise: the oracle agrees on zeros


class _RefusesEverything(EmulatedBackend):
    name = "refuses-everything"

    def quantize(self, x, spec, **kw):
        raise Refusal("this quantizer takes no spec here")


def test_a_refusal_inside_the_search_is_counted_as_declared_and_nothing_is_green(tmp_path, capsys):
    result = search(_RefusesEverything, "mxfp8", seconds=LONG, properties=["quantize"], max_examples=20)
    assert not result.findings and result.refused["quantize"] == result.examples["quantize"] >= 20
    assert result.refusal["quantize"] == "this quantizer takes no spec here"
    code, out, _ = run_cli(capsys, "search", "--backend", "tests.conformance.test_search:_RefusesEverything",
                           "--recipe", "mxfp8", "--seconds", "1", "--properties", "quantize", "--out", tmp_path)
    assert code == 1, out
    assert "refused (declared: this quantizer takes no spec here)" in out and "nothing was searched" in out, out


# ---- past the first finding: two independent bugs --------------------------------------------------


class _ZeroBlock127AndInfBlock127(KNOWN_BAD["bad-inf-block-127"]):
    """Two independent differences: every all-zero MX block stores scale byte 127 (a harmless
    convention, as AITER's MXFP6), and a block holding an Inf stores 127 with every code 0
    (a real defect: the Inf is lost)."""

    name = "zero-127-and-inf-block-127"

    def quantize(self, x, spec, **kw):
        return super().quantize(x, replace(spec, zero_scale=127) if spec.scaling == "mx" else spec, **kw)


TWO_BUGS = "tests.conformance.test_search:_ZeroBlock127AndInfBlock127"
INF_CAUSES = ("inf_block_byte_127",)  # the NaN among the broader inputs tells it from special_zeroes_block


def _two_bug_search(recipe: str = "mxfp8", **kw):
    return search(_ZeroBlock127AndInfBlock127, recipe, seconds=LONG, properties=["quantize"], max_examples=120, **kw)


def test_a_known_behaviour_is_not_reported_and_the_search_finds_the_other_bug():
    result = _two_bug_search(known=["mx.zero_scale=127"])
    assert [f.cause.key in INF_CAUSES for f in result.findings] == [True], [f.cause for f in result.findings]


def test_a_named_known_behaviour_that_does_not_exist_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys, "search", "--backend", "emulated", "--recipe", "mxfp8", "--known",
                           "mx.zero_scale=1270")
    assert code == 2 and "'mx.zero_scale=1270' is not a quantize behaviour" in err and "mx.zero_scale=127" in err, err


def test_the_search_help_states_the_time_once(capsys):
    from mxcheck.cli.main import build_parser

    text = " ".join(build_parser()._subparsers._group_actions[0].choices["search"].format_help().split())
    assert "search time per recipe" in text and "split" not in text, text


def test_conform_search_takes_a_recipe_file_and_a_missing_one_is_a_usage_error_before_the_suite(tmp_path, capsys,
                                                                                                 monkeypatch):
    from mxcheck.recipes import RECIPES

    suite = _SuitePassed()
    monkeypatch.setattr(pytest, "main", suite)
    code, _, err = run_cli(capsys, "conform", "--backend", "emulated", "--recipe", tmp_path / "absent.yaml",
                           "--search", "1")
    assert code == 2 and "absent.yaml" in err and suite.argv is None, err
    from mxcheck.cli.fit import write_recipe

    path = tmp_path / "mine.yaml"
    write_recipe(path, RECIPES["mxfp8"], [])
    code, out, _ = run_cli(capsys, "conform", "--backend", "mxcheck.backends.known_bad:TruncForRne", "--recipe", path,
                           "--search", "2", "--properties", "quantize", "--out", tmp_path)
    assert suite.argv is not None and code == 1, out
    assert "recipe mxfp8.fitted" in out and "reproducer: python" in out, out


def test_a_known_behaviour_that_reaches_further_than_the_kernel_makes_no_finding():
    """special_zeroes_block zeroes NaN blocks too; a kernel that zeroes only Inf blocks keeps
    the oracle's NaN byte there, which the contract accepts: no finding."""
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([1.0, float("nan"), 2.0, 3.0])
    backend = KNOWN_BAD["bad-inf-block-127"]()
    assert judge("quantize", backend, "mxfp8", {"x": x}) is None  # the premise: the kernel follows the contract
    assert judge("quantize", backend, "mxfp8", {"x": x}, known=["special_zeroes_block"]) is None
    x[0, 1] = float("inf")  # an Inf block: the kernel stores 127, the known behaviour zeroes it as well
    assert judge("quantize", backend, "mxfp8", {"x": x}, known=["special_zeroes_block"]) is not None
