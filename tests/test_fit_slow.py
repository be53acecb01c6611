"""The fit recovers every registered profile from the profile's own quantizer (the slow job:
``pytest -m slow``; tests/test_fit.py runs a fast subset in the CPU suite)."""

from __future__ import annotations

import pytest

from mxcheck.profiles import ALL_PROFILES
from tests._helpers import run_cli
from tests.test_fit import FAST, _recovers

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", sorted(set(ALL_PROFILES) - set(FAST)))
def test_fit_recovers_every_registered_profile(name):
    _recovers(ALL_PROFILES[name])


def test_the_fit_cli_on_a_values_backend_prints_the_even_rule_with_residual_0(capsys):
    """Issue 41: mxcheck fit on a fake_quantize-only backend (it crashed on 'quantize')."""
    code, out, err = run_cli(capsys, "fit", "--backend", "tests.test_fit:EvenRuleValues", "--recipe", "mxfp8")
    assert code == 0, out + err
    assert "mxfp8 x_row+w_row = profile(scale_mbits=1, scale_rule='even') + residual 0 blocks" in out, out
