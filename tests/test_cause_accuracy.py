"""The cause-accuracy benchmark: its labelled set covers every seeded bug and every class, its
scores count as the docs say, a few cases name their true cause on CPU, and the committed
record (docs/cause-accuracy.md) is a run of the current set."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mxcheck.backends.known_bad import KNOWN_BAD
from mxcheck.cli.main import main
from mxcheck.conformance import accuracy
from mxcheck.conformance.accuracy import CASES, CLASSES, QUICK, Outcome, run_case, score
from mxcheck.diagnose import CATALOGUE
from mxcheck.diagnose.catalogue import combined

pytestmark = pytest.mark.emulated

RECORD = Path(__file__).resolve().parents[1] / "references" / "accuracy" / "cause_accuracy.json"
# "FIELD: KIND", as diagnose.relations names one: a kind of KINDS, or one of its numbered
# families ("times 2^-1", "times 4/3", "constant 1e-10")
RELATION = re.compile(r"^[a-z_]+: (?:[a-z0-9_]+|times 2\^-?\d+|times [\d/.e+-]+|constant [\d.e+-]+)$")


def test_every_known_bad_backend_and_every_class_has_a_case():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
    assert set(KNOWN_BAD) <= set(names)
    assert {c.klass for c in CASES} == set(CLASSES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_true_cause_is_a_behaviour_a_relation_or_a_stated_pattern(case):
    if " & " in case.truth:
        assert combined(*(CATALOGUE[k] for k in case.truth.split(" & "))) is not None
    elif case.check == "edge_shapes":
        assert "K % 256" in case.truth
    else:
        assert case.truth in CATALOGUE or RELATION.match(case.truth), case.truth


def _o(case: str, klass: str, truth: str, headline: tuple[str, ...], failed: bool = True) -> Outcome:
    return Outcome(case, klass, truth, failed, headline, 0.0)


def test_precision_counts_wrong_headlines_and_recall_counts_every_case():
    outcomes = [_o("a", "packing", "x", ("x",)), _o("b", "packing", "x", ("y",)),  # named; wrong
                _o("c", "packing", "x", ()), _o("d", "packing", "x", (), failed=False),  # two misses
                _o("e", "layouts", "z", ("z", "w")),  # ties: the true cause among them is named
                _o("f", "layouts", "p & q & r", ("p & r",))]  # part of a true combination: a miss
    by = {s.klass: s for s in score(outcomes)}
    assert (by["packing"].headed, by["packing"].named) == (2, 1)
    assert by["packing"].precision == 0.5 and by["packing"].recall == 0.25
    assert by["packing"].wrong == ("b",) and by["packing"].misses == ("c", "d")
    assert (by["layouts"].precision, by["layouts"].recall) == (1.0, 0.5)
    assert by["layouts"].misses == ("f",) and by["layouts"].wrong == ()
    assert (by["total"].cases, by["total"].headed, by["total"].named) == (6, 4, 2)
    assert by["total"].precision == 0.75


@pytest.mark.parametrize("name", QUICK)
def test_a_quick_case_is_headed_by_its_true_cause(name):
    """On the input families that show each bug (the issue's two wrong causes among them: the
    reciprocal encode factor, once "element ties rounded toward zero"; the uncapped factor,
    once "scale-byte ties"), the headline holds the true cause and nothing else."""
    case = next(c for c in CASES if c.name == name)
    outcome = run_case(case, quick=True)
    assert outcome.failed and outcome.headline == (case.truth,), outcome


def test_the_committed_record_is_a_run_of_the_current_set():
    data = json.loads(RECORD.read_text())
    got = {c["case"]: c["truth"] for c in data["cases"]}
    assert got == {c.name: c.truth for c in CASES}


def test_the_committed_record_meets_the_target():
    outcomes = accuracy.outcomes_of(json.loads(RECORD.read_text()))
    total = score(outcomes)[-1]
    assert total.klass == "total" and not total.wrong, total
    assert total.recall >= 0.95, total


@pytest.mark.slow
def test_the_whole_set_meets_the_target():
    total = score(accuracy.run_cases())[-1]
    assert not total.wrong and total.recall >= 0.95, total


def test_an_unknown_case_is_a_usage_error_naming_the_known_ones(capsys):
    assert main(["accuracy", "--case", "bad-nope"]) == 2
    err = capsys.readouterr().err
    assert "--case 'bad-nope' is not a labelled case; known: bad-nibble-swap" in err
