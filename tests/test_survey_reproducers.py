"""The survey's records stay true: ``docs/conventions.md`` is what ``tools/survey_conventions.py``
generates from ``references/conventions/*.json``, every defect there has its reproducer, and
each reproducer gives, on the installed release of its library, the exit status its record
measured on that release (1: the defect is there).

The reproducers run only where their library is installed at a recorded release (``tox -e
survey`` installs the CPU libraries); they skip, naming the library and release, elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "references" / "conventions"


def _survey():
    """tools/survey_conventions.py (a script, not a package), imported once."""
    if "survey_conventions" not in sys.modules:
        spec = importlib.util.spec_from_file_location("survey_conventions", ROOT / "tools" / "survey_conventions.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["survey_conventions"]


def _records() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(RECORDS.glob("*.json"))]


def _installed(packages: list[str]) -> str | None:
    for package in packages:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return None


CASES = [pytest.param(rec, d["id"], id=f"{rec['library']}-{d['id']}") for rec in _records() for d in rec["defects"]]


@pytest.mark.emulated
def test_the_page_is_generated_from_the_records():
    assert (ROOT / "docs" / "conventions.md").read_text() == _survey().page(_records()), \
        "docs/conventions.md is stale: python tools/survey_conventions.py --page-only"


@pytest.mark.emulated
def test_every_recorded_defect_has_its_reproducer_and_reproduced_on_a_recorded_release():
    survey = _survey()
    for rec in _records():
        assert rec["defects"] == survey.defects(rec["library"]), f"{rec['library']}: rerun the survey"
        for d in rec["defects"]:
            seen = {r["release"]: r.get("reproducers", {}).get(d["id"]) for r in rec["runs"] if "unavailable" not in r}
            assert 1 in seen.values(), f"{rec['library']} {d['id']}: reproduced on no recorded release ({seen})"


@pytest.mark.parametrize(("record", "defect"), CASES)
def test_the_reproducer_gives_what_its_record_measured(record, defect):
    found = _installed(record["packages"])
    if found is None:
        pytest.skip(f"{record['library']} is not installed (pip install {record['packages'][0]}; tox -e survey)")
    measured = {r["release"]: r.get("reproducers", {}).get(defect) for r in record["runs"] if "unavailable" not in r}
    if measured.get(found) is None:
        pytest.skip(f"{record['library']} {found} is not a recorded release ({sorted(measured)})")
    path = RECORDS / record["library"] / f"{defect}.py"
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == measured[found], (f"{path.name} on {record['library']} {found}: exit "
                                                f"{proc.returncode}, recorded {measured[found]}\n{proc.stdout}{proc.stderr}")
