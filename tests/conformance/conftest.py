"""Fake vendor packages for the conformance suite on faked hardware.

With ``MXCHECK_FAKE_HARDWARE=gfx950`` and ``--mxcheck-backend aiter`` the real AITER cannot
run (there is no MI355X), so the suite runs over :mod:`tests.fakes.fake_aiter`, which is as
strict as the released package (v0.1.20.post1: no MXFP6, bf16 output only, 256-wide K
tiles reading uninitialised scale padding). It is installed before collection, because
the plugin asks each backend ``available()`` while it collects.
"""

from __future__ import annotations

import pytest

from mxcheck import hardware
from tests.fakes import fake_aiter

_UNDO = pytest.StashKey[pytest.MonkeyPatch]()


def pytest_configure(config: pytest.Config) -> None:
    hw = hardware.detect()
    if not (hw.faked and hw.arch == "gfx950" and "aiter" in (config.getoption("mxcheck_backend") or [])):
        return
    mp = config.stash[_UNDO] = pytest.MonkeyPatch()
    fake_aiter.install(mp)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _UNDO in config.stash:
        config.stash[_UNDO].undo()
