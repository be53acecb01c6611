"""What happened to each test that neither passed nor skipped, as records, and the counts.

A comparison's record says how close a check came. A test can also end without one: an
exception outside a recorded comparison, an error in a fixture's setup or teardown, a crashed
process (an illegal memory access is a signal, not an exception) or a hang that a timeout
ended. Each of those is one record of kind ``test`` (the call, or the crash), ``setup`` or
``teardown``, ``passed=False``, and ``extra["outcome"]`` one of ``TEST_OUTCOMES``; a crash
adds ``extra["signal"]``, a timeout ``extra["timeout_s"]`` and ``extra["stack"]`` (its
innermost frames, as ``mxcheck.run_guard`` cut them).

The counts keep them apart, so a headline says "3 failed, 6 crashed" and never reads
"0 failed" over a run that pytest calls failed. A report also says whether its run
finished (``Report.complete``); an incomplete one says so first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from mxcheck.report.schema import Record, Report

__all__ = [
    "OUTCOME_KEY",
    "PARAMS_KEY",
    "SKIP_KINDS",
    "SKIP_KIND_KEY",
    "TEST_OUTCOMES",
    "UNJUDGED_OUTCOMES",
    "count_outcomes",
    "counts_text",
    "not_run_lines",
    "outcome_of",
    "outcome_record",
    "run_status_text",
    "skip_summary",
]

# user_properties keys (they travel from xdist workers to the controller with each report):
OUTCOME_KEY = "mxcheck_outcome"  # {"outcome": "timed_out" | "crashed", ...} from the run guard
PARAMS_KEY = "mxcheck_params"  # [backend, recipe] of a parametrized test
# outcome -> how the counts name it; "failed" counts failed checks and tests failed outside one.
TEST_OUTCOMES = {"failed": "failed", "errored": "errored", "crashed": "crashed",
                 "timed_out": "timed out"}
# Records of what was not judged (an edge shape the backend refused, or one the oracle cannot
# take): neither a check nor a failure; counted apart, with the reason as the message.
UNJUDGED_OUTCOMES = {"refused": "refused (declared)", "not_applicable": "not applicable"}
SKIP_KIND_KEY = "mxcheck_skip_kind"  # why a test skipped, as one of SKIP_KINDS
# A skip's kind -> how the counts name it. A skip without a kind (a marker's, a missing test
# dependency's, a report written before kinds) is "other". Only "unsupported" and "refused"
# are the backend's own word.
SKIP_KINDS = {
    "unsupported": "not supported by the backend",  # supports(recipe) said no
    "unavailable": "not runnable here",  # available() said no, or a hardware marker
    "refused": "refused (declared)",  # a method raised mxcheck.backends.Refusal
    "not_applicable": "not applicable",  # the check needs a method or feature the backend lacks
    "other": "other",
}
_PHASE_KIND = {"setup": "setup", "teardown": "teardown"}  # the call and a crash: "test"
_MESSAGE_CHARS = 500


def outcome_of(record: Record) -> str:
    """"passed", an UNJUDGED_OUTCOMES key, or the record's test outcome ("failed" for a failed
    comparison)."""
    if record.extra.get("outcome") in UNJUDGED_OUTCOMES:
        return str(record.extra["outcome"])
    if record.passed:
        return "passed"
    outcome = record.extra.get("outcome", "failed")
    return outcome if outcome in TEST_OUTCOMES else "failed"


def count_outcomes(records: Iterable[Record]) -> dict[str, int]:
    """{"checks": comparisons and failed tests, "passed": ..., then one count per TEST_OUTCOMES}.

    Errored, crashed and timed-out tests are not checks (they never got to compare), so
    "checks" counts the records whose outcome is passed or failed.
    """
    counts = dict.fromkeys(("checks", "passed", *TEST_OUTCOMES, *UNJUDGED_OUTCOMES), 0)
    for r in records:
        outcome = outcome_of(r)
        counts[outcome] += 1
        counts["checks"] += outcome in ("passed", "failed")
    return counts


def counts_text(records: Iterable[Record], checks: str = "checks") -> str:
    """"144 checks, 0 failed" and, where any, ", 2 errored, 6 crashed, 1 timed out"."""
    c = count_outcomes(records)
    parts = [f"{c['checks']} {checks}", f"{c['failed']} failed"]
    parts += [f"{c[k]} {label}" for k, label in TEST_OUTCOMES.items() if k != "failed" and c[k]]
    parts += [f"{c[k]} {label}" for k, label in UNJUDGED_OUTCOMES.items() if c[k]]
    return ", ".join(parts)


def skip_summary(skipped: Iterable[dict[str, str]]) -> str:
    """'3 not supported by the backend, 2 refused (declared)': skips counted by kind."""
    counts: dict[str, int] = {}
    for s in skipped:
        kind = s.get("kind", "other") if s.get("kind") in SKIP_KINDS else "other"
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{counts[k]} {text}" for k, text in SKIP_KINDS.items() if counts.get(k))


# Reasons that say the backend lacks what a check needs (a method, codes), not the recipe.
_BACKEND_REASONS = ("backend has ", "needs codes")


def not_run_lines(skipped: Iterable[dict[str, str]]) -> list[str]:
    """Each reason the backend itself gives for the suite's not-applicable skips ("CHECK:
    backend has no gemm"), once, with the checks it stopped: "could not run gemm, linear
    (18 tests): backend has neither linear, gemm nor fake_quantize"."""
    by_reason: dict[str, tuple[list[str], list[int]]] = {}
    for s in skipped:
        check, sep, why = s.get("reason", "").partition(": ")
        if s.get("kind") != "not_applicable" or not sep or not why.startswith(_BACKEND_REASONS):
            continue
        checks, count = by_reason.setdefault(why, ([], [0]))
        count[0] += 1
        if check not in checks:
            checks.append(check)
    return [f"could not run {', '.join(sorted(checks))} ({n[0]} test{'s' if n[0] != 1 else ''}): {why}"
            for why, (checks, n) in by_reason.items()]


def run_status_text(report: Report) -> str:
    """What must be read before the counts: "" for a complete run that pytest passed;
    "INCOMPLETE (reason)" for a run that did not finish; "pytest exit status N" for a
    finished run pytest failed although no record failed (a collection error, say)."""
    if not report.complete:
        return f"INCOMPLETE ({report.incomplete_reason or 'no reason recorded'})"
    c = count_outcomes(report.records)
    if report.exit_status not in (None, 0, 5) and not any(c[k] for k in TEST_OUTCOMES):
        return f"pytest exit status {report.exit_status}"
    return ""


def _params(props: Iterable[tuple[str, Any]]) -> tuple[str, str]:
    backend, recipe = next((v for k, v in props if k == PARAMS_KEY), ("n/a", "n/a"))
    return str(backend or "n/a"), str(recipe or "n/a")


# Lines of a failure that name its cause (mxcheck.diagnose): kept after the first line, so
# the JSON, Markdown and HTML reports say what the kernel does, not only where it failed.
_CAUSE = re.compile(r"are reproduced by|reproduced by no known behaviour|fails at every shape with|field relation: ")
CAUSE_LINES = 4


def _message(report: Any) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    lines = text.splitlines() or [""]
    causes = [line.strip() for line in lines[1:] if _CAUSE.search(line)][:CAUSE_LINES]
    return "\n".join([lines[0][:_MESSAGE_CHARS], *(c[:_MESSAGE_CHARS] for c in causes)])


def outcome_record(report: Any, records: list[Record]) -> Record | None:
    """The record of a pytest ``TestReport`` that failed outside its recorded comparisons.

    ``records`` are the comparisons the report carried. None for a passed or skipped phase,
    and for a call that failed on a recorded comparison (that record already says so).
    """
    if not report.failed:
        return None
    props = list(report.user_properties)
    details = dict(next((v for k, v in props if k == OUTCOME_KEY), {}))
    when = report.when
    if not details:
        if when == "call" and not all(r.passed for r in records):
            return None
        # xdist files a crashed worker's test under when="???"
        details["outcome"] = {"call": "failed", "???": "crashed"}.get(when, "errored")
    backend, recipe = _params(props)
    message = details.pop("message", None) or _message(report)
    return Record(test_id=report.nodeid, backend=backend, recipe=recipe,
                  kind=_PHASE_KIND.get(when, "test"), passed=False, message=message,
                  extra={"when": when, **details})
