"""The run guard's multi-process runs: crashed and hung xdist workers, and SIGTERM to a
``-n 2`` run. Each starts a pytest with two workers and replaces crashed ones (about 35 s of
CPU on the 2-core CI machine), so they are ``slow``: the workflow's slow job runs them
(``pytest -m slow tests/test_run_guard_slow.py``); the in-process timeout, incomplete-run and
baseline tests stay in the emulated suite (tests/test_run_guard.py)."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from mxcheck.report import Report, compare_files
from mxcheck.report.markdown import render_markdown
from tests.test_run_guard import SLOW_AND_FAST, _by_outcome, _chaos

pytestmark = pytest.mark.slow


def test_crashed_and_hung_workers_are_records_and_the_run_goes_on(pytester: pytest.Pytester):
    _chaos(pytester, '("mxfp4", 64), ("mxfp4", 128), ("fp8", 64)')
    out = pytester.path / "report.json"
    start = time.monotonic()
    result = pytester.runpytest_subprocess(
        "-n", "2", "-p", "xdist", "--mxcheck-backend", "chaos:Chaos", "--mxcheck-timeout", "1",
        "--mxcheck-report", str(out), timeout=240)
    assert time.monotonic() - start < 120  # the hangs sleep for an hour
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    report = Report.load(out)
    outcomes = _by_outcome(report)
    crashed = sorted(r.test_id.split("[")[1] for r in outcomes["crashed"])
    assert crashed == ["chaos-mxfp4-128]", "chaos-mxfp4-64]"]
    assert {(r.recipe, r.backend, r.extra["signal"]) for r in outcomes["crashed"]} == \
        {("mxfp4", "chaos", "SIGSEGV")}
    [hung] = outcomes["timed_out"]  # the watchdog's stack: the alarm could not end it
    assert (hung.recipe, hung.extra["timeout_s"]) == ("fp8", 1.0)
    assert hung.extra["stack"].splitlines()[1].endswith("line 14 in quantize")  # innermost first
    assert "in quantize (chaos.py:14)" in hung.message and "ended and replaced" in hung.message
    assert "passed" not in outcomes and "failed" not in outcomes
    assert report.complete and report.exit_status == 1
    assert render_markdown(report).startswith(
        "**mxcheck**: 0 checks, 0 failed, 2 crashed, 1 timed out, 0 skipped")
    result.stdout.fnmatch_lines(["0 numeric checks, 0 failed, 2 crashed, 1 timed out, *"])


def test_sigterm_writes_an_incomplete_report_that_compare_refuses(pytester: pytest.Pytester):
    pytester.makepyfile(test_a=SLOW_AND_FAST.format(name="fast", n=4, sleep=0),
                        test_b=SLOW_AND_FAST.format(name="slow", n=4, sleep=30))
    out = pytester.path / "report.json"
    proc = pytester.popen([sys.executable, "-m", "pytest", "-n", "2", "-p", "xdist",
                           "--dist", "loadfile", "--mxcheck-report", str(out)],
                          stdin=pytester.CLOSE_STDIN)
    deadline = time.monotonic() + 90
    while len(list(pytester.path.glob("done-fast-*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # the controller has the fast tests' reports
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == pytest.ExitCode.INTERRUPTED
    report = Report.load(out)  # valid JSON
    assert not report.complete
    assert report.incomplete_reason.startswith("SIGTERM received after 4 of 8 tests")
    assert sorted(r.layer for r in report.records) == ["fast0", "fast1", "fast2", "fast3"]
    assert render_markdown(report).startswith("**mxcheck**: INCOMPLETE (SIGTERM received after 4")
    code, text = compare_files(out, out)
    assert code == 2 and "the base report is incomplete (SIGTERM received" in text
    assert "--allow-incomplete-baseline" in text
    code, text = compare_files(out, out, allow_incomplete_baseline=True)
    assert code == 1 and "INCOMPLETE: the new report's run did not finish" in text
    refused = pytester.runpytest("-p", "no:xdist", "--mxcheck-baseline", str(out), "test_a.py")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--mxcheck-baseline*incomplete*--mxcheck-allow-incomplete-baseline*"])
