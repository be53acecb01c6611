"""The pytest plugin, driven through pytester: markers, skips, backends, reports, baselines."""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings

import pytest

from mxcheck import backends, hardware
from mxcheck.plugin import REQUIRE_DEPS_ENV, needs

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


def test_a_baseline_with_higher_snr_fails_the_run(pytester, cpu_only):
    pytester.makepyfile(NUMERIC)
    base = pytester.path / "base.json"
    pytester.runpytest("--mxcheck-report", str(base)).assert_outcomes(passed=4, skipped=1)
    same = pytester.runpytest("--mxcheck-baseline", str(base))
    assert same.ret == pytest.ExitCode.OK
    data = json.loads(base.read_text())
    data["records"][2]["snr_db"] += 0.8  # the baseline was better: this run dropped 0.8 dB
    base.write_text(json.dumps(data))
    worse = pytester.runpytest("--mxcheck-baseline", str(base), "--mxcheck-max-drop-db", "0.5")
    assert worse.ret == pytest.ExitCode.TESTS_FAILED
    worse.stdout.fnmatch_lines(["*mxcheck*", "*layer3*"])
    lenient = pytester.runpytest("--mxcheck-baseline", str(base), "--mxcheck-max-drop-db", "1.0")
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


FAILED_PARAMETRIZED = """
import pytest

@pytest.mark.parametrize("recipe", ["mxfp4"])
def test_raises(backend, recipe):
    raise AssertionError("outside the bound")
"""


def test_a_failed_parametrized_test_is_filed_under_its_backend_and_recipe(pytester, cpu_only):
    # Under xdist the controller collects nothing: the params must travel on the report
    # (test_an_xdist_run_reports_what_a_serial_run_reports runs this file under xdist).
    pytester.makepyfile(FAILED_PARAMETRIZED)
    path = pytester.path / "r.json"
    pytester.runpytest("--mxcheck-report", str(path)).assert_outcomes(failed=1)
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


def test_a_witness_drift_xfail_is_counted_and_reported(pytester, cpu_only):
    # tests/_witness.py xfails a test whose witness, newer than its pins, answers otherwise;
    # the run stays green and the drift is counted, named and written to the report.
    pytester.makepyfile(DRIFT)
    path = pytester.path / "r.json"
    result = pytester.runpytest("--mxcheck-report", str(path))
    result.assert_outcomes(passed=1, xfailed=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "*0 numeric checks, 0 failed, 1 witness drifts",
        "test_a_witness_drift_xfail_is_counted_and_reported.py::test_drifted: witness drift: "
        "ml_dtypes 0.8.0 gives 0x00 *pinned 0x01 for ml_dtypes>=0.7 (observed on 0.6.0, 0.7.0)",
    ])
    data = json.loads(path.read_text())
    assert data["witness_drifts"] == [{
        "test_id": "test_a_witness_drift_xfail_is_counted_and_reported.py::test_drifted",
        "reason": "witness drift: ml_dtypes 0.8.0 gives 0x00 for the e8m0 cast of 1.25*2^-127; "
                  "pinned 0x01 for ml_dtypes>=0.7 (observed on 0.6.0, 0.7.0)"}]
    assert data["skipped"] == [] and data["records"] == []


# ---- foreign warnings and optional packages ------------------------------------------------
# These runs take the warning filters this repository runs with (pyproject.toml), so they
# check the filters as configured, and contrast them with the bare "error" they replaced.

OLD_FILTERS = ["error"]


def use_filters(pytester: pytest.Pytester, filters: list[str]) -> None:
    pytester.makeini("[pytest]\nfilterwarnings =\n" + "".join(f"    {f}\n" for f in filters))


@pytest.fixture
def our_filters(request: pytest.FixtureRequest) -> list[str]:
    filters = list(request.config.getini("filterwarnings"))
    assert "error" not in filters, filters  # a bare "error" escalates every package's warnings
    return filters


NOISY_PLUGIN = """
import warnings

import pytest


class NoisyWarning(pytest.PytestWarning):
    pass


def pytest_configure(config):
    # pytest-benchmark 5.1 under xdist: a plain warnings.warn from its configure hook.
    warnings.warn(NoisyWarning("benchmarks are disabled under xdist"))


def pytest_unconfigure(config):
    # pytest-benchmark 5.3 says it again at unconfigure.
    warnings.warn(NoisyWarning("benchmarks were disabled under xdist"))
"""


def test_a_plugin_that_warns_at_configure_breaks_a_bare_error_run(pytester, cpu_only):
    """What a stock NVIDIA image with pytest-benchmark got under a bare "error": no test ran at
    all. Under our filters the same plugin's notice is shown and the run goes on (the
    third-party test below loads it)."""
    use_filters(pytester, OLD_FILTERS)
    pytester.makepyfile(noisy=NOISY_PLUGIN, test_it="def test_runs(): pass\n")
    result = pytester.runpytest_subprocess("-p", "noisy")  # its stderr: where the notice goes
    assert result.ret != pytest.ExitCode.OK and "collected" not in result.stdout.str()
    # raised, not shown: as INTERNALERROR lines (pytest 9.2) or a bare traceback (9.1)
    result.stderr.fnmatch_lines(["*NoisyWarning: benchmarks are disabled*"])
    assert "INTERNALERROR" in result.stderr.str() or "Traceback" in result.stderr.str()


THIRD_PARTY = """
import warnings

warnings.warn("thirdparty: import-time notice", DeprecationWarning)


def old_api():
    # As torch.jit.script_method on torch 2.11: attributed to the library itself.
    warnings.warn("old_api is deprecated", DeprecationWarning)
    return 1


def old_argument():
    # The usual deprecation idiom: attributed to the caller's line.
    warnings.warn("pass new= instead", DeprecationWarning, stacklevel=2)
    return 2


def notice():
    warnings.warn("found JAX without its extension", RuntimeWarning)
    return 3
"""

USES_THIRD_PARTY = """
import types
import warnings

import thirdparty


def test_third_party_deprecations():
    assert thirdparty.old_api() + thirdparty.old_argument() == 3


def test_third_party_runtime_warning():
    assert thirdparty.notice() == 3


def test_a_warning_from_the_tests_fails():
    warnings.warn("the test's own warning", UserWarning)


def test_a_warning_from_mxcheck_code_fails():
    # A stand-in for a function of mxcheck: a warning is attributed by its module's name.
    code = types.ModuleType("mxcheck._stand_in")
    exec("import warnings\\ndef f():\\n    warnings.warn('mxcheck says so', RuntimeWarning)\\n",
         vars(code))
    code.f()
"""


def test_third_party_warnings_are_shown_and_ours_fail(pytester, cpu_only, our_filters, monkeypatch):
    """One subprocess run under our filters (one pytest process fewer than a run each): a
    plugin's warning at configure and the third-party warnings are shown, the run goes on,
    and warnings from the tests and from mxcheck fail their tests."""
    # A CI system's PYTHONWARNINGS=ignore would reach the subprocess and hide the warnings
    # this test is about: the run under test gets the project's filters alone.
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    use_filters(pytester, our_filters)
    pytester.makepyfile(noisy=NOISY_PLUGIN, thirdparty=THIRD_PARTY)
    pytester.mkpydir("tests")  # as in this repository: test modules are tests.test_*
    (pytester.path / "tests" / "test_uses.py").write_text(USES_THIRD_PARTY)
    pytester.syspathinsert()
    result = pytester.runpytest_subprocess("-rA", "-p", "noisy")  # its stderr: where the notice goes
    result.assert_outcomes(passed=2, failed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # failed tests, not an internal error
    assert "NoisyWarning: benchmarks are disabled under xdist" in result.stderr.str()
    result.stdout.fnmatch_lines([
        "*_ test_a_warning_from_the_tests_fails _*", "E * UserWarning: the test's own warning",
        "*_ test_a_warning_from_mxcheck_code_fails _*", "E * RuntimeWarning: mxcheck says so",
        "*warnings summary*", "*DeprecationWarning: thirdparty: import-time notice",
        "*DeprecationWarning: old_api is deprecated", "*DeprecationWarning: pass new= instead",
        "*RuntimeWarning: found JAX without its extension",
        "PASSED tests/test_uses.py::test_third_party_deprecations",
        "PASSED tests/test_uses.py::test_third_party_runtime_warning",
    ])


PINNED = """
import os, pytest
@pytest.mark.parametrize("i", range(4))
def test_env(i):
    worker = os.environ["PYTEST_XDIST_WORKER"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == str(int(worker[2:]) % 2)
"""


def test_xdist_workers_see_their_pinned_device_and_pytest_benchmark_does_not_break_the_run(
        pytester, monkeypatch, our_filters):
    """One xdist run (each worker starts torch) for two things about xdist workers:
    - each worker of a faked 2-GPU host sees the GPU pin_worker gave it;
    - pytest-benchmark before 5.3 warns "disabled under xdist" from its configure hook
      whenever xdist runs (5.3 only at unconfigure of a worker that ran a benchmark): under a
      bare "error" filter that was an INTERNALERROR before any test ran."""
    monkeypatch.setenv(hardware.FAKE_HARDWARE_ENV, "sm90:2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    use_filters(pytester, our_filters)
    pytester.makepyfile(PINNED)
    # The stock NVIDIA runner image has pytest-benchmark; without it the pins alone are checked.
    benchmark = ["-p", "pytest_benchmark"] if importlib.util.find_spec("pytest_benchmark") else []
    result = pytester.runpytest_subprocess("-n", "2", "-p", "xdist", *benchmark)
    result.assert_outcomes(passed=4)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """Make a package importable from tmp_path in place of any real one of that name."""
    made = []

    def make(name: str, files: dict[str, str]) -> None:
        for rel, text in files.items():
            path = tmp_path / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        for key in [k for k in sys.modules if k.split(".")[0] == name]:
            monkeypatch.delitem(sys.modules, key)  # a real one comes back afterwards
        monkeypatch.syspath_prepend(str(tmp_path))
        made.append(name)

    yield make
    for key in [k for k in sys.modules if k.split(".")[0] in made]:
        del sys.modules[key]


# TransformerEngine 2.x on an image that also has JAX (transformer_engine/common/__init__.py).
TE_JAX_NOTICE = ("Detected a Jax installation but could not find the shared object file for "
                 "the Transformer Engine Jax extension library.")


@pytest.mark.parametrize("stacklevel", [1, 2], ids=["from-vendor", "from-importer"])
@pytest.mark.parametrize(("name", "package", "fake_hw"), [
    ("transformer_engine", "transformer_engine", "sm90"),
    ("aiter", "aiter", "gfx950"),
    ("primus_turbo", "primus_turbo", "gfx950"),
])
def test_a_vendor_that_warns_at_import_is_available(fake_package, monkeypatch, name, package,
                                                    fake_hw, stacklevel):
    fake_package(package, {
        "__init__.py": f"import warnings\nwarnings.warn({TE_JAX_NOTICE!r}, RuntimeWarning, "
                       f"stacklevel={stacklevel})\n",
        "pytorch/__init__.py": "",  # what the TransformerEngine adapter imports
    })
    monkeypatch.setenv(hardware.FAKE_HARDWARE_ENV, fake_hw)
    with pytest.warns(RuntimeWarning, match="Detected a Jax installation"):  # shown, not hidden
        warnings.simplefilter("error")  # as under `filterwarnings = error` or `python -W error`
        got = backends.get(name).available()
    assert got == (True, "")


def test_a_vendor_that_raises_at_import_is_unavailable_naming_the_error(fake_package, monkeypatch):
    fake_package("transformer_engine", {
        "__init__.py": "raise RuntimeError('libtransformer_engine.so: cannot open shared object')\n",
    })
    monkeypatch.setenv(hardware.FAKE_HARDWARE_ENV, "sm90")
    assert backends.get("transformer_engine").available() == (
        False, "transformer_engine.pytorch not importable (RuntimeError: "
               "libtransformer_engine.so: cannot open shared object)")


NEEDS_ABSENT = """
import pytest

from mxcheck.plugin import needs

with needs("mxcheck_absent_witness"):
    import mxcheck_absent_witness


def test_compares_with_the_witness():
    assert mxcheck_absent_witness
"""

NEEDS_IN_A_TEST = """
import pytest

from mxcheck.plugin import needs


def test_needs_it_inside():
    with needs("mxcheck_absent_plots"):
        from mxcheck_absent_plots import figure


def test_a_broken_dependency_is_not_a_skip():
    with needs("json"):  # json is here; what it would import is not one of the names given
        import mxcheck_absent_helper


def test_runs():
    pass
"""


def test_a_missing_test_dependency_skips_naming_it_and_is_listed(pytester, cpu_only, monkeypatch):
    monkeypatch.delenv(REQUIRE_DEPS_ENV, raising=False)  # set when this run itself is strict
    pytester.makepyfile(test_module=NEEDS_ABSENT, test_inside=NEEDS_IN_A_TEST)
    path = pytester.path / "r.json"
    result = pytester.runpytest("--mxcheck-report", str(path), "-rs")
    result.assert_outcomes(passed=1, failed=1, skipped=2)
    result.stdout.fnmatch_lines([
        "*ModuleNotFoundError: No module named 'mxcheck_absent_helper'",
        "missing packages (their tests skipped): mxcheck_absent_plots, mxcheck_absent_witness",
        "SKIPPED [[]1[]] test_module.py:5: missing package mxcheck_absent_witness (No module "
        "named 'mxcheck_absent_witness'); pip install -e '.[[]test[]]'",
    ])
    skipped = json.loads(path.read_text())["skipped"]
    assert [(s["test_id"], s["reason"].split(" (")[0]) for s in skipped] == [
        ("test_inside.py::test_needs_it_inside", "missing package mxcheck_absent_plots"),
        ("test_module.py", "missing package mxcheck_absent_witness")]


def test_an_xdist_run_reports_what_a_serial_run_reports(pytester, cpu_only, monkeypatch):
    """Records from two workers merge into one report byte-identical to a serial run's: SNR
    records, a failed parametrized test's backend and recipe (the controller collects
    nothing, so they travel on the test's report), witness drifts, and skips at import and
    inside a test (a module skipped at import is listed once, not once per worker). One
    xdist run checks what the tests above check serially: each xdist worker starts torch."""
    monkeypatch.delenv(REQUIRE_DEPS_ENV, raising=False)  # set when this run itself is strict
    pytester.makepyfile(test_numeric=NUMERIC, test_failed=FAILED_PARAMETRIZED, test_drift=DRIFT,
                        test_module=NEEDS_ABSENT, test_inside=NEEDS_IN_A_TEST)
    serial, parallel = pytester.path / "serial.json", pytester.path / "parallel.json"
    outcomes = {"passed": 6, "failed": 2, "skipped": 3, "xfailed": 2}
    pytester.runpytest("--mxcheck-report", str(serial)).assert_outcomes(**outcomes)
    result = pytester.runpytest("-n", "2", "-p", "xdist", "--mxcheck-report", str(parallel))
    result.assert_outcomes(**outcomes)
    assert parallel.read_bytes() == serial.read_bytes()
    data = json.loads(parallel.read_text())
    records = {}
    for r in data["records"]:
        records.setdefault(r["test_id"].split("::")[0], []).append(r)
    assert sorted(r["layer"] for r in records["test_numeric.py"]) == ["layer1", "layer2", "layer3", "layer4"]
    assert {r["recipe"] for r in records["test_numeric.py"]} == {"mxfp4"}
    (failed,) = records["test_failed.py"]
    assert (failed["backend"], failed["recipe"], failed["kind"]) == ("emulated", "mxfp4", "test")
    assert [(s["test_id"], s["reason"].split(" (")[0]) for s in data["skipped"]] == [
        ("test_inside.py::test_needs_it_inside", "missing package mxcheck_absent_plots"),
        ("test_module.py", "missing package mxcheck_absent_witness"),
        ("test_numeric.py::test_needs_gfx950", "gfx950: needs an AMD MI355X")]
    assert [d["test_id"] for d in data["witness_drifts"]] == ["test_drift.py::test_drifted"]
    result.stdout.fnmatch_lines([
        "*6 numeric checks, 2 failed, 1 witness drifts",
        "3 tests skipped: 1 not runnable here, 2 other",
        "test_drift.py::test_drifted: witness drift: ml_dtypes 0.8.0 gives 0x00 *",
        "missing packages (their tests skipped): mxcheck_absent_plots, mxcheck_absent_witness",
    ])


@pytest.mark.parametrize("how", ["option", "env"])
def test_require_deps_fails_where_a_test_dependency_is_missing(pytester, cpu_only, monkeypatch, how):
    pytester.makepyfile(test_module=NEEDS_ABSENT, test_inside=NEEDS_IN_A_TEST)
    monkeypatch.delenv(REQUIRE_DEPS_ENV, raising=False)  # set when this run itself is strict
    if how == "env":
        monkeypatch.setenv(REQUIRE_DEPS_ENV, "1")
    result = pytester.runpytest(*(["--mxcheck-require-deps"] if how == "option" else []),
                                           "--continue-on-collection-errors")
    result.assert_outcomes(passed=1, failed=2, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR collecting test_module.py*",
        "missing package mxcheck_absent_witness (No module named 'mxcheck_absent_witness'); pip "
        "install -e '.[[]test[]]'. --mxcheck-require-deps (MXCHECK_REQUIRE_DEPS=1): a declared test "
        "dependency must be installed",
        "_* test_needs_it_inside _*",
        "missing package mxcheck_absent_plots (No module named 'mxcheck_absent_plots'); pip install*",
    ])


@pytest.mark.parametrize("bad", [(), ("",), ("torchao.float8",), (3,)])
def test_needs_takes_top_level_package_names(bad):
    with pytest.raises(ValueError, match=r"needs.*expected one or more top-level package names"):
        with needs(*bad):
            pass


def test_seeded_only_keeps_the_tests_the_seed_changes(pytester, cpu_only):
    pytester.makepyfile("""
import pytest

def test_draws(mxcheck_generator):
    pass

def test_reads_the_seed(mxcheck_seed):
    pass

def test_fixed():
    pass
""")
    result = pytester.runpytest("--mxcheck-seeded-only", "-v")
    result.assert_outcomes(passed=2, deselected=1)
    result.stdout.fnmatch_lines(["*test_draws PASSED*", "*test_reads_the_seed PASSED*"])
