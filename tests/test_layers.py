"""Imports go only downward through DESIGN.md's layer table, and no modules import in a cycle.

Every module under mxcheck/ is parsed with ``ast`` (nothing is imported), and every import it
makes counts: module level, inside functions (the late imports that keep vendor packages and
heavy stacks out of ``import mxcheck``), under ``TYPE_CHECKING``, and
``importlib.import_module("mxcheck....")`` with a literal name. A layer may import its own
layer and the layers above it (earlier in ``LAYERS``), never one below.

``LAYERS`` follows DESIGN.md's table, with every module the table does not name placed in the
lowest layer its job needs (its own comment says which), and two placements the code needs
that DESIGN.md's table does not have (proposed as corrections to it): the Hadamard transforms
sit above scaling (``mx_quantize`` and ``nvfp4_quantize`` take a ``hadamard=``), and hardware
detection sits in the backends layer (every adapter's ``available()`` consults it).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.emulated

PACKAGE = Path(__file__).resolve().parents[1] / "mxcheck"

# (layer, module prefixes), top to bottom. A module belongs to the layer of its longest
# matching prefix ("mxcheck.scaling" covers mxcheck.scaling and mxcheck.scaling.mx).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("formats", (
        "mxcheck.formats", "mxcheck.packing",
        "mxcheck.reference",  # the slow Fraction/int reference of formats
        "mxcheck.layouts",  # vendor byte layouts of packed codes and scales
        "mxcheck.rng",  # seeded generators, no mxcheck imports
        "mxcheck.text",  # plain-text tables, no mxcheck imports
        "mxcheck.nan_blocks",  # the codes of a NaN-scaled block, for every MX quantizer
    )),
    ("transforms", ("mxcheck.hadamard",)),
    ("scaling", ("mxcheck.scaling",)),
    ("recipes", (
        "mxcheck.recipes", "mxcheck.profiles",
        "mxcheck.profile_mx",  # the MX profile kind (its quirks); mxcheck.profiles is the registry
        "mxcheck.profile_base", "mxcheck.profile_kinds",  # the shared profile fields; NVFP4 and FP8 profiles
        "mxcheck.recipe_files",  # recipes read from YAML/TOML, and the claim resolver
    )),
    ("oracle ops", (
        "mxcheck.gemm", "mxcheck.functions",
        "mxcheck.trace_ops",  # the custom ops the reference Function announces itself through
    )),
    ("metrics", (
        "mxcheck.metrics", "mxcheck.assertions",
        "mxcheck.outcome", "mxcheck.nested", "mxcheck.determinism", "mxcheck.graph_breaks",
        "mxcheck.stats", "mxcheck.stats_probe", "mxcheck.thresholds",
        "mxcheck.divergence",  # bit differences between two profiles' quantizers
        "mxcheck",  # the package: the public oracle API, down to metrics' snr_db
    )),
    ("backends", (
        "mxcheck.backends",
        "mxcheck.hardware",  # what each backend's available() consults
        "mxcheck.conformance",  # the suite a backend is held to
    )),
    ("models", (
        "mxcheck.flux",
        "mxcheck.manifest",  # traces a model's linears
    )),
    ("training", ("mxcheck.training", "mxcheck.sharded_training")),
    ("harness", (
        "mxcheck.plugin", "mxcheck.deps", "mxcheck.report", "mxcheck.cli", "mxcheck.__main__",
        "mxcheck.sweep", "mxcheck.deploy", "mxcheck.distributed", "mxcheck.distributed_check",
        "mxcheck.false_failure",  # the suite's randomized checks and their false-failure odds
        "mxcheck.conformance.suite",  # the installed test modules: pytest tests using the plugin
        "mxcheck.run_guard",  # per-test timeouts, crashed workers and stop signals, for the report
    )),
)
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the mxcheck module it imports
    line: int
    text: str  # the import as written


def all_modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file of every module under package (a package is its __init__.py)."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def layer_of(module: str) -> str | None:
    best = None
    for layer, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                    best is None or len(prefix) > len(best[1])):
                best = (layer, prefix)
    return None if best is None else best[0]


def _resolve(base: str, name: str, modules: dict[str, Path]) -> str:
    """``from base import name``: the submodule base.name where it is one, else base."""
    return f"{base}.{name}" if f"{base}.{name}" in modules else base


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [_resolve(base, a.name, modules) for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            targets = [node.args[0].value]
        text = lines[node.lineno - 1].strip() if targets else ""
        found += [Import(module, t, node.lineno, text) for t in targets
                  if t == "mxcheck" or t.startswith("mxcheck.")]
    return found


def all_imports() -> list[Import]:
    modules = all_modules()
    return [imp for m, p in modules.items() for imp in imports_of(m, p, modules)]


def upward_imports(imports: list[Import]) -> list[str]:
    """One line per import of a lower layer: module, line, the import, and both layers."""
    bad = []
    for imp in imports:
        have, want = layer_of(imp.module), layer_of(imp.target)
        if have is not None and want is not None and RANK[want] > RANK[have]:
            bad.append(f"{imp.module} (layer {have}) line {imp.line}: {imp.text!r} imports "
                       f"{imp.target} (layer {want}, below it)")
    return bad


def cycles(imports: list[Import]) -> list[list[str]]:
    """Each import cycle once, as the modules around it (first module repeated at the end).

    A package's submodule importing the package itself counts: ``deploy/__init__`` importing
    ``deploy.lint`` while ``deploy.lint`` imports ``mxcheck.deploy`` is a cycle (it works only
    because of the order the names are bound in)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.target != imp.module:
            graph.setdefault(imp.module, set()).add(imp.target)
    found, seen_sets, done = [], set(), set()

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            loop = [*stack[stack.index(node):], node]
            key = frozenset(loop)
            if key not in seen_sets:
                seen_sets.add(key)
                found.append(loop)
            return
        if node in done:
            return
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, stack)
        stack.pop()
        done.add(node)

    for start in sorted(graph):
        visit(start, [])
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in all_modules() if layer_of(m) is None)
    assert not unplaced, f"modules in no layer of LAYERS (tests/test_layers.py): {unplaced}"


def test_imports_go_only_downward_through_the_layers() -> None:
    bad = upward_imports(all_imports())
    assert not bad, "imports of a lower layer:\n" + "\n".join(bad)


def test_no_modules_import_each_other_in_a_cycle() -> None:
    found = cycles(all_imports())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_parser_sees_late_and_relative_imports_and_names_the_layers(tmp_path: Path) -> None:
    """The checker itself, on a made-up package: a function-level import of a lower layer
    and an ``import_module`` string are caught, and a two-module cycle is found."""
    pkg = tmp_path / "mxcheck"
    (pkg / "report").mkdir(parents=True)
    (pkg / "formats.py").write_text("def f():\n    from mxcheck.report import schema\n")
    (pkg / "report" / "__init__.py").write_text("from . import schema\n")
    (pkg / "report" / "schema.py").write_text(
        "import importlib\nM = importlib.import_module('mxcheck.report')\n")
    modules = all_modules(pkg)
    imports = [i for m, p in modules.items() for i in imports_of(m, p, modules)]
    assert upward_imports(imports) == [
        "mxcheck.formats (layer formats) line 2: 'from mxcheck.report import schema' imports "
        "mxcheck.report.schema (layer harness, below it)"]
    assert [set(c) for c in cycles(imports)] == [{"mxcheck.report", "mxcheck.report.schema"}]
