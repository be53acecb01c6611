"""Every ``python`` block of the README and the docs pages runs, so an example that no longer
matches the code fails the suite.

Sybil, not doctest or pytest-examples: the examples are plain Markdown code blocks (no
``>>>`` prompts for doctest to find), blocks of one page share a namespace as a reader's
session at a prompt would, and a block that cannot run on a CPU says so in the page itself
(``<!-- skip: next "reason" -->``), where a reader sees it. pytest-examples would also lint
and reformat the blocks, which this suite leaves to ruff on the code itself.
"""

from __future__ import annotations

import unittest
from pathlib import Path

import pytest

from mxcheck.deps import needs

with needs("sybil"):
    from sybil import Sybil
    from sybil.evaluators.skip import Skipper
    from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

pytestmark = pytest.mark.emulated

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
SYBIL = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])


def _python_fences(page: Path) -> int:
    return sum(line.strip() == "```python" for line in page.read_text().splitlines())


def run_page(page: Path) -> tuple[int, list[str]]:
    """Run the page's blocks in order in one namespace: (blocks run, skip reasons)."""
    ran, skipped = 0, []
    for example in SYBIL.parse(page):
        try:
            example.evaluate()  # a skip directive's example installs the skip of the next block
        except unittest.SkipTest as skip:
            skipped.append(str(skip))
            continue
        ran += not isinstance(example.region.evaluator, Skipper)
    return ran, skipped


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_python_block_of_the_page_runs_or_says_why_not(page):
    ran, skipped = run_page(page)
    assert ran + len(skipped) == _python_fences(page), (ran, skipped)
    assert all(reason.strip() for reason in skipped)


def test_a_block_that_no_longer_matches_the_code_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```python\nimport mxcheck\nmxcheck.no_such_function()\n```\n")
    with pytest.raises(AttributeError, match="no_such_function"):
        run_page(page)
