"""MkDocs hook: the tables the code owns are rendered from it at build time, never copied.

A page asks for one with a line ``<!-- generated: NAME -->``; NAME is a key of ``TABLES``.
An unknown name fails the build, so a renamed table cannot leave a page silently empty.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from mxcheck import false_failure as ff
from mxcheck.conformance.inputs import families_table
from mxcheck.diagnose import CATALOGUE, NOT_BLOCK_BEHAVIOURS
from mxcheck.divergence import DIVERGENCE_TABLE
from mxcheck.profiles import ALL_PROFILES
from mxcheck.recipes import DERIVED_RECIPES, OCP_MX_RECIPES, RECIPES

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


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
    rows = [(f"`{b.key}`", b.level, b.title, ", ".join(map(str, b.cases)) or "-", b.seen_in or "-")
            for b in CATALOGUE.values()]
    table = _md_table(("key", "level", "what the kernel does", "divergence cases", "seen in"), rows)
    why = "".join(f"- case {c}: {reason}\n" for c, reason in sorted(NOT_BLOCK_BEHAVIOURS.items()))
    return table + "\nDivergence cases no behaviour executes, and why:\n\n" + why


TABLES = {"catalogue": catalogue, "recipes": recipes, "ocp-recipes": ocp_recipes, "derived-recipes": derived_recipes,
          "profiles": profiles, "divergence": divergence, "layers": layers, "false-failure": false_failure,
          "families": families_table}


def on_page_markdown(markdown: str, page, config, files) -> str:
    def render(m: re.Match) -> str:
        if m.group(1) not in TABLES:
            raise KeyError(f"{page.file.src_path}: no generated table {m.group(1)!r}; known: {sorted(TABLES)}")
        return TABLES[m.group(1)]()
    return MARK.sub(render, markdown)
