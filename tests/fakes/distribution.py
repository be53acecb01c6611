"""An installed distribution that only ``importlib.metadata`` sees: how a fake vendor
package reports its release to ``mxcheck.backends.version_problem``."""

from __future__ import annotations

import importlib.metadata as md
import pathlib
import sys
from typing import Any

import pytest


class Dist(md.Distribution):
    def __init__(self, name: str, version: str) -> None:
        self._meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"

    def read_text(self, filename: str) -> str | None:
        return self._meta if filename == "METADATA" else None

    def locate_file(self, path: Any) -> pathlib.Path:
        return pathlib.Path(str(path))


class DistFinder:
    """A meta-path finder that finds no module, only the distribution ``name``."""

    def __init__(self, name: str, version: str) -> None:
        self.name, self.version = name, version

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        return None

    def find_distributions(self, context: Any = None) -> Any:
        name = getattr(context, "name", None)
        if name is None or name.replace("-", "_").lower() == self.name.replace("-", "_").lower():
            return iter([Dist(self.name, self.version)])
        return iter(())


def installed(mp: pytest.MonkeyPatch, name: str, version: str) -> None:
    """Make importlib.metadata find ``name`` at ``version`` first (undone with ``mp``)."""
    mp.setattr(sys, "meta_path", [DistFinder(name, version), *sys.meta_path])
