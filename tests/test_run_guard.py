"""Runs that end badly still tell the report: crashed workers, hangs, SIGTERM; incomplete
reports are refused as baselines. The end-to-end runs go through pytester with a backend that
crashes or hangs in ``quantize`` on chosen recipes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mxcheck.report import Record, Report, compare_files, render_markdown
from mxcheck.run_guard import innermost_frame

pytestmark = pytest.mark.emulated

# The emulated backend, except that quantize misbehaves on one element format each:
# e2m1 (mxfp4) sends itself SIGSEGV as an illegal memory access does; e2m3 (mxfp6) sleeps
# (a hang the alarm can interrupt); e4m3 (fp8) blocks SIGALRM first, as a kernel call that
# never returns to Python would, so only the watchdog can end it.
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
        if spec.fmt == "e4m3":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        return super().quantize(x, spec, state=state)
"""

QUANTIZE_TEST = """
import pytest, torch
from mxcheck.recipes import RECIPES

@pytest.mark.parametrize("n", [64, 128])
@pytest.mark.parametrize("recipe", ["mxfp4", "mxfp6", "fp8", "mxfp8"])
def test_quantize(backend, numerics, recipe, n):
    x = torch.randn(4, n, generator=torch.Generator().manual_seed(n))
    q = backend.quantize(x, RECIPES[recipe].x_row)
    numerics.context(recipe=recipe, direction="quantize", m=4, k=n).snr(q.dequantize(), x, 5.0)
"""


def _write_chaos(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(chaos=CHAOS_BACKEND, test_quantize=QUANTIZE_TEST)
    pytester.syspathinsert()


def test_crashes_and_hangs_are_records_and_the_run_goes_on(pytester: pytest.Pytester):
    _write_chaos(pytester)
    out = pytester.path / "report.json"
    start = time.monotonic()
    result = pytester.runpytest_subprocess(
        "-n", "2", "-p", "xdist", "--mxcheck-backend", "chaos:Chaos", "--mxcheck-timeout", "1",
        "--mxcheck-report", str(out), timeout=120)
    took = time.monotonic() - start
    print(result.stdout.str()[-3000:], result.stderr.str()[-3000:], took)
    report = Report.load(out)
    by_test = {(r.recipe, r.extra.get("outcome", "passed" if r.passed else "failed")): r
               for r in report.records}
    print(json.dumps([r.to_json() for r in report.records], indent=1)[:6000])
    print(render_markdown(report)[:1500])
    assert by_test
