"""A run that ends badly still says what happened: per-test timeouts, crashed xdist workers,
and SIGTERM or SIGINT, each told to the report.

The timeout (``--mxcheck-timeout S``, for tests that use the ``numerics`` or ``backend``
fixture) is built on the standard library, in two layers:

1. ``signal.setitimer`` raises :class:`TimedOut` in the test after S seconds. A hang that
   returns to the interpreter (a sleep, a lock, a Python loop) fails that test with its
   stack, and the process goes on.
2. ``faulthandler.dump_traceback_later(S + grace, exit=True)``: a C watchdog thread that
   needs no GIL, so it also ends a hang inside a kernel call that never comes back to
   Python. It writes every thread's stack to a file the xdist controller reads, then ends
   the worker; xdist replaces the worker and the run goes on.

pytest-timeout was not used: its ``signal`` method is layer 1 alone, and its ``thread``
method needs the GIL for its timer and prints the stack to the worker's stderr, where the
controller cannot attach it to the report. Without xdist, layer 2 ends the whole run (its
stack goes to stderr), so hardware runs use ``-n``.

A crashed worker is filed with the signal that ended it (the worker process's exit status).
SIGTERM and SIGINT stop the run as a KeyboardInterrupt does, so pytest's session still
finishes and the report is written, marked incomplete with the reason.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from mxcheck.report.outcomes import OUTCOME_KEY, PARAMS_KEY
from mxcheck.report.schema import Report

__all__ = ["DEFAULT_TIMEOUT_S", "GUARD", "RunGuard", "TimedOut", "add_timeout_option",
           "innermost_frame", "parse_timeout", "register", "stamp_run", "thread_of_test"]

# The slowest numerics test measured: conformance's test_backend_conforms[emulated-linear-
# fp8-delayed], 19.2 s on a busy 2-core CPU (pytest --durations). The default is about 15x
# that: a slower runner, a fresh worker's first torch imports and a hardware run's first-use
# kernel compiles all fit, and a real hang still ends in minutes, not GitHub's 6 hours.
SLOWEST_S = 19.2
DEFAULT_TIMEOUT_S = 300.0
TIMED_FIXTURES = frozenset({"numerics", "backend"})
STACK_FRAMES = 40  # a timed-out test's stack keeps this many innermost frames
_DIR_KEY = "mxcheck_guard_dir"  # workerinput key: where workers leave their notes
_STOP_SIGNALS = ("SIGTERM", "SIGINT")
GUARD = pytest.StashKey["RunGuard"]()


class TimedOut(BaseException):
    """A test ran past --mxcheck-timeout. A BaseException, so that ``except Exception`` in
    the code under test cannot swallow it (as pytest's own outcomes are)."""

    def __init__(self, seconds: float, stack: str) -> None:
        super().__init__(f"timed out after {seconds:g} s (--mxcheck-timeout) in {innermost_frame(stack)}")
        self.seconds = seconds
        self.stack = stack


def parse_timeout(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0 (0: no timeout), got {value!r}")
    return seconds


def add_timeout_option(addoption: Callable[..., Any], prefix: str = "--mxcheck-") -> None:
    addoption(f"{prefix}timeout", type=parse_timeout, default=DEFAULT_TIMEOUT_S, metavar="S",
              help="end a test that uses the numerics or backend fixture after S seconds and "
                   "record it as timed out with its stack; a hang that never returns to "
                   "Python ends its xdist worker, which is replaced. 0: no timeout. "
                   "Default: %(default)r")


def grace_s(timeout: float) -> float:
    """How long after the timeout the watchdog ends the process: layer 1's time to work, and
    then pytest's time to format the failure (seconds, for a deep traceback on a busy runner)."""
    return max(5.0, timeout / 4)


def teardown_budget_s(timeout: float) -> float:
    """The time a test's teardown has of its own, whatever setup and call left of the timeout."""
    return grace_s(timeout)


class RunGuard:
    """The timeouts of one process, and (in the controller) crashes and stop signals."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.timeout: float = config.getoption("mxcheck_timeout")
        self.workerid: str | None = getattr(config, "workerinput", {}).get("workerid")
        self.dir: Path | None = None
        if self.workerid:
            given = config.workerinput.get(_DIR_KEY)  # type: ignore[attr-defined]
            self.dir = Path(given) if given else None
        self.stop_reason = ""
        self.interrupted = ""
        self.finishing = False
        self.reported: set[str] = set()
        self._down: dict[str, dict[str, Any]] = {}
        self._nodes: dict[str, Any] = {}  # the controller's live xdist workers
        self._handlers: dict[int, Any] = {}
        self._stack_file: Any = None
        self._deadline: float | None = None

    # ---- stop signals (the controller, or a run without xdist)

    def install(self) -> None:
        if self.workerid or threading.current_thread() is not threading.main_thread():
            return
        for name in _STOP_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                self._handlers[sig] = signal.signal(sig, self._on_stop_signal)

    def _on_stop_signal(self, signum: int, frame: Any) -> None:
        self.stop_reason = self.stop_reason or f"{signal.Signals(signum).name} received"
        if not self.finishing:  # while the report is written, a second signal waits for it
            raise KeyboardInterrupt(self.stop_reason)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.finishing = True
        stopped = self.stop_reason or session.exitstatus == pytest.ExitCode.INTERRUPTED
        path = self.config.getoption("mxcheck_report")
        collector = self.config.pluginmanager.get_plugin("mxcheck-collector")
        if stopped and path and collector is not None and not self.workerid:
            # Written now, before xdist waits for its workers to stop: a CI runner follows
            # its SIGTERM with SIGKILL seconds later. The collector writes it again at the end.
            report = collector.report()
            stamp_run(self.config, report, session)
            report.save(path)
        if stopped:  # as Ctrl-C in a terminal would: xdist otherwise waits 10 s per worker
            for node in self._nodes.values():
                _send(node, signal.SIGINT)

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        self.interrupted = str(excinfo.value) or excinfo.typename

    def pytest_unconfigure(self) -> None:
        for sig, handler in self._handlers.items():
            signal.signal(sig, handler)
        if self._stack_file is not None:
            self._stack_file.close()
        if self.dir is not None and not self.workerid:
            shutil.rmtree(self.dir, ignore_errors=True)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when in ("call", "???") or (report.when == "setup" and not report.passed):
            self.reported.add(report.nodeid)

    def incomplete_reason(self, session: pytest.Session) -> str:
        """"" for a run that finished; else why not, and how far it got."""
        if self.config.option.collectonly:
            return ""
        collected, ran = session.testscollected, len(self.reported)
        progress = f"after {ran} of {collected} tests"
        if self.stop_reason:
            return f"{self.stop_reason} {progress}"
        if session.exitstatus == pytest.ExitCode.INTERRUPTED or (
                (session.shouldstop or session.shouldfail) and ran < collected):  # -x, --maxfail
            why = self.interrupted or session.shouldstop or session.shouldfail or "interrupted"
            return f"{why} {progress}"
        if session.exitstatus in (pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR):
            return f"pytest exit status {int(session.exitstatus)} {progress}"
        if ran < collected:  # e.g. xdist's limit of crashed workers reached
            return f"{collected - ran} of {collected} tests did not run"
        return ""

    # ---- timeouts (a worker, or a run without xdist)

    def _timed(self, item: pytest.Item) -> bool:
        return self.timeout > 0 and bool(TIMED_FIXTURES & set(getattr(item, "fixturenames", ())))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> Generator[None, Any, Any]:
        if not self._timed(item):
            return (yield)
        self._note_current(item)
        self._deadline = time.monotonic() + self.timeout
        faulthandler.dump_traceback_later(self.timeout + grace_s(self.timeout), exit=True,
                                          file=self._stack_target())
        try:
            return (yield)
        finally:
            faulthandler.cancel_dump_traceback_later()
            self._deadline = None

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._alarm())

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._alarm())

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, Any, Any]:
        # Teardown has a budget of its own: a test that spent its time (or timed out) must still
        # close what its fixtures opened, or the next test's setup finds it half torn down. The
        # watchdog's window moves with it, so only a teardown that hangs is killed.
        if self._deadline is not None:
            budget = teardown_budget_s(self.timeout)
            self._deadline = max(self._deadline, time.monotonic() + budget)
            faulthandler.dump_traceback_later(budget + grace_s(self.timeout), exit=True,
                                              file=self._stack_target())
        return (yield from self._alarm())

    def _alarm(self) -> Generator[None, Any, Any]:
        # Armed per phase, inside pytest's call wrapper, so TimedOut fails the phase it hits.
        if (self._deadline is None or not hasattr(signal, "setitimer")
                or threading.current_thread() is not threading.main_thread()):
            return (yield)
        left = max(self._deadline - time.monotonic(), 1e-3)
        previous = signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, left)
        try:
            return (yield)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def _on_alarm(self, signum: int, frame: Any) -> None:
        # The watchdog's window restarts: pytest now formats the failure and the teardown runs.
        faulthandler.dump_traceback_later(grace_s(self.timeout), exit=True, file=self._stack_target())
        raise TimedOut(self.timeout, "".join(traceback.format_stack(frame, limit=STACK_FRAMES)))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report = yield
        error = call.excinfo.value if call.excinfo is not None else None
        if isinstance(error, TimedOut):
            report.user_properties.append((OUTCOME_KEY, {
                "outcome": "timed_out", "timeout_s": error.seconds, "stack": error.stack,
                "message": str(error)}))
        return report

    def _note_current(self, item: pytest.Item) -> None:
        """A worker leaves the test it starts where the controller can read it after a crash."""
        if self.dir is None:
            return
        params = next((v for k, v in item.user_properties if k == PARAMS_KEY), None)
        note = json.dumps({"nodeid": item.nodeid, "params": params})
        (self.dir / f"{self.workerid}.current").write_text(note, encoding="utf-8")

    def _stack_target(self) -> Any:
        if self.dir is None:
            return sys.__stderr__
        if self._stack_file is None:
            self._stack_file = open(self.dir / f"{self.workerid}.stack", "w")
        return self._stack_file

    # ---- the xdist controller: crashed and timed-out workers

    def _shared_dir(self) -> Path:
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="mxcheck-guard-"))
        return self.dir

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[_DIR_KEY] = str(self._shared_dir())
        self._nodes[node.gateway.id] = node

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        self._nodes.pop(node.gateway.id, None)
        if error:
            self._down[node.gateway.id] = _why_down(node, self.dir)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        wid = report.node.gateway.id  # type: ignore[attr-defined]  (xdist sets it)
        down = self._down.pop(wid, {})
        current = down.get("current") or {}
        if current.get("nodeid") == crashitem and current.get("params"):
            report.user_properties.append((PARAMS_KEY, current["params"]))
        if down.get("stack"):
            details = {"outcome": "timed_out", "timeout_s": self.timeout, "stack": down["stack"],
                       "message": f"timed out after {self.timeout:g} s (--mxcheck-timeout) in "
                                  f"{innermost_frame(down['stack'])}; the hang never returned to "
                                  f"Python, so worker {wid} was ended and replaced"}
        else:
            sig = down.get("signal")
            details = {"outcome": "crashed", "signal": sig, "exit_code": down.get("exit_code"),
                       "message": f"worker {wid} crashed while running this test"
                                  + (f": killed by {sig}" if sig else
                                     f" (exit status {down.get('exit_code')})")}
        report.user_properties.append((OUTCOME_KEY, details))


def _popen(node: Any) -> Any:
    """The worker's subprocess.Popen: execnet's popen gateway keeps it at ``_io.popen``
    (execnet/gateway_io.py, Popen2IOMaster, 2.1); None for another kind of gateway."""
    return getattr(getattr(node.gateway, "_io", None), "popen", None)


def _send(node: Any, sig: int) -> None:
    popen = _popen(node)
    if popen is not None and popen.poll() is None:
        try:
            popen.send_signal(sig)
        except OSError:  # it ended meanwhile
            pass


def _why_down(node: Any, folder: Path | None) -> dict[str, Any]:
    """What a dead worker left: its exit status (a signal is negative), the test it was
    running, and the watchdog's stacks if a timeout ended it."""
    out: dict[str, Any] = {}
    popen = _popen(node)
    try:
        code = popen.wait(timeout=10) if popen is not None else None
    except Exception:  # a worker that will not say how it ended: no signal
        code = None
    out["exit_code"] = code
    if code is not None and code < 0:
        out["signal"] = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
    if folder is not None:
        wid = node.gateway.id
        stack = folder / f"{wid}.stack"
        if stack.is_file() and stack.stat().st_size:
            out["stack"] = thread_of_test(stack.read_text(encoding="utf-8", errors="replace"))
        current = folder / f"{wid}.current"
        if current.is_file():
            out["current"] = json.loads(current.read_text(encoding="utf-8"))
    return out


_FRAME = re.compile(r'File "([^"]+)", line (\d+)(,?) in (\S+)')


def thread_of_test(dump: str) -> str:
    """Of faulthandler's dump (a block per thread, innermost frame first), the block of the
    thread that ran the test (the one inside pytest), cut to its STACK_FRAMES innermost frames."""
    blocks = re.split(r"\n\s*\n?(?=(?:Current thread|Thread) 0x)", dump.strip())
    block = next((b for b in blocks if "_pytest" in b), blocks[0]).splitlines()
    head, frames = block[:1], [line for line in block[1:] if line.strip()]
    cut = [f"  ... {len(frames) - STACK_FRAMES} outer frames cut"] if len(frames) > STACK_FRAMES else []
    return "\n".join([*head, *frames[:STACK_FRAMES], *cut]) + "\n"


def innermost_frame(stack: str) -> str:
    """"name (file.py:12)": the innermost frame in ``stack`` (format_stack's or faulthandler's)."""
    frames = _FRAME.findall(stack)
    if not frames:
        return "an unknown frame"
    # traceback.format_stack writes ", in" with the innermost frame last; faulthandler
    # writes " in" with the innermost frame first.
    path, line, _, name = frames[-1] if frames[0][2] else frames[0]
    return f"{name} ({Path(path).name}:{line})"


def stamp_run(config: pytest.Config, report: Report, session: pytest.Session) -> None:
    """Set the report's exit status and whether its run finished (and why not)."""
    report.exit_status = int(session.exitstatus)
    guard = config.stash.get(GUARD, None)
    reason = guard.incomplete_reason(session) if guard is not None else ""
    report.complete, report.incomplete_reason = not reason, reason


def register(config: pytest.Config) -> RunGuard:
    """Make the run's guard, install its stop signals and register it as a plugin."""
    guard = config.stash[GUARD] = RunGuard(config)
    guard.install()
    config.pluginmanager.register(guard, "mxcheck-run-guard")
    return guard
