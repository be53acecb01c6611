"""Outcome records (failed, errored, crashed, timed out), their counts in every headline,
and reports of runs that did not finish: stored, refused as baselines, their gaps "not run"."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from mxcheck.report import Record, Report, ReportError, compare, compare_files, format_comparison
from mxcheck.report.markdown import summary_text
from mxcheck.report.outcomes import OUTCOME_KEY, PARAMS_KEY, counts_text, outcome_record
from mxcheck.run_guard import innermost_frame, parse_timeout, thread_of_test

pytestmark = pytest.mark.emulated


def check(layer: str, passed: bool = True, snr: float = 30.0) -> Record:
    return Record(test_id="t.py::test_x", backend="emulated", recipe="mxfp4", layer=layer,
                  direction="fwd", snr_db=snr, threshold_db=20.0, passed=passed)


def fake_report(when: str = "call", outcome: str = "failed", props: list | None = None) -> SimpleNamespace:
    crash = SimpleNamespace(message="ValueError: bad shape\nmore lines")
    return SimpleNamespace(nodeid="t.py::test_x[emulated-mxfp6]", when=when, failed=outcome == "failed",
                           longrepr=SimpleNamespace(reprcrash=crash),
                           user_properties=props or [(PARAMS_KEY, ["emulated", "mxfp6"])])


@pytest.mark.parametrize(("when", "outcome", "kind"), [
    ("setup", "errored", "setup"), ("teardown", "errored", "teardown"), ("call", "failed", "test"),
    ("???", "crashed", "test"),  # xdist's report of a crashed worker's test
])
def test_a_test_that_failed_outside_a_check_is_a_record_of_its_outcome(when, outcome, kind):
    r = outcome_record(fake_report(when), [check("a")])
    assert (r.extra["outcome"], r.kind) == (outcome, kind)
    assert (r.backend, r.recipe, r.passed, r.message) == ("emulated", "mxfp6", False, "ValueError: bad shape")
    assert r.extra["when"] == when


def test_no_outcome_record_for_a_pass_or_a_call_that_failed_on_a_recorded_check():
    assert outcome_record(fake_report(outcome="passed"), []) is None
    assert outcome_record(fake_report(), [check("a"), check("b", passed=False)]) is None


def test_the_run_guards_details_name_the_outcome_and_travel_into_the_record():
    details = {"outcome": "timed_out", "timeout_s": 2.0, "stack": "File x", "message": "timed out"}
    r = outcome_record(fake_report("???", props=[(OUTCOME_KEY, details)]), [])
    assert (r.extra["outcome"], r.extra["timeout_s"], r.message) == ("timed_out", 2.0, "timed out")
    assert (r.backend, r.recipe) == ("n/a", "n/a")  # no parameters known: filed under n/a


def outcome(name: str, i: int) -> Record:
    return Record(test_id=f"t.py::test_{name}{i}", backend="emulated", recipe="mxfp4", kind="test",
                  passed=False, message=name, extra={"outcome": name})


def test_counts_keep_failed_errored_crashed_and_timed_out_apart():
    records = [check("a"), check("b", passed=False), outcome("errored", 0), outcome("crashed", 0),
               outcome("crashed", 1), outcome("timed_out", 0), outcome("failed", 0)]
    assert counts_text(records) == "3 checks, 2 failed, 1 errored, 2 crashed, 1 timed out"
    assert counts_text([check("a")]) == "1 checks, 0 failed"


def test_a_headline_never_reads_green_over_a_crash_an_unfinished_run_or_a_failed_exit():
    crashed = Report(records=[check("a"), outcome("crashed", 0)], exit_status=1)
    assert summary_text(crashed).startswith("1 checks, 0 failed, 1 crashed, 0 skipped")
    cut = Report(records=[check("a")], complete=False, incomplete_reason="SIGTERM received after 1 of 9 tests")
    assert summary_text(cut).startswith("INCOMPLETE (SIGTERM received after 1 of 9 tests): 1 checks")
    collection_error = Report(records=[check("a")], exit_status=2)
    assert summary_text(collection_error).startswith("pytest exit status 2: 1 checks, 0 failed")
    assert not summary_text(Report(records=[check("a")], exit_status=0)).startswith(("INCOMPLETE", "pytest"))


def test_an_incomplete_report_round_trips_and_a_complete_one_is_written_as_before(tmp_path: Path):
    cut = Report(records=[check("a")], complete=False, incomplete_reason="SIGINT received", exit_status=2)
    cut.save(tmp_path / "cut.json")
    data = json.loads((tmp_path / "cut.json").read_text())
    assert (data["complete"], data["incomplete_reason"], data["exit_status"]) == (False, "SIGINT received", 2)
    back = Report.load(tmp_path / "cut.json")
    assert (back.complete, back.incomplete_reason, back.exit_status) == (False, "SIGINT received", 2)
    assert "complete" not in Report(records=[check("a")]).to_json()
    assert not Report.merge([Report(), cut]).complete


def test_a_bad_complete_value_is_refused_naming_it():
    with pytest.raises(ReportError, match=r"complete='no'; expected true/false"):
        Report.loads(json.dumps({"version": 1, "complete": "no"}))


def test_checks_the_base_has_and_the_new_report_lacks_read_not_run():
    base, new = Report(records=[check("a"), check("b")]), Report(records=[check("a")])
    text = format_comparison(compare(base, new))
    assert "0 added, 1 not run, 1 unchanged" in text
    assert "Not run (in the base, missing from this report) (1):\n  mxfp4/emulated fwd b" in text


def test_compare_refuses_an_incomplete_base_unless_allowed(tmp_path: Path):
    Report(records=[check("a")], complete=False, incomplete_reason="SIGTERM received").save(tmp_path / "b.json")
    Report(records=[check("a")]).save(tmp_path / "n.json")
    code, text = compare_files(tmp_path / "b.json", tmp_path / "n.json")
    assert code == 2
    assert "b.json: the base report is incomplete (SIGTERM received)" in text
    assert compare_files(tmp_path / "b.json", tmp_path / "n.json", allow_incomplete_baseline=True)[0] == 0
    # an unfinished new run never compares as OK: what it did not run is unknown
    code, text = compare_files(tmp_path / "n.json", tmp_path / "b.json")
    assert code == 1 and text.rstrip().endswith("did not finish (SIGTERM received)")


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "soon"])
def test_a_bad_timeout_names_the_value(bad: str):
    with pytest.raises(argparse.ArgumentTypeError, match=f"expected seconds >= 0 .0: no timeout., got '{bad}'"):
        parse_timeout(bad)


FAULTHANDLER_DUMP = """Timeout (0:00:03)!
Thread 0x00007f5fb93ff6c0 (most recent call first):
  File "/venv/execnet/gateway_base.py", line 534 in read

Thread 0x00007f5fba877b80 (most recent call first):
  File "/tmp/x/chaos.py", line 14 in quantize
  File "/tmp/x/test_quantize.py", line 8 in test_quantize
  File "/venv/_pytest/python.py", line 187 in pytest_pyfunc_call
"""


def test_the_watchdogs_dump_keeps_the_tests_thread_innermost_first():
    stack = thread_of_test(FAULTHANDLER_DUMP)
    assert stack.splitlines()[0] == "Thread 0x00007f5fba877b80 (most recent call first):"
    assert "execnet" not in stack
    assert innermost_frame(stack) == "quantize (chaos.py:14)"
    format_stack = '  File "/a/test_x.py", line 3, in test_x\n    f()\n  File "/a/k.py", line 9, in kernel\n'
    assert innermost_frame(format_stack) == "kernel (k.py:9)"


def test_a_fixture_error_is_an_errored_record_in_the_report(pytester: pytest.Pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.fixture
        def broken():
            raise RuntimeError("no device")
        def test_x(numerics, broken): pass
    """)
    out = pytester.path / "r.json"
    result = pytester.runpytest("-p", "no:xdist", "--mxcheck-report", str(out))
    result.assert_outcomes(errors=1)
    [r] = Report.load(out).records
    assert (r.kind, r.extra["outcome"], r.message) == ("setup", "errored", "RuntimeError: no device")
    result.stdout.fnmatch_lines(["0 numeric checks, 0 failed, 1 errored, *"])


def test_a_failure_record_keeps_the_lines_that_name_its_cause():
    # a GEMM or linear check raises with its attribution (mxcheck.diagnose) after the first line;
    # the record keeps those lines so the JSON, Markdown and HTML reports say what the kernel does
    from mxcheck.report import outcomes

    text = ("gemm of recipe mxfp4: outside the bound; 9 of 16 outputs\n  output [0, 1]: got 1.0\n"
            "  9 of 9 differing outputs are reproduced by: fp4 nibble order swapped\n  a row: 0x7f (2^0)")
    report = SimpleNamespace(longrepr=SimpleNamespace(reprcrash=SimpleNamespace(message=text)))
    assert outcomes._message(report).splitlines() == [
        "gemm of recipe mxfp4: outside the bound; 9 of 16 outputs",
        "9 of 9 differing outputs are reproduced by: fp4 nibble order swapped"]


def test_what_a_backend_lacks_is_said_once_per_reason_with_the_checks_it_stopped():
    from mxcheck.report.outcomes import not_run_lines

    why = "backend has neither linear, gemm nor fake_quantize"
    skipped = [{"test_id": f"t[{r}-{c}]", "reason": f"{c}: {why}", "kind": "not_applicable"}
               for r in ("a", "b") for c in ("linear", "nan")]
    skipped += [{"test_id": "t[a-gemm]", "reason": "gemm: backend has no gemm", "kind": "not_applicable"},
                {"test_id": "t[a-sr]", "reason": "sr_seeded: recipe a has no stochastic rounding",
                 "kind": "not_applicable"},
                {"test_id": "t[a-x]", "reason": "x: backend has no gemm", "kind": "refused"}]
    assert not_run_lines(skipped) == [f"could not run linear, nan (4 tests): {why}",
                                      "could not run gemm (1 test): backend has no gemm"]
