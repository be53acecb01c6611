"""A failing conformance check prints its verdict, not the traceback of mxcheck's own code
(mxcheck/plugin/failures.py); --mxcheck-full-trace gives pytest's report back."""

from __future__ import annotations

import pytest

from mxcheck.plugin.failures import MAX_VERDICT_LINES, SEE_MORE

pytestmark = pytest.mark.emulated

# A conformance-like test (parametrized by the plugin with a backend and its claim, as the
# installed suite's are; one claim: --mxcheck-recipe) whose check
# raises a 100-line verdict from a helper, and a plain test that raises the same.
SUITE_LIKE = '''
import pytest
from mxcheck.assertions import NumericsError

VERDICT = "\\n".join(["quantize of recipe r, backend b: 2 of 59 comparisons differ"]
                     + [f"  block {i}: kernel 0x{i:02x} | oracle 0x00" for i in range(1, 100)])

def _check_internals():
    secret_local = "an echoed line of mxcheck's own check code"
    raise NumericsError(VERDICT)

def test_conformance_check(backend, claim):
    _check_internals()

def test_backend_raises(backend, claim):
    raise RuntimeError("CUDA error: an illegal memory access")

def test_not_conformance():
    _check_internals()
'''


def _failure_sections(text: str) -> dict[str, list[str]]:
    """test name -> the lines of its failure section."""
    out: dict[str, list[str]] = {}
    name = None
    for line in text.split("= FAILURES =", 1)[1].splitlines()[1:]:
        if line.startswith("_") and line.endswith("_") and " " in line.strip("_"):
            name = line.strip("_ ").split("[")[0]
            out[name] = []
        elif line.startswith("="):
            break
        elif name:
            out[name].append(line)
    return out


def test_a_failing_conformance_check_prints_its_verdict_and_how_to_see_more(pytester: pytest.Pytester):
    pytester.makepyfile(SUITE_LIKE)
    result = pytester.runpytest("-p", "no:cacheprovider", "--mxcheck-recipe", "mxfp8")
    result.assert_outcomes(failed=3)
    sections = _failure_sections(result.stdout.str())
    verdict = sections["test_conformance_check"]
    assert verdict[0] == "quantize of recipe r, backend b: 2 of 59 comparisons differ", verdict[:3]
    assert verdict[-2:] == ["... 40 more lines of differing blocks", SEE_MORE], verdict[-3:]
    assert len(verdict) == MAX_VERDICT_LINES + 2 <= 80
    assert not any("secret_local" in line or "def _check_internals" in line for line in verdict)
    # the backend's exception keeps its frames (pytest's short style): where, and what
    raised = "\n".join(sections["test_backend_raises"])
    assert "RuntimeError: CUDA error: an illegal memory access" in raised and SEE_MORE in raised
    # a test outside the conformance suite keeps pytest's report
    assert any("secret_local" in line for line in sections["test_not_conformance"])


def test_the_full_trace_is_one_flag_away(pytester: pytest.Pytester):
    pytester.makepyfile(SUITE_LIKE)
    result = pytester.runpytest("-p", "no:cacheprovider", "--mxcheck-recipe", "mxfp8", "--mxcheck-full-trace",
                                 "-k", "test_conformance_check")
    verdict = _failure_sections(result.stdout.str())["test_conformance_check"]
    assert any("secret_local" in line for line in verdict)
    assert any("block 99: kernel 0x63" in line for line in verdict) and SEE_MORE not in verdict


def test_a_verdict_whose_every_comparison_differs_keeps_its_cause_in_the_lines_shown():
    """A kernel wrong on every input lists a count per comparison ahead of ``cause:`` (seen on
    AITER's Triton MXFP4 on an H100: 118 count lines, the cause at line 130 of a 60-line
    report); the condensed verdict cuts that list to COUNTS_KEPT so the cause is shown."""
    from mxcheck.assertions import NumericsError
    from mxcheck.plugin.failures import COUNTS_KEPT, verdict_text

    counts = [f"  x_row.codes (input {i}): {i} of 4,096 elements differ" for i in range(118)]
    message = "\n".join(["quantize of recipe r, backend b: 59 of 60 comparisons differ", *counts, "cause:",
                         "  12 of 12 differing blocks examined are reproduced by: the cause",
                         *(f"x_row (input {i}): {i} of 128 blocks differ" for i in range(59))])
    with pytest.raises(NumericsError) as info:
        raise NumericsError(message)
    shown = verdict_text(info).splitlines()
    assert "  12 of 12 differing blocks examined are reproduced by: the cause" in shown
    assert shown[1:1 + COUNTS_KEPT] == counts[:COUNTS_KEPT]
    assert shown[1 + COUNTS_KEPT] == f"  ... {118 - COUNTS_KEPT} more differing fields (each comparison's count " \
        "follows its cause below)"
    assert len(shown) <= MAX_VERDICT_LINES + 2
