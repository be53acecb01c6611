"""The tables the code owns are committed into the Markdown between markers (docs/hooks.py),
and a committed one that the code would render otherwise fails here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.emulated

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("_mxcheck_docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_every_generated_table_in_the_markdown_is_what_the_code_renders(hooks):
    stale = hooks.stale_pages()
    assert stale == [], f"stale generated tables in {[str(p.relative_to(ROOT)) for p in stale]}: run python docs/hooks.py"


def test_every_table_the_hook_knows_sits_in_some_page(hooks):
    text = "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    assert [n for n in hooks.TABLES if f"<!-- generated: {n} -->" not in text] == []


def test_a_stale_table_or_a_bare_marker_is_found_and_rewritten(hooks, tmp_path):
    fresh = hooks.render("# page\n\n<!-- generated: plain-recipes -->\n", "page.md")
    assert "| `nvfp4-1x16` |" in fresh and fresh.endswith("<!-- end generated: plain-recipes -->\n")
    page = tmp_path / "page.md"
    page.write_text(fresh.replace("nvfp4-1x16", "nvfp4-1x32"))
    assert hooks.stale_pages(tmp_path) == [page]
    page.write_text("# page\n\n<!-- generated: plain-recipes -->\n")  # a marker without its table
    assert hooks.stale_pages(tmp_path) == [page]
    page.write_text(fresh)
    assert hooks.stale_pages(tmp_path) == []


def test_the_site_build_refuses_a_marker_without_its_table(hooks):
    page = type("Page", (), {"file": type("File", (), {"src_path": "x.md"})()})()
    with pytest.raises(KeyError, match=r"x\.md: <!-- generated: layers --> has no table under it"):
        hooks.on_page_markdown("<!-- generated: layers -->\n", page, None, None)
    assert "| formats |" in hooks.on_page_markdown(hooks.render("<!-- generated: layers -->\n", "x.md"), page, None, None)
