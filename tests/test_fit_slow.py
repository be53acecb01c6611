"""The fit recovers every registered profile from the profile's own quantizer (the slow job:
``pytest -m slow``; tests/test_fit.py runs a fast subset in the CPU suite)."""

from __future__ import annotations

import pytest

from mxcheck.profiles import ALL_PROFILES
from tests.test_fit import FAST, _recovers

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", sorted(set(ALL_PROFILES) - set(FAST)))
def test_fit_recovers_every_registered_profile(name):
    _recovers(ALL_PROFILES[name])
