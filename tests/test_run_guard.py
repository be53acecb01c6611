"""Runs that end badly still tell the report: crashed workers, hangs, SIGTERM; incomplete
reports are refused as baselines. The end-to-end runs go through pytester with a backend that
crashes or hangs in ``quantize`` on chosen recipes."""

from __future__ import annotations

import time

import pytest

from mxcheck.report import Report

pytestmark = pytest.mark.emulated

# The emulated backend, except that quantize misbehaves on one element format each:
# e2m1 (mxfp4) sends itself SIGSEGV as an illegal memory access does; e2m3 (mxfp6) sleeps
# (a hang the alarm can interrupt); tensorwise e4m3 (fp8) blocks SIGALRM first, as a kernel
# call that never returns to Python would, so only the watchdog can end it. mxfp8 passes.
CHAOS_BACKEND = """
import os, signal, time
from mxcheck.backends.emulated import EmulatedBackend

class Chaos(EmulatedBackend):
    name = "chaos"

    def quantize(self, x, spec, *, state=None):
        if spec.fmt == "e2m1":
            os.kill(os.getpid(), signal.SIGSEGV)
        if spec.fmt == "e2m3":
            time.sleep(3600)
        if spec.fmt == "e4m3" and spec.scaling != "mx":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        return super().quantize(x, spec, state=state)
"""


QUANTIZE_TEST = """
import pytest, torch
import mxcheck.gemm, mxcheck.report.recorder  # imported before the clock starts
torch.unravel_index(torch.tensor(0), (1,))  # torch imports its _refs on first use
from mxcheck.recipes import RECIPES

@pytest.mark.parametrize(("recipe", "n"), [{cases}])
def test_quantize(backend, numerics, recipe, n):
    x = torch.randn(4, n, generator=torch.Generator().manual_seed(n))
    q = backend.quantize(x, RECIPES[recipe].x_row)
    numerics.context(recipe=recipe, direction="quantize", m=4, k=n).snr(q.dequantize(), x, 5.0)
"""


def _chaos(pytester: pytest.Pytester, cases: str) -> None:
    pytester.makepyfile(chaos=CHAOS_BACKEND, test_quantize=QUANTIZE_TEST.format(cases=cases))
    pytester.syspathinsert()


def _by_outcome(report: Report) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in report.records:
        out.setdefault(r.extra.get("outcome", "passed" if r.passed else "failed"), []).append(r)
    return out



# The timeout of the in-process runs: short, yet long enough that a passing test's setup and
# call finish inside it on a runner whose cores are oversubscribed several times.
TIMEOUT_S = 2


def test_a_hang_ends_at_the_timeout_and_the_other_recipes_are_reported(pytester: pytest.Pytester):
    _chaos(pytester, '("mxfp6", 64), ("mxfp8", 64), ("mxfp8", 128)')
    out = pytester.path / "report.json"
    start = time.monotonic()
    result = pytester.runpytest("-p", "no:xdist", "--mxcheck-backend", "chaos:Chaos",
                                "--mxcheck-timeout", str(TIMEOUT_S), "--mxcheck-report", str(out))
    # The hang sleeps for an hour: ending within minutes is the timeout's doing, on any load.
    assert time.monotonic() - start < TIMEOUT_S + 120
    result.assert_outcomes(passed=2, failed=1)
    outcomes = _by_outcome(Report.load(out))
    [hung] = outcomes["timed_out"]
    assert (hung.recipe, hung.kind, hung.extra["timeout_s"]) == ("mxfp6", "test", TIMEOUT_S)
    assert hung.extra["stack"].rstrip().endswith("time.sleep(3600)")  # innermost frame last
    assert hung.message == f"timed out after {TIMEOUT_S} s (--mxcheck-timeout) in quantize (chaos.py:11)"
    assert [(r.recipe, r.k) for r in outcomes["passed"]] == [("mxfp8", 128), ("mxfp8", 64)]


# A hanging test whose fixture needs a moment to tear down (closing a handle, removing a
# logging handler, freeing a device buffer), then a test that uses the same fixture.
SLOW_TEARDOWN = """
import time, pytest, mxcheck.report.recorder

@pytest.fixture
def handle(numerics):
    yield "open"
    time.sleep(0.3)  # teardown's own work, after the test has used up its time

def test_hangs(handle):
    time.sleep(3600)

def test_after(handle):
    assert handle == "open"
"""


def test_a_timed_out_test_tears_down_and_the_next_starts_clean(pytester: pytest.Pytester):
    # A timeout spends the test's budget; teardown gets its own, so the test is reported once,
    # as timed out, and the next test's setup does not find it half torn down.
    pytester.makepyfile(test_slow_teardown=SLOW_TEARDOWN)
    out = pytester.path / "report.json"
    result = pytester.runpytest("-p", "no:xdist", "--mxcheck-timeout", str(TIMEOUT_S), "--mxcheck-report", str(out))
    result.assert_outcomes(passed=1, failed=1, errors=0)
    outcomes = _by_outcome(Report.load(out))
    [hung] = outcomes["timed_out"]
    assert hung.test_id.endswith("test_hangs") and hung.extra["timeout_s"] == TIMEOUT_S
    assert "errored" not in outcomes


def test_timeout_zero_turns_it_off(pytester: pytest.Pytester):
    pytester.makepyfile("import time, mxcheck.report.recorder\n"
                        "def test_slow(numerics):\n    time.sleep(0.6)\n")
    pytester.runpytest("-p", "no:xdist", "--mxcheck-timeout", "0.3").assert_outcomes(failed=1)
    pytester.runpytest("-p", "no:xdist", "--mxcheck-timeout", "0").assert_outcomes(passed=1)


SLOW_AND_FAST = """
import pathlib, time, pytest, torch

@pytest.mark.parametrize("i", range({n}))
def test_{name}(numerics, i):
    time.sleep({sleep})
    x = torch.ones(8, dtype=torch.float64)
    numerics.context(recipe="fp8", layer=f"{name}{{i}}").snr(x, x, 10.0)
    pathlib.Path("done-{name}-%d" % i).touch()
"""



def test_a_run_stopped_by_maxfail_is_incomplete_and_one_that_finished_is_not(pytester: pytest.Pytester):
    pytester.makepyfile("import pytest\n@pytest.mark.parametrize('i', range(3))\n"
                        "def test_x(i):\n    assert i != 0\n")
    out = pytester.path / "r.json"
    pytester.runpytest("-p", "no:xdist", "-x", "--mxcheck-report", str(out))
    stopped = Report.load(out)
    assert (stopped.complete, stopped.incomplete_reason) == (False, "stopping after 1 failures after 1 of 3 tests")
    pytester.runpytest("-p", "no:xdist", "--mxcheck-report", str(out))
    finished = Report.load(out)
    assert (finished.complete, finished.exit_status) == (True, 1)
