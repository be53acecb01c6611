"""The pytest plugin, driven through pytester: markers, skips, backends, reports, baselines."""

from __future__ import annotations

import json

import pytest

from mxcheck import hardware

pytestmark = pytest.mark.emulated

MARKED = """
import pytest

@pytest.mark.emulated
def test_emulated(): pass

@pytest.mark.cuda
def test_cuda(): pass

@pytest.mark.sm90
def test_sm90(): pass

@pytest.mark.gfx950
def test_gfx950(): pass
"""

NUMERIC = """
import pytest, torch

@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_snr(numerics, k, mxcheck_generator):
    ref = torch.randn(256, generator=mxcheck_generator).double()
    test = ref + 0.01 * k * torch.randn(256, generator=mxcheck_generator).double()
    numerics.context(recipe="mxfp4", layer=f"layer{k}", direction="fwd", m=k, n=2, k=3).snr(test, ref, 20.0)

@pytest.mark.gfx950
def test_needs_gfx950(): pass
"""


@pytest.fixture
def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hardware.FAKE_HARDWARE_ENV, "cpu")


def test_markers_are_registered_with_their_help(pytester: pytest.Pytester):
    result = pytester.runpytest("--markers")
    for name in hardware.MARKERS:
        result.stdout.fnmatch_lines([f"@pytest.mark.{name}: *"])


def test_unregistered_marker_fails_under_strict_markers(pytester: pytest.Pytester):
    pytester.makepyfile("import pytest\n@pytest.mark.gfx9500\ndef test_typo(): pass\n")
    result = pytester.runpytest("--strict-markers")
    result.stdout.fnmatch_lines(["*'gfx9500' not found in `markers` configuration option*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_hardware_markers_skip_naming_what_is_missing(pytester: pytest.Pytester, cpu_only):
    pytester.makepyfile(MARKED)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=3)
    result.stdout.fnmatch_lines([
        "SKIPPED * test_hardware_markers_skip_naming_what_is_missing.py:*: cuda: needs an NVIDIA CUDA GPU; "
        "this machine has cpu only*",
        "*gfx950: needs an AMD MI355X (gfx950) GPU; this machine has cpu only*",
    ])


@pytest.mark.parametrize(("fake", "runs"), [
    ("gfx950", {"test_emulated", "test_gfx950"}),
    ("sm90:2", {"test_emulated", "test_cuda", "test_sm90"}),
    ("sm100", {"test_emulated", "test_cuda"}),
])
def test_hardware_markers_run_where_the_hardware_is(pytester, monkeypatch, fake, runs):
    monkeypatch.setenv(hardware.FAKE_HARDWARE_ENV, fake)
    pytester.makepyfile(MARKED)
    result = pytester.runpytest("-v")
    passed = {line.split("::")[1].split()[0] for line in result.outlines if "PASSED" in line}
    assert passed == runs
    result.assert_outcomes(passed=len(runs), skipped=4 - len(runs))


def test_records_from_two_workers_merge_into_one_report_identical_to_a_serial_run(pytester, cpu_only):
    pytester.makepyfile(NUMERIC)
    serial = pytester.path / "serial.json"
    parallel = pytester.path / "parallel.json"
    pytester.runpytest_subprocess("--mxcheck-report", str(serial)).assert_outcomes(passed=4, skipped=1)
    result = pytester.runpytest_subprocess("-n", "2", "--mxcheck-report", str(parallel))
    result.assert_outcomes(passed=4, skipped=1)
    data = json.loads(parallel.read_text())
    assert sorted(r["layer"] for r in data["records"]) == ["layer1", "layer2", "layer3", "layer4"]
    assert {r["recipe"] for r in data["records"]} == {"mxfp4"}
    assert data["skipped"][0]["reason"].startswith("gfx950: needs an AMD MI355X")
    assert parallel.read_bytes() == serial.read_bytes()


def test_a_baseline_with_higher_snr_fails_the_run(pytester, cpu_only):
    pytester.makepyfile(NUMERIC)
    base = pytester.path / "base.json"
    pytester.runpytest_subprocess("--mxcheck-report", str(base)).assert_outcomes(passed=4, skipped=1)
    same = pytester.runpytest_subprocess("--mxcheck-baseline", str(base))
    assert same.ret == pytest.ExitCode.OK
    data = json.loads(base.read_text())
    data["records"][2]["snr_db"] += 0.8  # the baseline was better: this run dropped 0.8 dB
    base.write_text(json.dumps(data))
    worse = pytester.runpytest_subprocess("--mxcheck-baseline", str(base), "--mxcheck-max-drop-db", "0.5")
    assert worse.ret == pytest.ExitCode.TESTS_FAILED
    worse.stdout.fnmatch_lines(["*mxcheck*", "*layer3*"])
    lenient = pytester.runpytest_subprocess("--mxcheck-baseline", str(base), "--mxcheck-max-drop-db", "1.0")
    assert lenient.ret == pytest.ExitCode.OK


EXTERNAL_BACKEND = """
class Mine:
    name = "mine"
    def available(self):
        return True, ""
    def supports(self, recipe):
        return True, ""

class Absent(Mine):
    name = "absent"
    def available(self):
        return False, "libmine.so not found"

def make():
    return Mine()
"""


def test_external_backend_loads_from_module_and_factory(pytester, cpu_only):
    pytester.makepyfile(mybackend=EXTERNAL_BACKEND)
    pytester.makepyfile(test_it="def test_backend(backend):\n    assert backend.name == 'mine'\n")
    pytester.syspathinsert()
    result = pytester.runpytest("--mxcheck-backend", "mybackend:make", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_backend[[]mine[]] PASSED*"])


def test_unavailable_backend_skips_with_its_reason(pytester, cpu_only):
    pytester.makepyfile(mybackend=EXTERNAL_BACKEND)
    pytester.makepyfile(test_it="def test_backend(backend):\n    pass\n")
    pytester.syspathinsert()
    result = pytester.runpytest("--mxcheck-backend", "mybackend:Absent", "--mxcheck-backend", "emulated", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*backend absent: libmine.so not found*"])


@pytest.mark.parametrize(("args", "message"), [
    (["--mxcheck-backend", "nosuch.module:make"], "*--mxcheck-backend*cannot import 'nosuch.module'*"),
    (["--mxcheck-backend", "nonsense"], "*--mxcheck-backend*expected a registered name*"),
    (["--mxcheck-max-drop-db", "-1"], "*--mxcheck-max-drop-db*max-drop-db must be >= 0, got -1.0*"),
    (["--mxcheck-seed", "x1"], "*--mxcheck-seed*expected an integer seed, got 'x1'*"),
    (["--mxcheck-deterministic-only", "1"], "*--mxcheck-deterministic-only*at least 2 runs*"),
])
def test_bad_option_values_are_usage_errors_naming_the_value(pytester, args, message):
    pytester.makepyfile("def test_x(): pass\n")
    result = pytester.runpytest(*args)
    assert result.ret in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERRUPTED)
    result.stderr.fnmatch_lines([message])


def test_help_lists_the_options_with_defaults(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["mxcheck numerics checks:", "*--mxcheck-max-drop-db=DB*", "*Default: 0.5*"])


DETERMINISM = """
import torch

def test_pure(numerics):
    x = torch.arange(64, dtype=torch.float64)
    numerics.snr(x * 1.001, x, 20.0)

def test_noisy(numerics):
    x = torch.arange(64, dtype=torch.float64)
    numerics.snr(x + 0.01 * torch.rand(64, dtype=torch.float64), x, 20.0)

def test_no_numerics():
    pass
"""


def test_deterministic_only_repeats_numeric_tests_and_fails_the_nondeterministic(pytester, cpu_only):
    pytester.makepyfile(DETERMINISM)
    result = pytester.runpytest("--mxcheck-deterministic-only", "3")
    result.assert_outcomes(passed=1, failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*NumericsError: not deterministic: run 2 of 3: snr check*differs*"])


def test_pin_worker_gives_each_xdist_worker_one_gpu():
    eight = hardware.Hardware("amd", "gfx950", "fake", 8)
    assert hardware.pin_worker("gw9", eight, {}) == {"HIP_VISIBLE_DEVICES": "1"}
    nvidia = hardware.Hardware("nvidia", "sm90", "fake", 2)
    assert hardware.pin_worker("gw3", nvidia, {}) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert hardware.pin_worker("gw3", nvidia, {"CUDA_VISIBLE_DEVICES": "0"}) == {}
    assert hardware.pin_worker("gw3", hardware.Hardware("nvidia", "sm90", "fake", 1), {}) == {}


def test_xdist_workers_see_their_pinned_device(pytester, monkeypatch):
    monkeypatch.setenv(hardware.FAKE_HARDWARE_ENV, "sm90:2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makepyfile("""
import os, pytest
@pytest.mark.parametrize("i", range(4))
def test_env(i):
    worker = os.environ["PYTEST_XDIST_WORKER"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == str(int(worker[2:]) % 2)
""")
    result = pytester.runpytest_subprocess("-n", "2")
    result.assert_outcomes(passed=4)


def test_fake_hardware_spec_is_validated(monkeypatch):
    monkeypatch.setenv(hardware.FAKE_HARDWARE_ENV, "h200")
    with pytest.raises(ValueError, match="MXCHECK_FAKE_HARDWARE='h200'; expected cpu, smNN or gfxNNN"):
        hardware.detect()


def test_deterministic_only_restores_the_generator_before_each_run(pytester, cpu_only):
    pytester.makepyfile("""
import torch

def test_uses_generator(numerics, mxcheck_generator):
    x = torch.randn(64, generator=mxcheck_generator, dtype=torch.float64)
    numerics.snr(x * 1.001, x, 20.0)
""")
    pytester.runpytest("--mxcheck-deterministic-only", "3").assert_outcomes(passed=1)


def test_a_failure_outside_a_recorded_check_still_counts_as_failed_in_the_report(pytester, cpu_only):
    pytester.makepyfile("""
def test_raises():
    raise AssertionError("gemm outside the fp32-accumulation bound")

def test_passes():
    pass
""")
    path = pytester.path / "r.json"
    pytester.runpytest("--mxcheck-report", str(path)).assert_outcomes(passed=1, failed=1)
    records = json.loads(path.read_text())["records"]
    assert [(r["kind"], r["passed"]) for r in records] == [("test", False)]
    assert "gemm outside the fp32-accumulation bound" in records[0]["message"]


@pytest.mark.parametrize("workers", [[], ["-n", "2", "-p", "xdist"]], ids=["serial", "xdist"])
def test_a_failed_parametrized_test_is_filed_under_its_backend_and_recipe(pytester, cpu_only, workers):
    # Under xdist the controller collects nothing: the params must travel on the report.
    pytester.makepyfile("""
import pytest

@pytest.mark.parametrize("recipe", ["mxfp4"])
def test_raises(backend, recipe):
    raise AssertionError("outside the bound")
""")
    path = pytester.path / "r.json"
    pytester.runpytest(*workers, "--mxcheck-report", str(path)).assert_outcomes(failed=1)
    (record,) = json.loads(path.read_text())["records"]
    assert (record["backend"], record["recipe"], record["kind"]) == ("emulated", "mxfp4", "test")


DRIFT = """
import pytest

def test_drifted():
    pytest.xfail("witness drift: ml_dtypes 0.8.0 gives 0x00 for the e8m0 cast of 1.25*2^-127; "
                 "pinned 0x01 for ml_dtypes>=0.7 (observed on 0.6.0, 0.7.0)")

def test_other_xfail():
    pytest.xfail("a known bug, not a witness")

def test_passes():
    pass
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2", "-p", "xdist"]], ids=["serial", "xdist"])
def test_a_witness_drift_xfail_is_counted_and_reported(pytester, cpu_only, workers):
    # tests/_witness.py xfails a test whose witness, newer than its pins, answers otherwise;
    # the run stays green and the drift is counted, named and written to the report.
    pytester.makepyfile(DRIFT)
    path = pytester.path / "r.json"
    result = pytester.runpytest(*workers, "--mxcheck-report", str(path))
    result.assert_outcomes(passed=1, xfailed=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "*0 numeric checks, 0 failed, 0 tests skipped on this hardware, 1 witness drifts",
        "test_a_witness_drift_xfail_is_counted_and_reported.py::test_drifted: witness drift: "
        "ml_dtypes 0.8.0 gives 0x00 *pinned 0x01 for ml_dtypes>=0.7 (observed on 0.6.0, 0.7.0)",
    ])
    data = json.loads(path.read_text())
    assert data["witness_drifts"] == [{
        "test_id": "test_a_witness_drift_xfail_is_counted_and_reported.py::test_drifted",
        "reason": "witness drift: ml_dtypes 0.8.0 gives 0x00 for the e8m0 cast of 1.25*2^-127; "
                  "pinned 0x01 for ml_dtypes>=0.7 (observed on 0.6.0, 0.7.0)"}]
    assert data["skipped"] == [] and data["records"] == []
