"""The written contract (mxcheck.backends.contract) names everything the suite asks of a backend."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import mxcheck.conformance
from mxcheck.backends import contract

pytestmark = pytest.mark.emulated

SUITE = Path(mxcheck.conformance.__file__).parent


def _used_attributes() -> dict[str, str]:
    """attribute -> a place the conformance code reads it from an object named ``backend``:
    ``backend.x`` and ``getattr(backend, "x", ...)`` / ``hasattr(backend, "x")``."""
    used = {}
    for path in sorted(SUITE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "backend":
                used.setdefault(node.attr, f"{path.name}:{node.lineno}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == "backend"
                    and isinstance(node.args[1], ast.Constant)):
                used.setdefault(node.args[1].value, f"{path.name}:{node.lineno}")
    return used


def _documented() -> set[str]:
    methods = {name for name, _ in inspect.getmembers(contract.FullBackend) if not name.startswith("_")}
    optional = {line.strip().strip("`") for line in (contract.Backend.__doc__ or "").splitlines()
                if line.strip().startswith("``") and line.strip().endswith("``")}
    return methods | optional | {"name"}


def test_every_backend_attribute_the_suite_reads_is_in_the_contract():
    used = _used_attributes()
    assert {"quantize", "gemm", "supports", "input_dtypes"} <= set(used)  # the scan sees the suite's reads
    missing = {a: where for a, where in used.items() if a not in _documented()}
    assert not missing, f"document these in mxcheck/backends/contract.py (Backend or its Protocols): {missing}"
