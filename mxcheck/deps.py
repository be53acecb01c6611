"""Declared test dependencies (the ``[test]`` extra): ``needs`` around their imports skips a
test whose package is missing, naming it, or fails it under ``--mxcheck-require-deps`` (CI),
which the plugin hands over through ``MXCHECK_REQUIRE_DEPS``."""

from __future__ import annotations

import os
from typing import Any

import pytest

__all__ = ["REQUIRE_DEPS_ENV", "export_require_deps", "needs"]

REQUIRE_DEPS_ENV = "MXCHECK_REQUIRE_DEPS"  # "1": a missing declared test dependency fails


def export_require_deps(config: pytest.Config) -> None:
    """Hand --mxcheck-require-deps to ``needs`` (which test modules call at import, with no
    config at hand) through the environment, restored when this config ends."""
    if config.getoption("mxcheck_require_deps"):
        env = pytest.MonkeyPatch()
        env.setenv(REQUIRE_DEPS_ENV, "1")
        config.add_cleanup(env.undo)


class needs:  # lower case: a context manager read as a phrase, like contextlib.suppress
    """Wrap the imports of declared test dependencies (the ``[test]`` extra). One of
    ``packages`` missing skips the test, or the whole module at module level, with a reason
    naming it; under ``--mxcheck-require-deps`` (CI) it fails instead, so CI cannot go green
    without it. Any other missing module is an error as usual::

        with needs("gfloat", "ml_dtypes"):
            import gfloat
            from ml_dtypes import float8_e4m3fn
    """

    def __init__(self, *packages: str) -> None:
        if not packages or not all(isinstance(p, str) and p and "." not in p for p in packages):
            raise ValueError(f"needs{packages!r}: expected one or more top-level package names, "
                             "such as needs('gfloat', 'ml_dtypes')")
        self.packages = packages

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: Any) -> bool:
        __tracebackhide__ = True  # the skip or failure points at the import, not here
        if not isinstance(error, ModuleNotFoundError):
            return False
        top = (error.name or "").partition(".")[0]
        if top not in self.packages:
            return False
        reason = f"missing package {top} ({error}); pip install -e '.[test]'"
        if os.environ.get(REQUIRE_DEPS_ENV) == "1":
            raise pytest.fail.Exception(
                f"{reason}. --mxcheck-require-deps ({REQUIRE_DEPS_ENV}=1): a declared test "
                "dependency must be installed", pytrace=False) from None
        raise pytest.skip.Exception(reason, allow_module_level=True) from None
