"""The tables the code owns, rendered from it and committed into the Markdown, never copied.

A page holds each one between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->``
(NAME a key of ``TABLES``), so a reader of the Markdown sees the table too. The MkDocs hook
renders every block afresh at build time; ``tests/test_docs_tables.py`` fails when a
committed one differs from what the code renders, and

    python docs/hooks.py           # rewrite every stale block under docs/ (and fill bare markers)
    python docs/hooks.py --check   # exit 1 naming the stale ones

An unknown name, or a marker without its table, fails the build, so a renamed table cannot
leave a page silently empty.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":  # run as a script: this checkout's mxcheck, not an installed one
    sys.path.insert(0, str(ROOT))

from mxcheck import false_failure as ff  # noqa: E402
from mxcheck.conformance.inputs import families_table  # noqa: E402
from mxcheck.diagnose import CATALOGUE, NOT_BLOCK_BEHAVIOURS  # noqa: E402
from mxcheck.diagnose.catalogue import ZERO_BLOCK_BYTES  # noqa: E402
from mxcheck.diagnose.relations import KINDS as RELATION_KINDS  # noqa: E402
from mxcheck.divergence import DIVERGENCE_TABLE  # noqa: E402
from mxcheck.profiles import ALL_PROFILES  # noqa: E402
from mxcheck.recipes import DERIVED_RECIPES, OCP_MX_RECIPES, PLAIN_RECIPES, RECIPES  # noqa: E402

MARK = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
# A marker, its table, and the end marker naming the same table.
BLOCK = re.compile(r"^<!-- generated: ([a-z-]+) -->\n(.*?)^<!-- end generated: \1 -->$", re.MULTILINE | re.DOTALL)


def _md_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    def cell(v: str) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _spec(s) -> str:
    block = f"{s.block_size}x{s.block_size}" if s.block_2d else f"1x{s.block_size}"
    parts = [s.fmt, s.scaling]
    if s.scaling in ("mx", "nvfp4"):
        parts += [block, s.scale_rule]
    parts.append(s.rounding)
    if s.hadamard:
        parts.append(s.hadamard)
    return " ".join(str(p) for p in parts)


def _recipes(recipes: dict) -> str:
    copies = ("x_row", "w_row", "g_row", "w_col", "g_col", "x_col")
    rows = [(f"`{name}`", *(_spec(getattr(r, c)) for c in copies), r.source) for name, r in recipes.items()]
    return _md_table(("recipe", *copies, "source"), rows)


def recipes() -> str:
    return _recipes(RECIPES)


def plain_recipes() -> str:
    return _recipes(PLAIN_RECIPES)


def ocp_recipes() -> str:
    return _recipes(OCP_MX_RECIPES)


def derived_recipes() -> str:
    return _recipes(DERIVED_RECIPES)


def profiles() -> str:
    rows = [(f"`{name}`", type(p).__name__, p.fmt or "(any)", p.source, "; ".join(p.notes))
            for name, p in ALL_PROFILES.items()]
    return _md_table(("profile", "kind", "format", "source", "notes"), rows)


def divergence() -> str:
    rows = [(str(c.case), c.title, c.libraries, c.reached, "; ".join(c.versions)) for c in DIVERGENCE_TABLE]
    return _md_table(("case", "what differs", "libraries", "reached by / pinned", "versions"), rows)


def _layers_module():
    # tests/test_layers.py enforces LAYERS on every import; the page shows that very tuple.
    spec = importlib.util.spec_from_file_location("_mxcheck_docs_test_layers", ROOT / "tests" / "test_layers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def layers() -> str:
    rows = [(name, ", ".join(f"`{m}`" for m in modules)) for name, modules in _layers_module().LAYERS]
    return _md_table(("layer (imports only itself and the layers above)", "modules"), rows)


def _odds(p: float) -> str:
    return "< 1e-300" if p < 1e-300 else f"{p:.1e}"


def false_failure() -> str:
    rows = [(c.what, f"`{c.where}`", f"{_odds(c.per_run)} ({c.calls} calls){' slow' if c.slow else ''}",
             c.derivation) for c in ff.REGISTRY]
    fast = sum(c.per_run for c in ff.REGISTRY if not c.slow)
    slow = fast + sum(c.per_run for c in ff.REGISTRY if c.slow)
    return (_md_table(("check", "where", "P(false failure) per run", "derivation"), rows)
            + f"\nUnion per run: {_odds(fast)} for `-m \"emulated and not slow\"`, {_odds(slow)} with the "
            f"slow tests (budget {ff.RUN_BUDGET:g}, `RUN_BUDGET`; least margin `MIN_Z` = {ff.MIN_Z} sd).\n")


def catalogue() -> str:
    zero_bytes = {c.key for c in ZERO_BLOCK_BYTES}
    rows = [(f"`{b.key}`", b.level, b.title, ", ".join(map(str, b.cases)) or "-", b.seen_in or "-")
            for b in CATALOGUE.values() if b.key not in zero_bytes]
    first = ZERO_BLOCK_BYTES[0]
    rows.append((f"`mx.zero_scale=B` (B in 1..254, not 127: {len(ZERO_BLOCK_BYTES)} keys)", "quantize",
                 "an all-zero block stores byte B (2^(B-127))", "-", first.seen_in))
    table = _md_table(("key", "level", "what the kernel does", "divergence cases", "seen in"), rows)
    why = "".join(f"- case {c}: {reason}\n" for c, reason in sorted(NOT_BLOCK_BEHAVIOURS.items()))
    return table + "\nDivergence cases no behaviour executes, and why:\n\n" + why


def relation_kinds() -> str:
    rows = [(f"`{kind}`", meaning) for kind, meaning in RELATION_KINDS.items()]
    return _md_table(("kind", "the kernel's entry is"), rows)


ACCURACY_RECORD = ROOT / "references" / "accuracy" / "cause_accuracy.json"


def cause_accuracy() -> str:
    """The committed run of ``mxcheck accuracy`` (the labelled set is the code's: a case the
    record lacks shows as not run)."""
    import json  # noqa: PLC0415

    from mxcheck.conformance import accuracy  # noqa: PLC0415

    data = json.loads(ACCURACY_RECORD.read_text())
    outcomes = accuracy.outcomes_of(data)
    mode = "each quantize case on the input families that show its bug" if data["quick"] else "every input family"
    return (_md_table(*_split(accuracy.scores_table(outcomes))) + f"\n{len(outcomes)} cases, {mode}, "
            f"{data['cpu_seconds']} s of CPU time in all (`{ACCURACY_RECORD.relative_to(ROOT)}`).\n\n"
            + _md_table(*_split(accuracy.cases_table(outcomes))))


def _split(rows: list[tuple[str, ...]]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    return rows[0], rows[1:]


TABLES = {"catalogue": catalogue, "relation-kinds": relation_kinds, "cause-accuracy": cause_accuracy, "recipes": recipes, "plain-recipes": plain_recipes, "ocp-recipes": ocp_recipes,
          "derived-recipes": derived_recipes,
          "profiles": profiles, "divergence": divergence, "layers": layers, "false-failure": false_failure,
          "families": families_table}


def _table(name: str, where: str) -> str:
    if name not in TABLES:
        raise KeyError(f"{where}: no generated table {name!r}; known: {sorted(TABLES)}")
    return TABLES[name]()


def _block(name: str, body: str) -> str:
    # blank lines around the table: GitHub and MkDocs both read it as a table, not HTML
    return f"<!-- generated: {name} -->\n\n{body}\n<!-- end generated: {name} -->"


def render(markdown: str, where: str) -> str:
    """The page with every generated block holding what the code renders now; a bare marker
    (no end marker) gets its block."""
    out = BLOCK.sub(lambda m: _block(m.group(1), _table(m.group(1), where)), markdown)
    spans = [m.span() for m in BLOCK.finditer(out)]
    bare = [m for m in MARK.finditer(out) if not any(a <= m.start() < b for a, b in spans)]
    for m in reversed(bare):
        out = out[: m.start()] + _block(m.group(1), _table(m.group(1), where)) + out[m.end():]
    return out


def stale_pages(docs: Path = ROOT / "docs") -> list[Path]:
    """Markdown files under ``docs`` (and the README) whose generated blocks are not what the
    code renders now, or that hold a marker without its table."""
    pages = [*sorted(docs.rglob("*.md")), ROOT / "README.md"]
    return [p for p in pages if p.is_file() and render(p.read_text(), str(p)) != p.read_text()]


def on_page_markdown(markdown: str, page, config, files) -> str:
    where = page.file.src_path
    spans = [m.span() for m in BLOCK.finditer(markdown)]
    bare = [m.group(1) for m in MARK.finditer(markdown) if not any(a <= m.start() < b for a, b in spans)]
    if bare:
        raise KeyError(f"{where}: <!-- generated: {bare[0]} --> has no table under it; run python docs/hooks.py")
    return BLOCK.sub(lambda m: _table(m.group(1), where), markdown)  # the site shows what the code renders now


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    stale = stale_pages()
    for path in stale:
        if check:
            print(f"{path.relative_to(ROOT)}: generated tables are stale; run python docs/hooks.py")
        else:
            path.write_text(render(path.read_text(), str(path)))
            print(f"{path.relative_to(ROOT)}: generated tables rewritten")
    return 1 if check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
